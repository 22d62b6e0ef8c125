// The aggregation core of the sparse conditional accumulator, free of TensorFlow types.
//
// Contract (docs/sparse_accumulator.md, "canonical mode"):
// - The store holds rows keyed by an int64 index.  Each row has a running sum of `row_width` elements and a
//   count: the number of gradients that touched the row since the store was (re)created or cleared.
// - Add() takes one gradient (indices in any order, duplicates allowed).  It is canonicalised first: the
//   duplicates of an index are summed in the order they appear, then that one row is added to the held row
//   (or becomes it).  So a row's count grows by exactly one per gradient that touches it, however many times.
// - Extract() writes the rows in ascending index order, each divided by its own count when `mean` is set.
//
// Layout, and why: every apply probes the held set once per row, but the set is needed in index order only
// once per round (at take).  So rows live in an arena in arrival order (a row's "slot"), an open-addressing
// hash table maps index -> slot, and Extract sorts the slots' indices (a radix sort, skipped when the rows
// arrived in ascending order, as disjoint gradients do).  An ordered B-tree cost ~20 ns per probe or insert,
// half as much as the (memory-bound) row arithmetic; the hash probe costs ~8 ns.
//
// Add runs in two passes: a serial one gives every canonical row its slot (counts, new rows, arena growth),
// then the row arithmetic, which may be sharded over threads: each canonical row is one unit of work and
// owns its slot, so no two workers write one row, and a row's additions happen in gradient order whatever
// the sharding (bitwise the same sums).
//
// Cost: Add is O(n) expected (one probe per row, amortised table growth) plus the row arithmetic, and
// O(n log n) more when the indices are not strictly ascending (checked in one pass).  It never touches rows it
// does not hit (TensorFlow's merge copies every held row on every apply).  Extract is O(H * row_width) for H
// held rows, plus O(H) radix passes when the rows did not arrive in ascending index order.
// Not thread-safe: the owner serialises access (the shard function's workers are managed by Add/Extract).
#ifndef TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_H_
#define TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "cc/lib/shard.h"
#include "cc/lib/sparse_accumulator_rows.h"

namespace tf_embed_ops {

namespace sparse_accumulator_internal {

// How many rows ahead the loops prefetch: the held rows are scattered over the arena (random access), and a
// row is a few cache lines, so a handful of rows in flight hides most of the latency.
inline constexpr int64_t kPrefetchRows = 8;

template <typename T>
inline void PrefetchRow(const T* row, int64_t width, int write) {
  const char* p = reinterpret_cast<const char*>(row);
  const int64_t bytes = width * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) {
    if (write) {
      __builtin_prefetch(p + b, 1, 3);
    } else {
      __builtin_prefetch(p + b, 0, 3);
    }
  }
}

// index -> slot.  Open addressing with linear probing, at most half full, multiplicative (Fibonacci) hashing
// so that runs of consecutive indices spread over the table.  No erase: the store only grows until Clear.
class IndexSlotTable {
 public:
  int64_t size() const { return size_; }

  // Makes room for `n` entries in all, so that the inserts of one Add never rehash.
  void Reserve(int64_t n) {
    int64_t capacity = static_cast<int64_t>(buckets_.size());
    if (2 * n <= capacity) return;
    if (capacity == 0) capacity = 64;
    while (2 * n > capacity) capacity *= 2;
    std::vector<Bucket> old(static_cast<size_t>(capacity));
    old.swap(buckets_);
    SetCapacity(capacity);
    for (const Bucket& b : old) {
      if (b.slot >= 0) InsertNew(b.key, b.slot);
    }
  }

  // Empties the table, keeping its capacity.
  void Clear() {
    std::fill(buckets_.begin(), buckets_.end(), Bucket{});
    size_ = 0;
  }

  void Prefetch(int64_t key) const { __builtin_prefetch(&buckets_[Home(key)], 0, 3); }

  // The slot of `key`, or -1.  Safe to call from several threads while nothing inserts.
  int64_t Find(int64_t key) const {
    for (uint64_t b = Home(key);; b = (b + 1) & mask_) {
      const Bucket& bucket = buckets_[b];
      if (bucket.slot < 0 || bucket.key == key) return bucket.slot;
    }
  }

  // The slot of `key`, or `slot_if_new` after inserting it.  Reserve() must have made room.
  int64_t FindOrInsert(int64_t key, int64_t slot_if_new) {
    for (uint64_t b = Home(key);; b = (b + 1) & mask_) {
      Bucket& bucket = buckets_[b];
      if (bucket.slot < 0) {
        bucket = Bucket{key, slot_if_new};
        ++size_;
        return slot_if_new;
      }
      if (bucket.key == key) return bucket.slot;
    }
  }

