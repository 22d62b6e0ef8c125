// The speed-of-light kernel's job (speed_of_light.cc): the tables, features and settings it reads from JOB_DIR,
// on huge pages, and the one way it fails (a message on stderr, exit code 2).
//
// speed_of_light JOB_DIR:
//   JOB_DIR/job.txt   one "key value..." per line (written by benchmarks/peers/speed_of_light.py):
//                       threads N | blocks N | warmup N | block_ms X | steps N (0: size blocks to block_ms)
//                       lr X | beta1 X | beta2 X | epsilon X | adagrad_init X (the suite's hyper-parameters)
//                       combiner sum|mean | storage fp32|bf16 | optimizers NAME... | check_steps N
//                       table ROWS DIM                 (one line per table, in order)
//                       feature TABLE BATCH SEQ_LEN    (one per feature; ids in ids<i>.bin (int64); bags and
//                                                        sequences also splits<i>.bin (int64, BATCH+1);
//                                                        upstream<i>.bin float32 [BATCH * max(SEQ_LEN,1) * DIM])
//                       keys hashed|compact            (optional: the ids come as 64-bit keys, below)
//   JOB_DIR/keys<t>.bin  int64 [ROWS]: row r's key in table t, all distinct (read by a keyed engine only: `keys
//                        hashed|compact` here, or `keys=hashed|compact` in a worker's prepare). A keyed engine's
//                        features carry their ids' keys, and each step first finds every key's row through a hash
//                        index, as a dynamic table's step must: `hashed` with the key beside its row number in
//                        the index, `compact` with a dynamic table's layout (Table below).
#ifndef TF_EMBED_OPS_BENCHMARKS_SPEED_OF_LIGHT_JOB_H_
#define TF_EMBED_OPS_BENCHMARKS_SPEED_OF_LIGHT_JOB_H_

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace speed_of_light {

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "speed_of_light: %s\n", what.c_str());
  std::exit(2);
}

// Tables and slots on 2 MiB pages where the kernel grants them: a random row costs a cache miss, not a cache
// miss plus a page walk (our op library advises huge pages for its tables too).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    void* p = nullptr;
    if (posix_memalign(&p, size_t{1} << 21, bytes) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const HugePageAllocator&) const { return true; }
  bool operator!=(const HugePageAllocator&) const { return false; }
};
template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

struct Table {
  int64_t rows = 0, dim = 0;
  HugeVector<float> w32;               // fp32 storage
  HugeVector<uint16_t> w16;            // bf16 storage
  std::vector<HugeVector<float>> s32;  // slots
  std::vector<HugeVector<uint16_t>> s16;
  HugeVector<int32_t> slot_of;  // id -> distinct index in this step, -1 when absent
  std::vector<int64_t> uniq;    // distinct index -> id
  std::vector<float> grad;      // [distinct, dim]
  // Keyed engines only: open addressing, linear probing, load <= 1/2; key and row side by side so a probe is
  // one cache line (row -1: empty).
  struct Bucket {
    int64_t key = 0;
    int64_t row = -1;
  };
  HugeVector<Bucket> index;
  uint64_t index_mask = 0;
  // Keyed engines with a compact index: a dynamic table's layout within its memory budget (32 bytes a row past
  // the floats): 4-byte buckets (row + 1; 0 empty) at load <= 3/4, and a 20-byte record a row holding its key, the
  // count of its lookups and its last step (what eviction reads). A probe compares the key in the row's record
  // (a second, dependent access), then updates its count and last step.
  struct __attribute__((packed)) RowRecord {
    int64_t key = 0;
    uint32_t count = 0;
    int64_t last_step = -1;
  };
  HugeVector<uint32_t> compact_index;
  HugeVector<RowRecord> records;
};

struct Feature {
  int table = 0;
  int64_t batch = 0, seq_len = 0;
  std::vector<int64_t> ids, splits;  // splits empty: one id per sample
  std::vector<int64_t> keys;         // keyed engines: ids[i]'s key; each step resolves them into ids
  std::vector<float> upstream, act;
};

