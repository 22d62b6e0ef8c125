// Memory-bandwidth probe for the benchmark suite: the machine's limit that every embedding step runs into.
//
// Built by benchmarks/bandwidth.py with `g++ -O3 -march=native -pthread` into a cache dir on first use; it is a
// standalone program, not part of the op library. Prints one JSON object:
//   stream_read_gbs     sum of a buffer much larger than the last-level cache
//   stream_write_gbs    fill of that buffer
//   stream_copy_gbs     a[i] = b[i] + c * a[i] (read 2, write 1: the shape of a dense optimizer pass)
//   rows: [{dim, random_rmw_gbs, sorted_rmw_gbs}]   row[id] += g for random distinct ids, rows of `dim` floats,
//                       in random order and in ascending order; bytes counted = ids * dim * 4 * 3 (row read,
//                       row write, gradient read).  random_rmw_4k_gbs / random_rmw_huge_gbs: the random figure
//                       on a buffer of 4 KiB pages and on one advised to use 2 MiB pages before its first touch
//                       (as the op library advises its tables: cc/lib/huge_pages.h); random_rmw_gbs is the
//                       larger, since the bound is what the hardware can do.  "huge_pages" says whether the
//                       advice was accepted.
// Each figure is the best of `reps` repetitions (the bound is what the hardware can do, so best, not median).
//
// Usage: bandwidth_probe [--mb 1024] [--threads 1] [--reps 3] [--dims 8,16,32,64,128,256] [--rows_touched 65536]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Runs fn(begin, end) over [0, n) split into `threads` contiguous parts; returns wall seconds.
template <typename Fn>
double ParallelTime(int threads, size_t n, Fn fn) {
  auto t0 = Clock::now();
  if (threads <= 1) {
    fn(size_t{0}, n);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      size_t b = n * t / threads, e = n * (t + 1) / threads;
      pool.emplace_back([=] { fn(b, e); });
    }
    for (auto& th : pool) th.join();
  }
  return Seconds(t0, Clock::now());
}

// Keeps the compiler from deleting a computed value.
volatile float g_sink;