 private:
  struct Bucket {
    int64_t key = 0;
    int64_t slot = -1;  // -1: empty
  };

  uint64_t Home(int64_t key) const { return (static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_; }

  void SetCapacity(int64_t capacity) {
    mask_ = static_cast<uint64_t>(capacity) - 1;
    shift_ = 64;
    for (int64_t c = capacity; c > 1; c >>= 1) --shift_;
  }

  void InsertNew(int64_t key, int64_t slot) {
    uint64_t b = Home(key);
    while (buckets_[b].slot >= 0) b = (b + 1) & mask_;
    buckets_[b] = Bucket{key, slot};
  }

  std::vector<Bucket> buckets_;
  uint64_t mask_ = 0;
  int shift_ = 64;
  int64_t size_ = 0;
};

// The permutation that sorts `keys` ascending (stable; LSD radix over the bytes in which the keys differ).
inline std::vector<int64_t> SortedOrder(const std::vector<int64_t>& keys) {
  const size_t n = keys.size();
  struct Entry {
    uint64_t key;  // sign bit flipped: unsigned order = signed order
    int64_t pos;
  };
  std::vector<Entry> a(n), b(n);
  uint64_t differ = 0;
  for (size_t i = 0; i < n; ++i) {
    a[i] = Entry{static_cast<uint64_t>(keys[i]) ^ (uint64_t{1} << 63), static_cast<int64_t>(i)};
    differ |= a[i].key ^ a[0].key;
  }
  for (int shift = 0; shift < 64; shift += 8) {
    // A byte equal in every key leaves the (stable) order as it is.
    if (((differ >> shift) & 0xff) == 0) continue;
    std::array<size_t, 257> start{};
    for (const Entry& e : a) ++start[((e.key >> shift) & 0xff) + 1];
    for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
    for (const Entry& e : a) b[start[(e.key >> shift) & 0xff]++] = e;
    a.swap(b);
  }
  std::vector<int64_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = a[i].pos;
  return order;
}

inline void RunSharded(const ShardFn& shard, int64_t total, int64_t cost_per_unit,
                       const std::function<void(int64_t, int64_t)>& fn) {
  if (total <= 0) return;
  if (shard) {
    shard(total, cost_per_unit, fn);
  } else {
    fn(0, total);
  }
}

}  // namespace sparse_accumulator_internal

template <typename T>
class SparseRowSum {
 public:
  explicit SparseRowSum(int64_t row_width) : row_width_(row_width) {
    // Rows per chunk is a power of two, so a slot's row is found with a shift and a mask.
    const int64_t fit = row_width == 0 ? kChunkElements : std::max<int64_t>(1, kChunkElements / row_width);
    while ((int64_t{2} << chunk_shift_) <= fit) ++chunk_shift_;
  }

  SparseRowSum(const SparseRowSum&) = delete;
  SparseRowSum& operator=(const SparseRowSum&) = delete;

  int64_t row_width() const { return row_width_; }
  int64_t num_rows() const { return static_cast<int64_t>(index_of_slot_.size()); }

  // Empties the store for the next round.  The memory the last round used (row chunks, hash table) is kept,
  // so a steady stream of rounds allocates nothing (fresh pages cost a fault each); chunks beyond it are freed.
  void Clear() {
    chunks_.resize(static_cast<size_t>(ChunksFor(num_rows())));
    table_.Clear();
    index_of_slot_.clear();
    counts_.clear();
    ascending_ = true;
  }

  // Adds one gradient: `n` indices and `n * row_width()` values, row-major.  Indices are not range-checked
  // here (the caller validated them).  `shard` (may be null) runs the row arithmetic.
  void Add(const int64_t* indices, int64_t n, const T* values, const ShardFn& shard = nullptr) {
    namespace internal = sparse_accumulator_internal;
    if (n == 0) return;
    table_.Reserve(num_rows() + n);
    const int64_t cost = RowCost();
    if (StrictlyAscending(indices, n)) {
      AddUnique(indices, n, values, shard);
      return;
    }
    // The general case, in two passes: a serial one gives each canonical row its slot, then the arithmetic.
    // Sort positions by (index, position): duplicates stay in their input order, so their sum is defined.
    order_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order_[i] = {indices[i], i};
    std::sort(order_.begin(), order_.end());
    runs_.clear();
    for (size_t begin = 0; begin < order_.size();) {
      size_t end = begin + 1;
      while (end < order_.size() && order_[end].first == order_[begin].first) ++end;
      runs_.push_back(Run{Assign(order_[begin].first), static_cast<int64_t>(begin), static_cast<int64_t>(end)});
      begin = end;
    }
    GrowArena();
    internal::RunSharded(shard, static_cast<int64_t>(runs_.size()), cost, [this, values](int64_t begin, int64_t end) {
      std::vector<T> scratch;  // only for an index repeated within the gradient that is already held
      for (int64_t r = begin; r < end; ++r) AddRun(runs_[r], values, &scratch);
    });
  }

