// The speed-of-light kernel: the work of one fused embedding training step, written the simplest fast way, with
// no framework around it. It calibrates what this machine can do for exactly the suite's steps, so that our
// engine (and FBGEMM) are measured against something that ran here rather than against a traffic model.
//
// One step = what benchmarks/ours.py's step does, on the same ids and upstream gradients:
//   forward:  per feature, gather the ids' rows and combine them per sample (sum or mean), or lay them out
//             [B, L, D] for a sequence feature (the activations are written to memory, as an op must);
//   backward: per table, de-duplicate the step's ids (the vocabulary is known, so a dense id -> slot array
//             instead of a hash table: one load and at most one store per id, reset after the step), accumulate
//             each occurrence's upstream gradient into its distinct row's gradient;
//   update:   per distinct row, the optimizer's row update in place (SGD, Adagrad, lazy Adam; the same formulas
//             and hyper-parameters as the suite's peers), tables and slots in fp32 or bf16; bf16 is read into
//             fp32, updated, and written back with stochastic rounding from a counter-based hash per element
//             (the same bits our kernels use, so the two are comparable and results are identical).
// Threads (OpenMP): the forward pass over samples and the update over distinct rows; de-duplication and
// accumulation stay serial (they are a small share of the step at one thread, and serial keeps them simple).
// Keyed engines (a dynamic table's step): the features hold 64-bit keys, and the step starts by finding each
// key's row through an open-addressing index (one probe per id, home buckets prefetched ahead), then does the
// above on those rows; with a compact index (speed_of_light_job.h) the probe reads the row's key from its record
// and updates its count and last step, as a dynamic table within its memory budget must. The optimizer `lookup`
// is the forward pass alone.
//
// Usage: speed_of_light JOB_DIR (the job's files: speed_of_light_job.h)
// Output: one JSON line {"results": {optimizer: {"block_ms": [...], "steps": n}}}. With check_steps > 0 it runs
// that many steps per optimizer from the tables in init<t>.bin (float32) instead of timing, and writes
// final_<optimizer>_<t>.bin (float32) for the suite's parity check.
//
// speed_of_light --serve JOB_DIR: a persistent worker (benchmarks/workers.py's protocol) on the job's ids, for
// the interleaved pairs: "prepare NAME optimizer=sgd storage=fp32 threads=1 warmup=3" builds and warms one state,
// "time NAME STEPS" runs STEPS steps and answers "seconds S", "drop NAME" frees it, "quit" ends.
//
// Built with -DSPEED_OF_LIGHT_LIBRARY -shared it is a library instead (no main): the kernel stepping in its
// caller's process (speed_of_light.py's InProcessKernel), called directly or, through speed_of_light_op.cc, run by
// TensorFlow as our fused step is; the headline's ceiling of ours over the kernel is the second over the first.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "speed_of_light_job.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace speed_of_light {
namespace {

// ----------------------------------------------------------------------------------------------- bf16 storage

inline float Bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The initial rows in bf16 storage: truncated.
inline uint16_t FloatToBf16Truncated(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

inline uint64_t Mix64(uint64_t x) {  // MurmurHash3's 64-bit finaliser
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The per-row key and per-element bits of the library's stochastic rounding (seed 0, this step, table, buffer).
inline uint64_t RowKey(int64_t step, int64_t table, int64_t buffer, int64_t row) {
  uint64_t k = Mix64(0ULL ^ 0x5851f42d4c957f2dULL);
  k = Mix64(k ^ static_cast<uint64_t>(step));
  k = Mix64(k ^ (static_cast<uint64_t>(table) * 64 + static_cast<uint64_t>(buffer)));
  return Mix64(k ^ static_cast<uint64_t>(row));
}

inline uint16_t RoundStochastic(float f, uint64_t row_key, uint32_t column) {
  uint32_t x = static_cast<uint32_t>(row_key) ^ (column * 0x9e3779b9u);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  x ^= static_cast<uint32_t>(row_key >> 32);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + (x & 0xffffu)) >> 16;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

// Rows are fetched this many ids ahead: enough to cover a DRAM miss at a few ns of work per row.
constexpr int64_t kPrefetchAhead = 8;

inline void PrefetchRow(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
}

// ----------------------------------------------------------------------------------------------- the step

// The optimizer's index in UpdateRow (sgd 0, adagrad 1, adam 2), which is also its number of slots; -1 for
// `lookup` (the forward pass only).
int OptimizerIndex(const std::string& opt) {
  if (opt == "lookup") return -1;
  if (opt == "sgd") return 0;
  if (opt == "adagrad") return 1;
  if (opt == "adam") return 2;
  Fail("optimizer " + opt + " is not in the speed-of-light kernel (sgd, adagrad, adam, lookup)");
}

float SlotInit(const Job& job, const std::string& opt) { return opt == "adagrad" ? job.adagrad_init : 0.0f; }

// Tables start from init<t>.bin when it exists (the parity check), else from a cheap pattern (values do not
// change the speed).
void ResetState(Job& job, const std::string& opt, const std::string& dir) {
  const int slots = std::max(OptimizerIndex(opt), 0);
  for (size_t t = 0; t < job.tables.size(); ++t) {
    Table& tb = job.tables[t];
    const size_t n = static_cast<size_t>(tb.rows * tb.dim);
    const std::vector<float> init = ReadArrayIfPresent<float>(dir + "/init" + std::to_string(t) + ".bin", n);
    if (job.bf16) {
      tb.w16.assign(n, 0);
      for (size_t i = 0; i < n; ++i) {
        tb.w16[i] =
            FloatToBf16Truncated(init.empty() ? 0.01f * static_cast<float>(static_cast<int>(i % 11) - 5) : init[i]);
      }
      tb.s16.assign(slots, HugeVector<uint16_t>(n, FloatToBf16Truncated(SlotInit(job, opt))));
      tb.w32.clear();
      tb.s32.clear();
    } else {
      tb.w32.resize(n);
      for (size_t i = 0; i < n; ++i)
        tb.w32[i] = init.empty() ? 0.01f * static_cast<float>(static_cast<int>(i % 11) - 5) : init[i];
      tb.s32.assign(slots, HugeVector<float>(n, SlotInit(job, opt)));
      tb.w16.clear();
      tb.s16.clear();
    }
    tb.slot_of.assign(tb.rows, -1);
    int64_t ids = 0;
    for (const Feature& f : job.features)
      if (f.table == static_cast<int>(t)) ids += static_cast<int64_t>(f.ids.size());
    tb.uniq.resize(ids);
    tb.grad.resize(ids * tb.dim);
  }
}

inline void LoadRow(const Table& tb, bool bf16, int64_t row, float* out) {
  const int64_t d = tb.dim;
  if (bf16) {
    const uint16_t* src = tb.w16.data() + row * d;
    for (int64_t i = 0; i < d; ++i) out[i] = Bf16ToFloat(src[i]);
  } else {
    std::memcpy(out, tb.w32.data() + row * d, d * sizeof(float));
  }
}

inline const void* RowAddress(const Table& tb, bool bf16, int64_t row) {
  return bf16 ? static_cast<const void*>(tb.w16.data() + row * tb.dim)
              : static_cast<const void*>(tb.w32.data() + row * tb.dim);
}
inline int64_t RowBytes(const Table& tb, bool bf16) { return tb.dim * (bf16 ? 2 : 4); }

// ----------------------------------------------------------------------------------------------- keyed engines

// Home buckets are prefetched this many ids ahead (with the wide index a probe is one cache miss: key and row
// share a bucket; with the compact one the row's record is a second, dependent one).
constexpr int64_t kProbeAhead = 16;

inline uint64_t HomeOf(int64_t key, uint64_t mask) { return Mix64(static_cast<uint64_t>(key)) & mask; }

// Row r keeps keys[r]: the index with each key beside its row number. False, with `why`, when a key repeats.
bool LoadWideIndex(Table& tb, const std::vector<int64_t>& keys, const std::string& path, std::string* why) {
  uint64_t buckets = 16;
  while (buckets < 2 * static_cast<uint64_t>(tb.rows)) buckets *= 2;
  tb.index.assign(buckets, Table::Bucket{});
  tb.index_mask = buckets - 1;
  for (int64_t r = 0; r < tb.rows; ++r) {
    uint64_t b = HomeOf(keys[r], tb.index_mask);
    for (; tb.index[b].row >= 0; b = (b + 1) & tb.index_mask) {
      if (tb.index[b].key == keys[r]) {
        *why = path + ": key " + std::to_string(keys[r]) + " repeats";
        return false;
      }
    }
    tb.index[b] = {keys[r], r};
  }
  return true;
}

// The same with a compact index: row numbers in the buckets, keys in the rows' records.
bool LoadCompactIndex(Table& tb, const std::vector<int64_t>& keys, const std::string& path, std::string* why) {
  uint64_t buckets = 16;
  while (4 * static_cast<uint64_t>(tb.rows) > 3 * buckets) buckets *= 2;
  tb.compact_index.assign(buckets, 0);
  tb.records.assign(tb.rows, Table::RowRecord{});
  const uint64_t mask = buckets - 1;
  for (int64_t r = 0; r < tb.rows; ++r) {
    uint64_t b = HomeOf(keys[r], mask);
    for (; tb.compact_index[b] != 0; b = (b + 1) & mask) {
      if (tb.records[tb.compact_index[b] - 1].key == keys[r]) {
        *why = path + ": key " + std::to_string(keys[r]) + " repeats";
        return false;
      }
    }
    tb.compact_index[b] = static_cast<uint32_t>(r + 1);
    tb.records[r].key = keys[r];
  }
  return true;
}

// Builds every table's index from keys<t>.bin and gives each feature its ids' keys (untimed: a dynamic table's
// keys are in its index before a step). False, with `why`, when a key file is absent or a key repeats.
bool LoadKeys(Job& job, const std::string& dir, std::string* why) {
  for (size_t t = 0; t < job.tables.size(); ++t) {
    Table& tb = job.tables[t];
    const std::string path = dir + "/keys" + std::to_string(t) + ".bin";
    const std::vector<int64_t> keys = ReadArrayIfPresent<int64_t>(path, tb.rows);
    if (keys.empty()) {
      *why = "no key file " + path;
      return false;
    }
    if (!(job.compact_index ? LoadCompactIndex : LoadWideIndex)(tb, keys, path, why)) return false;
    for (Feature& f : job.features) {
      if (f.table != static_cast<int>(t)) continue;
      f.keys.resize(f.ids.size());
      for (size_t i = 0; i < f.ids.size(); ++i) f.keys[i] = keys[f.ids[i]];
    }
  }
  return true;
}

// A compact index's probe for `key`: its row, after counting the lookup in the row's record when `count` (a
// training step's lookup; a serving lookup counts nothing).
inline int64_t ProbeCompact(Table& tb, int64_t key, int64_t step, bool count) {
  const uint64_t mask = tb.compact_index.size() - 1;
  for (uint64_t b = HomeOf(key, mask);; b = (b + 1) & mask) {
    const uint32_t v = tb.compact_index[b];
    if (v == 0) Fail("key " + std::to_string(key) + " is not in its table");
    Table::RowRecord& r = tb.records[v - 1];
    if (r.key != key) continue;
    if (count) {
      if (r.count < UINT32_MAX) r.count = r.count + 1;
      if (r.last_step < step) r.last_step = step;
    }
    return static_cast<int64_t>(v) - 1;
  }
}

// Every feature's keys to their rows, written into its ids (which the rest of the step reads); `count`: a
// training step's (ProbeCompact).
void Resolve(Job& job, int64_t step, bool count) {
  for (Feature& f : job.features) {
    Table& tb = job.tables[f.table];
    const int64_t n = static_cast<int64_t>(f.keys.size());
    if (job.compact_index) {
      // Serial: a repeated key's record is written by each of its ids.
      const uint64_t mask = tb.compact_index.size() - 1;
      for (int64_t i = 0; i < n; ++i) {
        if (i + kProbeAhead < n) __builtin_prefetch(tb.compact_index.data() + HomeOf(f.keys[i + kProbeAhead], mask));
        f.ids[i] = ProbeCompact(tb, f.keys[i], step, count);
      }
      continue;
    }
#pragma omp parallel for schedule(static) num_threads(job.threads)
    for (int64_t i = 0; i < n; ++i) {
      if (i + kProbeAhead < n) __builtin_prefetch(tb.index.data() + HomeOf(f.keys[i + kProbeAhead], tb.index_mask));
      const int64_t key = f.keys[i];
      uint64_t b = HomeOf(key, tb.index_mask);
      for (; tb.index[b].key != key || tb.index[b].row < 0; b = (b + 1) & tb.index_mask) {
        if (tb.index[b].row < 0) Fail("key " + std::to_string(key) + " is not in its table");
      }
      f.ids[i] = tb.index[b].row;
    }
  }
}

// ----------------------------------------------------------------------------------------------- the passes

void Forward(Job& job) {
  for (Feature& f : job.features) {
    const Table& tb = job.tables[f.table];
    const int64_t d = tb.dim;
    const bool bf16 = job.bf16;
#pragma omp parallel for schedule(static) num_threads(job.threads)
    for (int64_t b = 0; b < f.batch; ++b) {
      if (f.splits.empty()) {
        if (b + kPrefetchAhead < f.batch)
          PrefetchRow(RowAddress(tb, bf16, f.ids[b + kPrefetchAhead]), RowBytes(tb, bf16));
        LoadRow(tb, bf16, f.ids[b], f.act.data() + b * d);
        continue;
      }
      const int64_t lo = f.splits[b], hi = f.splits[b + 1];
      if (f.seq_len > 0) {
        float* out = f.act.data() + b * f.seq_len * d;
        const int64_t n = std::min<int64_t>(hi - lo, f.seq_len);
        for (int64_t p = 0; p < n; ++p) {
          if (lo + p + kPrefetchAhead < static_cast<int64_t>(f.ids.size()))
            PrefetchRow(RowAddress(tb, bf16, f.ids[lo + p + kPrefetchAhead]), RowBytes(tb, bf16));
          LoadRow(tb, bf16, f.ids[lo + p], out + p * d);
        }
        std::memset(out + n * d, 0, (f.seq_len - n) * d * sizeof(float));
        continue;
      }
      float* out = f.act.data() + b * d;
      float row[1024];
      std::memset(out, 0, d * sizeof(float));
      for (int64_t k = lo; k < hi; ++k) {
        if (k + kPrefetchAhead < static_cast<int64_t>(f.ids.size()))
          PrefetchRow(RowAddress(tb, bf16, f.ids[k + kPrefetchAhead]), RowBytes(tb, bf16));
        LoadRow(tb, bf16, f.ids[k], row);
        for (int64_t i = 0; i < d; ++i) out[i] += row[i];
      }
      if (job.mean && hi > lo) {
        const float inv = 1.0f / static_cast<float>(hi - lo);
        for (int64_t i = 0; i < d; ++i) out[i] *= inv;
      }
    }
  }
}

// De-duplicates and accumulates one table's gradients; returns the number of distinct rows.
int64_t Accumulate(Job& job, int t) {
  Table& tb = job.tables[t];
  const int64_t d = tb.dim;
  int64_t distinct = 0;
  for (const Feature& f : job.features) {
    if (f.table != t) continue;
    for (int64_t b = 0; b < f.batch; ++b) {
      const int64_t lo = f.splits.empty() ? b : f.splits[b];
      const int64_t hi = f.splits.empty() ? b + 1 : f.splits[b + 1];
      const float scale = (job.mean && f.seq_len == 0 && hi > lo) ? 1.0f / static_cast<float>(hi - lo) : 1.0f;
      for (int64_t k = lo; k < hi; ++k) {
        if (k + 4 * kPrefetchAhead < static_cast<int64_t>(f.ids.size()))
          __builtin_prefetch(tb.slot_of.data() + f.ids[k + 4 * kPrefetchAhead]);
        const int64_t id = f.ids[k];
        int32_t u = tb.slot_of[id];
        const float* g = f.seq_len > 0 ? f.upstream.data() + (b * f.seq_len + (k - lo)) * d : f.upstream.data() + b * d;
        float* acc;
        if (u < 0) {
          u = static_cast<int32_t>(distinct++);
          tb.slot_of[id] = u;
          tb.uniq[u] = id;
          acc = tb.grad.data() + static_cast<int64_t>(u) * d;
          for (int64_t i = 0; i < d; ++i) acc[i] = g[i] * scale;
        } else {
          acc = tb.grad.data() + static_cast<int64_t>(u) * d;
          for (int64_t i = 0; i < d; ++i) acc[i] += g[i] * scale;
        }
      }
    }
  }
  return distinct;
}

inline void UpdateRow(const Job& job, int opt, const float* g, float* w, float* s0, float* s1, int64_t d) {
  const float lr = job.lr;
  if (opt == 0) {
    for (int64_t i = 0; i < d; ++i) w[i] -= lr * g[i];
  } else if (opt == 1) {
    for (int64_t i = 0; i < d; ++i) {
      s0[i] += g[i] * g[i];
      w[i] -= lr * g[i] / std::sqrt(s0[i]);
    }
  } else {
    // TPU Adam as the suite configures it (the proto's default use_sum_inside_sqrt = false): no bias
    // correction, epsilon added outside the root.
    const float b1 = job.beta1, b2 = job.beta2, eps = job.epsilon;
    for (int64_t i = 0; i < d; ++i) {
      s0[i] = b1 * s0[i] + (1.0f - b1) * g[i];
      s1[i] = b2 * s1[i] + (1.0f - b2) * g[i] * g[i];
      w[i] -= lr * s0[i] / (std::sqrt(s1[i]) + eps);
    }
  }
}

void Update(Job& job, int t, int64_t distinct, int opt, int64_t step) {
  Table& tb = job.tables[t];
  const int64_t d = tb.dim;
  const int slots = opt;  // OptimizerIndex
#pragma omp parallel for schedule(static) num_threads(job.threads)
  for (int64_t u = 0; u < distinct; ++u) {
    const int64_t row = tb.uniq[u];
    if (u + kPrefetchAhead < distinct) {
      const int64_t ahead = tb.uniq[u + kPrefetchAhead];
      PrefetchRow(RowAddress(tb, job.bf16, ahead), RowBytes(tb, job.bf16));
      for (int s = 0; s < slots; ++s)
        PrefetchRow(job.bf16 ? static_cast<const void*>(tb.s16[s].data() + ahead * d)
                             : static_cast<const void*>(tb.s32[s].data() + ahead * d),
                    RowBytes(tb, job.bf16));
    }
    const float* g = tb.grad.data() + u * d;
    if (!job.bf16) {
      float* w = tb.w32.data() + row * d;
      float* s0 = slots > 0 ? tb.s32[0].data() + row * d : nullptr;
      float* s1 = slots > 1 ? tb.s32[1].data() + row * d : nullptr;
      UpdateRow(job, opt, g, w, s0, s1, d);
    } else {
      float w[1024], s0[1024], s1[1024];
      uint16_t* ws = tb.w16.data() + row * d;
      for (int64_t i = 0; i < d; ++i) w[i] = Bf16ToFloat(ws[i]);
      for (int s = 0; s < slots; ++s) {
        const uint16_t* src = tb.s16[s].data() + row * d;
        float* dst = s == 0 ? s0 : s1;
        for (int64_t i = 0; i < d; ++i) dst[i] = Bf16ToFloat(src[i]);
      }
      UpdateRow(job, opt, g, w, s0, s1, d);
      const uint64_t k0 = RowKey(step, t, 0, row);
      for (int64_t i = 0; i < d; ++i) ws[i] = RoundStochastic(w[i], k0, static_cast<uint32_t>(i));
      for (int s = 0; s < slots; ++s) {
        const uint64_t ks = RowKey(step, t, 1 + s, row);
        uint16_t* dst = tb.s16[s].data() + row * d;
        const float* src = s == 0 ? s0 : s1;
        for (int64_t i = 0; i < d; ++i) dst[i] = RoundStochastic(src[i], ks, static_cast<uint32_t>(i));
      }
    }
  }
  for (int64_t u = 0; u < distinct; ++u) tb.slot_of[tb.uniq[u]] = -1;
}

// A step's two halves, as a training step run by TensorFlow must split them: the model's backward pass runs
// between the activations and the update.
void ForwardPart(Job& job, int opt, int64_t step) {
  if (job.keyed) Resolve(job, step, /*count=*/opt >= 0);
  Forward(job);
}

void BackwardPart(Job& job, int opt, int64_t step) {
  if (opt < 0) return;  // a lookup
  for (int t = 0; t < static_cast<int>(job.tables.size()); ++t) {
    const int64_t distinct = Accumulate(job, t);
    Update(job, t, distinct, opt, step);
  }
}

void Step(Job& job, int opt, int64_t step) {
  ForwardPart(job, opt, step);
  BackwardPart(job, opt, step);
}

// One prepared state of the worker or the library: its own tables and slots (so fp32 and bf16, or two
// optimizers, coexist).
struct Served {
  Job job;
  int opt = 0;
  int64_t step = 0;
};

#ifndef SPEED_OF_LIGHT_LIBRARY  // the binary's two modes
double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Serve(const std::string& dir) {
  const Job base = ReadJob(dir);
  CheckTables(base);
  std::vector<std::pair<std::string, Served>> engines;
  auto find = [&](const std::string& name) -> Served* {
    for (auto& e : engines)
      if (e.first == name) return &e.second;
    return nullptr;
  };
  auto drop = [&](const std::string& name) {
    engines.erase(std::remove_if(engines.begin(), engines.end(), [&](const auto& e) { return e.first == name; }),
                  engines.end());
  };
  auto reply = [](const std::string& text) {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream ls(line);
    std::string cmd, name;
    if (!(ls >> cmd)) continue;
    if (cmd == "quit") return 0;
    if (cmd == "prepare" && (ls >> name)) {
      std::string opt_name = "sgd", storage = "fp32", keys = "ids", word;
      int threads = base.threads, warmup = base.warmup;
      bool ok = true;
      while (ls >> word) {
        const size_t eq = word.find('=');
        const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
        if (key == "optimizer")
          opt_name = value;
        else if (key == "storage")
          storage = value;
        else if (key == "keys")
          keys = value;
        else if (key == "threads")
          threads = std::atoi(value.c_str());
        else if (key == "warmup")
          warmup = std::atoi(value.c_str());
        else
          ok = false;
      }
      if (!ok || (opt_name != "sgd" && opt_name != "adagrad" && opt_name != "adam" && opt_name != "lookup") ||
          (storage != "fp32" && storage != "bf16") || (keys != "ids" && keys != "hashed" && keys != "compact") ||
          threads < 1) {
        reply("error prepare " + name +
              ": expected optimizer=sgd|adagrad|adam|lookup storage=fp32|bf16 keys=ids|hashed|compact threads>=1 "
              "warmup=N");
        continue;
      }
      drop(name);
      Served s;
      s.job = base;
      s.job.bf16 = storage == "bf16";
      s.job.threads = threads;
      s.job.keyed = keys != "ids";
      s.job.compact_index = keys == "compact";
      std::string why;
      if (s.job.keyed && !LoadKeys(s.job, dir, &why)) {
        reply("error prepare " + name + ": " + why);
        continue;
      }
      s.opt = OptimizerIndex(opt_name);
      ResetState(s.job, opt_name, dir);
      for (int i = 0; i < warmup; ++i) Step(s.job, s.opt, s.step++);
      engines.emplace_back(name, std::move(s));
      reply("ok");
    } else if (cmd == "time" && (ls >> name)) {
      int steps = 0;
      Served* s = find(name);
      if (!(ls >> steps) || steps < 1 || s == nullptr) {
        reply("error time " + name + ": unknown engine or steps < 1");
        continue;
      }
      const double t0 = NowMs();
      for (int i = 0; i < steps; ++i) Step(s->job, s->opt, s->step++);
      char buf[64];
      std::snprintf(buf, sizeof(buf), "seconds %.9f", (NowMs() - t0) / 1e3);
      reply(buf);
    } else if (cmd == "drop" && (ls >> name)) {
      drop(name);
      reply("ok");
    } else {
      reply("error unknown request: " + line);
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--serve") return Serve(argv[2]);
  if (argc != 2) Fail("usage: speed_of_light JOB_DIR | speed_of_light --serve JOB_DIR");
  const std::string dir = argv[1];
  Job job = ReadJob(dir);
  CheckTables(job);
  std::string why;
  if (job.keyed && !LoadKeys(job, dir, &why)) Fail(why);
  std::string out = "{\"results\": {";
  for (size_t o = 0; o < job.optimizers.size(); ++o) {
    const std::string& name = job.optimizers[o];
    const int opt = OptimizerIndex(name);
    ResetState(job, name, dir);
    int64_t step = 0;
    if (o) out += ", ";
    out += "\"" + name + "\": {";
    if (job.check_steps > 0) {
      for (int s = 0; s < job.check_steps; ++s) Step(job, opt, step++);
      for (size_t t = 0; t < job.tables.size(); ++t) {
        const Table& tb = job.tables[t];
        std::vector<float> w(tb.rows * tb.dim);
        for (int64_t r = 0; r < tb.rows; ++r) LoadRow(tb, job.bf16, r, w.data() + r * tb.dim);
        std::ofstream f(dir + "/final_" + name + "_" + std::to_string(t) + ".bin", std::ios::binary);
        f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * sizeof(float)));
      }
      out += "\"steps\": " + std::to_string(job.check_steps) + "}";
      continue;
    }
    for (int s = 0; s < job.warmup; ++s) Step(job, opt, step++);
    int steps = job.steps;
    if (steps <= 0) {
      const double t0 = NowMs();
      Step(job, opt, step++);
      const double one = std::max(NowMs() - t0, 1e-3);
      steps = std::max(1, static_cast<int>(job.block_ms / one));
    }
    out += "\"steps\": " + std::to_string(steps) + ", \"block_ms\": [";
    for (int b = 0; b < job.blocks; ++b) {
      const double t0 = NowMs();
      for (int s = 0; s < steps; ++s) Step(job, opt, step++);
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%s%.6f", b ? ", " : "", (NowMs() - t0) / steps);
      out += buf;
    }
    out += "]}";
  }
  out += "}}";
  std::printf("%s\n", out.c_str());
  return 0;
}
#endif  // SPEED_OF_LIGHT_LIBRARY

}  // namespace
}  // namespace speed_of_light

#ifdef SPEED_OF_LIGHT_LIBRARY
// The library's calls.  The job's files are read as the binary reads them, and a malformed job ends the
// process as it ends the binary's (Fail): the caller writes the job itself (speed_of_light.py) and checks the
// optimizer first.
extern "C" {
// A state of the job in DIR (its storage, the job's thread count; HASHED_KEYS 1 or 2: the features' keys, with
// the wide or the compact index, as `keys=hashed` or `keys=compact` prepares a worker's), its tables and slots set
// for OPTIMIZER (sgd, adagrad, adam or lookup) and warmed by WARMUP steps; free it with speed_of_light_close.
// Null, with the reason on stderr, when the keys cannot be read.
void* speed_of_light_open(const char* dir, const char* optimizer, int hashed_keys, int warmup) {
  auto* s = new speed_of_light::Served;
  s->job = speed_of_light::ReadJob(dir);
  speed_of_light::CheckTables(s->job);
  s->job.keyed = hashed_keys != 0;
  s->job.compact_index = hashed_keys == 2;
  std::string why;
  if (s->job.keyed && !speed_of_light::LoadKeys(s->job, dir, &why)) {
    std::fprintf(stderr, "speed_of_light: %s\n", why.c_str());
    delete s;
    return nullptr;
  }
  s->opt = speed_of_light::OptimizerIndex(optimizer);
  speed_of_light::ResetState(s->job, optimizer, dir);
  for (int i = 0; i < warmup; ++i) speed_of_light::Step(s->job, s->opt, s->step++);
  return s;
}

void speed_of_light_steps(void* state, int steps) {
  auto* s = static_cast<speed_of_light::Served*>(state);
  for (int i = 0; i < steps; ++i) speed_of_light::Step(s->job, s->opt, s->step++);
}

// A step's forward half (the keys resolved, the activations written), then its backward half (de-duplication,
// accumulation, update; the step counted): speed_of_light_steps(state, 1) split in two, for a step run by
// TensorFlow as two ops.
void speed_of_light_forward(void* state) {
  auto* s = static_cast<speed_of_light::Served*>(state);
  speed_of_light::ForwardPart(s->job, s->opt, s->step);
}

void speed_of_light_backward(void* state) {
  auto* s = static_cast<speed_of_light::Served*>(state);
  speed_of_light::BackwardPart(s->job, s->opt, s->step++);
}

// Copies table TABLE's rows into OUT (rows x dim floats); 0 when TABLE is not one of the job's.
int speed_of_light_read_table(void* state, int table, float* out) {
  const auto* s = static_cast<const speed_of_light::Served*>(state);
  if (table < 0 || table >= static_cast<int>(s->job.tables.size())) return 0;
  const speed_of_light::Table& tb = s->job.tables[table];
  for (int64_t r = 0; r < tb.rows; ++r) speed_of_light::LoadRow(tb, s->job.bf16, r, out + r * tb.dim);
  return 1;
}

void speed_of_light_close(void* state) { delete static_cast<speed_of_light::Served*>(state); }
}
#else
int main(int argc, char** argv) { return speed_of_light::Main(argc, argv); }
#endif