struct Job {
  int threads = 1, blocks = 7, warmup = 3, steps = 0, check_steps = 0;
  double block_ms = 150.0;
  float lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f, adagrad_init = 0.1f;
  bool mean = false, bf16 = false, keyed = false, compact_index = false;
  std::vector<std::string> optimizers;
  std::vector<Table> tables;
  std::vector<Feature> features;
};

template <typename T>
inline std::vector<T> ReadArray(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot open " + path);
  std::vector<T> out(count);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * sizeof(T)));
  if (static_cast<size_t>(in.gcount()) != count * sizeof(T)) Fail(path + ": short file");
  return out;
}

// Empty when the file does not exist.
template <typename T>
inline std::vector<T> ReadArrayIfPresent(const std::string& path, size_t count) {
  return std::ifstream(path, std::ios::binary) ? ReadArray<T>(path, count) : std::vector<T>();
}

inline Job ReadJob(const std::string& dir) {
  Job job;
  std::ifstream in(dir + "/job.txt");
  if (!in) Fail("cannot open " + dir + "/job.txt");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key)) continue;
    // The scalar settings, by key; the others below.
    const std::pair<const char*, int*> ints[] = {{"threads", &job.threads},
                                                 {"blocks", &job.blocks},
                                                 {"warmup", &job.warmup},
                                                 {"steps", &job.steps},
                                                 {"check_steps", &job.check_steps}};
    const std::pair<const char*, float*> floats[] = {{"lr", &job.lr},
                                                     {"beta1", &job.beta1},
                                                     {"beta2", &job.beta2},
                                                     {"epsilon", &job.epsilon},
                                                     {"adagrad_init", &job.adagrad_init}};
    auto read_setting = [&](const auto& settings) {
      for (const auto& [name, value] : settings) {
        if (key == name) {
          ls >> *value;  // (an unreadable value leaves the default, as for every key)
          return true;
        }
      }
      return false;
    };
    if (read_setting(ints) || read_setting(floats)) continue;
    if (key == "block_ms")
      ls >> job.block_ms;
    else if (key == "combiner") {
      std::string c;
      ls >> c;
      job.mean = c == "mean";
    } else if (key == "storage") {
      std::string s;
      ls >> s;
      job.bf16 = s == "bf16";
    } else if (key == "keys") {
      std::string k;
      ls >> k;
      job.keyed = k == "hashed" || k == "compact";
      job.compact_index = k == "compact";
    } else if (key == "optimizers") {
      std::string o;
      while (ls >> o) job.optimizers.push_back(o);
    } else if (key == "table") {
      Table t;
      ls >> t.rows >> t.dim;
      job.tables.push_back(std::move(t));
    } else if (key == "feature") {
      Feature f;
      ls >> f.table >> f.batch >> f.seq_len;
      job.features.push_back(std::move(f));
    } else
      Fail("unknown job key " + key);
  }
  for (size_t i = 0; i < job.features.size(); ++i) {
    Feature& f = job.features[i];
    if (f.table < 0 || f.table >= static_cast<int>(job.tables.size())) Fail("feature table out of range");
    const int64_t dim = job.tables[f.table].dim;
    f.splits = ReadArrayIfPresent<int64_t>(dir + "/splits" + std::to_string(i) + ".bin", f.batch + 1);
    const int64_t n = f.splits.empty() ? f.batch : f.splits.back();
    f.ids = ReadArray<int64_t>(dir + "/ids" + std::to_string(i) + ".bin", n);
    for (int64_t id : f.ids)
      if (id < 0 || id >= job.tables[f.table].rows) Fail("id out of range in feature " + std::to_string(i));
    const int64_t out_rows = f.batch * std::max<int64_t>(f.seq_len, 1);
    f.upstream = ReadArray<float>(dir + "/upstream" + std::to_string(i) + ".bin", out_rows * dim);
    f.act.assign(out_rows * dim, 0.0f);
  }
  return job;
}

inline void CheckTables(const Job& job) {
  for (const Table& t : job.tables)
    if (t.dim <= 0 || t.dim > 1024 || t.rows <= 0) Fail("table dims must be in [1, 1024] and rows > 0");
}

}  // namespace speed_of_light

#endif  // TF_EMBED_OPS_BENCHMARKS_SPEED_OF_LIGHT_JOB_H_