  // Writes the held rows in ascending index order: `num_rows()` indices and `num_rows() * row_width()`
  // values.  With `mean`, each row is divided by its count converted to T (as TensorFlow does, so float16
  // rounds the count first).  `shard` (may be null) runs the copy.
  void Extract(bool mean, int64_t* out_indices, T* out_values, const ShardFn& shard = nullptr) const {
    namespace internal = sparse_accumulator_internal;
    const std::vector<int64_t> order = ascending_ ? std::vector<int64_t>() : internal::SortedOrder(index_of_slot_);
    const int64_t* slots = ascending_ ? nullptr : order.data();
    internal::RunSharded(shard, num_rows(), RowCost(), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        if (slots != nullptr && r + internal::kPrefetchRows < end) {
          internal::PrefetchRow(Row(slots[r + internal::kPrefetchRows]), row_width_, 0);
        }
        const int64_t slot = slots == nullptr ? r : slots[r];
        out_indices[r] = index_of_slot_[slot];
        const T* src = Row(slot);
        T* dst = out_values + r * row_width_;
        if (mean) {
          const T count = static_cast<T>(counts_[slot]);
          for (int64_t j = 0; j < row_width_; ++j) dst[j] = src[j] / count;
        } else {
          std::copy(src, src + row_width_, dst);
        }
      }
    });
  }

 private:
  // A canonical row of a gradient with repeated or unsorted indices: positions order_[begin, end) of the
  // gradient (ascending input position), going to `code` (see Assign).
  struct Run {
    int64_t code;
    int64_t begin;
    int64_t end;
  };

  // Rows live in fixed-size chunks so that growing the store never moves (copies) the rows already held.
  static constexpr int64_t kChunkElements = 1 << 16;
  static constexpr size_t kChunkAlignment = 64;
  struct ChunkFree {
    void operator()(void* p) const { ::operator delete(p, std::align_val_t{kChunkAlignment}); }
  };

  static bool StrictlyAscending(const int64_t* indices, int64_t n) {
    for (int64_t i = 1; i < n; ++i) {
      if (indices[i] <= indices[i - 1]) return false;
    }
    return true;
  }

  // The row arithmetic's cost for the shard function: a few cycles per element (memory bound).
  int64_t RowCost() const { return 4 * std::max<int64_t>(1, row_width_); }

  static int64_t Slot(int64_t code) { return code < 0 ? ~code : code; }

  int64_t ChunksFor(int64_t rows) const {
    if (row_width_ == 0) return 0;
    return (rows + (int64_t{1} << chunk_shift_) - 1) >> chunk_shift_;
  }

  T* Row(int64_t slot) const {
    if (row_width_ == 0) return nullptr;
    const int64_t offset = (slot & ((int64_t{1} << chunk_shift_) - 1)) * row_width_;
    return static_cast<T*>(chunks_[static_cast<size_t>(slot >> chunk_shift_)].get()) + offset;
  }

  // Pass 1 for one canonical row: its slot, counted.  Returns the slot for a held row and ~slot (negative)
  // for a new one, whose row pass 2 must initialise.
  int64_t Assign(int64_t index) {
    const int64_t new_slot = num_rows();
    const int64_t slot = table_.FindOrInsert(index, new_slot);
    if (slot != new_slot) {
      ++counts_[slot];
      return slot;
    }
    if (new_slot > 0 && index < index_of_slot_.back()) ascending_ = false;
    if (new_slot == 0 || index > index_of_slot_[max_slot_]) max_slot_ = new_slot;
    index_of_slot_.push_back(index);
    counts_.push_back(1);
    return ~slot;
  }

  void GrowArena() {
    const size_t per_chunk = static_cast<size_t>(1) << chunk_shift_;
    while (chunks_.size() < static_cast<size_t>(ChunksFor(num_rows()))) {
      // Not value-initialised: every row is written before it is read.  Cache-line aligned, so a row of
      // 64 floats spans 4 lines, not 5.
      chunks_.emplace_back(
          ::operator new(per_chunk* static_cast<size_t>(row_width_) * sizeof(T), std::align_val_t{kChunkAlignment}));
    }
  }

  // The indices of one gradient are unique (strictly ascending), so each gradient row owns its held row:
  // - pass 1 (sharded): rows already held are added in place; the hash table is only read, and each count
  //   is bumped by the one worker owning the row.  Rows not held are marked (plan_[i] = -1);
  // - pass 2 (serial): the new rows get slots, in gradient order (so the slot order, hence Extract, does not
  //   depend on the sharding) and the arena grows;
  // - pass 3 (sharded): the new rows are copied in.
  // Once the held set covers most of what arrives (the usual steady state), pass 2 and 3 are small and the
  // whole apply runs in parallel.  Pass 1 is skipped when no row can be held (the first gradient of a round,
  // or indices all beyond the largest held one).
  void AddUnique(const int64_t* indices, int64_t n, const T* values, const ShardFn& shard) {
    namespace internal = sparse_accumulator_internal;
    plan_.resize(static_cast<size_t>(n));
    const int64_t cost = RowCost();
    if (num_rows() == 0 || indices[0] > index_of_slot_[max_slot_]) {
      // Every row is new (the first gradient of a round, or rows beyond all held ones, as with disjoint
      // gradients): no probe can hit.
      std::fill(plan_.begin(), plan_.end(), -1);
    } else {
      ProbeAndAddHeld(indices, n, values, shard);
    }
    new_rows_.clear();
    for (int64_t i = 0; i < n; ++i) {
      // The buckets are random accesses into a table that may be far larger than the caches.
      const int64_t ahead = i + internal::kPrefetchRows;
      if (ahead < n && plan_[ahead] < 0) table_.Prefetch(indices[ahead]);
      if (plan_[i] >= 0) continue;
      new_rows_.push_back({i, Slot(Assign(indices[i]))});
    }
    GrowArena();
    internal::RunSharded(shard, static_cast<int64_t>(new_rows_.size()), cost,
                         [this, values](int64_t begin, int64_t end) {
                           for (int64_t k = begin; k < end; ++k) {
                             const T* src = values + new_rows_[k].first * row_width_;
                             std::copy(src, src + row_width_, Row(new_rows_[k].second));
                           }
                         });
  }

  // Pass 1 of AddUnique: adds the rows already held, marks the others (plan_[i] = -1).
  void ProbeAndAddHeld(const int64_t* indices, int64_t n, const T* values, const ShardFn& shard) {
    namespace internal = sparse_accumulator_internal;
    internal::RunSharded(shard, n, RowCost(), [this, indices, values](int64_t begin, int64_t end) {
      // Probed in blocks, whose hits then go to one call of the (vectorised) row kernel.
      constexpr int64_t kBlock = 32;
      T* dst[kBlock];
      const T* src[kBlock];
      for (int64_t block = begin; block < end; block += kBlock) {
        const int64_t block_end = std::min(end, block + kBlock);
        int64_t hits = 0;
        for (int64_t i = block; i < block_end; ++i) {
          if (i + internal::kPrefetchRows < end) table_.Prefetch(indices[i + internal::kPrefetchRows]);
          const int64_t slot = table_.Find(indices[i]);
          plan_[i] = slot;
          if (slot < 0) continue;
          ++counts_[slot];
          dst[hits] = Row(slot);
          src[hits] = values + i * row_width_;
          ++hits;
        }
        AddRows(dst, src, hits, row_width_);
      }
    });
  }

  // The second pass for one canonical row of an unsorted or repeating gradient.
  void AddRun(const Run& run, const T* values, std::vector<T>* scratch) const {
    const T* first = values + order_[run.begin].second * row_width_;
    T* row = Row(Slot(run.code));
    if (run.code < 0) {
      std::copy(first, first + row_width_, row);
      for (int64_t k = run.begin + 1; k < run.end; ++k) AddInto(row, values + order_[k].second * row_width_);
      return;
    }
    if (run.end - run.begin == 1) {
      AddInto(row, first);
      return;
    }
    // Duplicates are summed among themselves first, then added once: the canonical gradient's row.
    scratch->assign(first, first + row_width_);
    for (int64_t k = run.begin + 1; k < run.end; ++k) AddInto(scratch->data(), values + order_[k].second * row_width_);
    AddInto(row, scratch->data());
  }

  void AddInto(T* dst, const T* src) const { AddRows(&dst, &src, 1, row_width_); }

  int64_t row_width_;
  int chunk_shift_ = 0;  // log2(rows per chunk)
  sparse_accumulator_internal::IndexSlotTable table_;
  std::vector<int64_t> index_of_slot_;  // by slot
  std::vector<int32_t> counts_;         // by slot
  bool ascending_ = true;               // index_of_slot_ is ascending: Extract needs no sort
  int64_t max_slot_ = 0;                // slot of the largest held index (when any is held)
  std::vector<std::unique_ptr<void, ChunkFree>> chunks_;
  // Per-Add scratch, kept to reuse its memory.
  std::vector<int64_t> plan_;
  std::vector<std::pair<int64_t, int64_t>> new_rows_;  // (gradient row, slot)
  std::vector<std::pair<int64_t, int64_t>> order_;
  std::vector<Run> runs_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_H_