struct Options {
  size_t mb = 1024;
  int threads = 1;
  int reps = 3;
  std::vector<int> dims = {8, 16, 32, 64, 128, 256};
  size_t rows_touched = 65536;
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mb") {
      o.mb = std::strtoull(v.c_str(), nullptr, 10);
    } else if (k == "--threads") {
      o.threads = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--reps") {
      o.reps = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--rows_touched") {
      o.rows_touched = std::strtoull(v.c_str(), nullptr, 10);
    } else if (k == "--dims") {
      o.dims.clear();
      size_t pos = 0;
      while (pos < v.size()) {
        size_t comma = v.find(',', pos);
        if (comma == std::string::npos) comma = v.size();
        o.dims.push_back(std::atoi(v.substr(pos, comma - pos).c_str()));
        pos = comma + 1;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

// An uninitialised buffer of n floats, 2 MiB-aligned; with `huge`, advised to use 2 MiB pages before anything
// touches it (sets *advised when the OS accepted).  Never freed: the process ends.
float* Buffer(size_t n, bool huge, bool* advised) {
  constexpr size_t kPage = size_t{2} << 20;
  const size_t bytes = (n * sizeof(float) + kPage - 1) / kPage * kPage;
  float* p = static_cast<float*>(std::aligned_alloc(kPage, bytes));
  if (p == nullptr) {
    std::fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) *advised = madvise(p, bytes, MADV_HUGEPAGE) == 0;
#endif
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  const size_t n = o.mb * (1u << 20) / sizeof(float);
  // `a` keeps the allocator's default pages; `b` is advised to use huge pages.  The streaming figures do not depend
  // on the page size; the random-row one does, and is measured on both.
  bool huge = false;
  float* a = Buffer(n, false, &huge);
  float* b = Buffer(n, true, &huge);
  // First touch in parallel, so pages are spread the way the timed loops use them.
  ParallelTime(o.threads, n, [&](size_t s, size_t e) {
    for (size_t i = s; i < e; ++i) a[i] = 1.0f, b[i] = 2.0f;
  });
  const double bytes = static_cast<double>(n) * sizeof(float);

  double best_read = 1e30, best_write = 1e30, best_copy = 1e30;
  for (int r = 0; r < o.reps; ++r) {
    std::vector<float> partial(o.threads, 0.f);
    best_read = std::min(best_read, ParallelTime(o.threads, n, [&](size_t s, size_t e) {
                           float acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
                           size_t i = s;
                           for (; i + 4 <= e; i += 4)
                             acc0 += a[i], acc1 += a[i + 1], acc2 += a[i + 2], acc3 += a[i + 3];
                           for (; i < e; ++i) acc0 += a[i];
                           g_sink = acc0 + acc1 + acc2 + acc3;
                         }));
    best_write = std::min(best_write, ParallelTime(o.threads, n, [&](size_t s, size_t e) {
                            const float v = static_cast<float>(r);
                            for (size_t i = s; i < e; ++i) b[i] = v;
                          }));
    best_copy = std::min(best_copy, ParallelTime(o.threads, n, [&](size_t s, size_t e) {
                           for (size_t i = s; i < e; ++i) a[i] = b[i] + 0.5f * a[i];
                         }));
  }

  std::printf(
      "{\"threads\": %d, \"buffer_mb\": %zu, \"stream_read_gbs\": %.3f, \"stream_write_gbs\": %.3f, "
      "\"stream_copy_gbs\": %.3f, \"huge_pages\": %s, \"rows\": [",
      o.threads, o.mb, bytes / best_read / 1e9, bytes / best_write / 1e9, 3 * bytes / best_copy / 1e9,
      huge ? "true" : "false");

  std::mt19937_64 rng(42);
  for (size_t di = 0; di < o.dims.size(); ++di) {
    const size_t dim = static_cast<size_t>(o.dims[di]);
    const size_t rows = n / dim;
    const size_t touched = std::min(o.rows_touched, rows / (2 * static_cast<size_t>(o.reps) + 2));
    std::vector<float> grad(touched * dim, 1e-3f);
    // Each repetition touches a fresh set of distinct rows (as after de-duplication), so rows touched by an earlier
    // repetition are not still in the (large, shared) last-level cache. Distinct: i -> i * kPrime mod rows is a
    // bijection when kPrime does not divide rows; the shuffle then removes the constant stride a prefetcher would see.
    constexpr uint64_t kPrime = 2654435761u;
    auto draw = [&](int rep, bool sorted) {
      std::vector<int64_t> ids(touched);
      for (size_t i = 0; i < touched; ++i) {
        ids[i] = static_cast<int64_t>(((i + (2 * rep + sorted) * touched) * kPrime) % rows);
      }
      if (sorted) {
        std::sort(ids.begin(), ids.end());
      } else {
        std::shuffle(ids.begin(), ids.end(), rng);
      }
      return ids;
    };
    auto rmw = [&](float* buffer, bool sorted) {
      double best = 1e30;
      for (int r = 0; r < o.reps; ++r) {
        const std::vector<int64_t> order = draw(r, sorted);
        best = std::min(best, ParallelTime(o.threads, touched, [&](size_t s, size_t e) {
                          for (size_t i = s; i < e; ++i) {
                            float* row = buffer + order[i] * dim;
                            const float* g = grad.data() + i * dim;
                            for (size_t j = 0; j < dim; ++j) row[j] -= 0.01f * g[j];
                          }
                        }));
      }
      // The gradient rows are read too: count them so the figure is bytes the loop really moved.
      return static_cast<double>(touched) * dim * sizeof(float) * 3 / best / 1e9;
    };
    const double random_4k_gbs = rmw(a, false);
    const double random_huge_gbs = rmw(b, false);
    const double random_gbs = std::max(random_4k_gbs, random_huge_gbs);
    const double sorted_gbs = std::max(rmw(a, true), rmw(b, true));
    std::printf(
        "%s{\"dim\": %zu, \"rows_touched\": %zu, \"random_rmw_gbs\": %.3f, \"sorted_rmw_gbs\": %.3f, "
        "\"random_rmw_4k_gbs\": %.3f, \"random_rmw_huge_gbs\": %.3f}",
        di ? ", " : "", dim, touched, random_gbs, sorted_gbs, random_4k_gbs, random_huge_gbs);
  }
  std::printf("]}\n");
  return 0;
}
