// The key -> row index of a dynamic table (docs/dynamic_tables_internals.md, "Layout"): open addressing with linear
// probing over a power-of-two array of uint32 buckets, each 0 (empty) or row + 1.  The key itself is not
// duplicated in the bucket: the probe compares against the table's per-row key (the `KeyOf` callback), which
// keeps the index at 4 bytes per bucket.  The load factor stays at most 3/4 (so between 3/8 and 3/4 after a
// doubling), i.e. 5.3 to 10.7 bytes of index per row.
//
// Growth rehashes the index only (rows stay where they are).  Erase uses backward-shift deletion (no
// tombstones), so a probe sequence never lengthens with churn: lookups stay fast under steady eviction.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_INDEX_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_INDEX_H_

#include <cstdint>
#include <new>
#include <vector>

#include "cc/lib/dynamic_table_key.h"
#include "cc/lib/huge_pages.h"
#include "cc/lib/prefetch.h"

namespace tf_embed_ops {

class KeyIndex {
 public:
  static constexpr int64_t kNotFound = -1;
  // Rows are stored as uint32 row + 1.
  static constexpr int64_t kMaxRows = (int64_t{1} << 31) - 1;
  static constexpr int64_t kMinBuckets = 16;

  // The bucket count that holds n keys at load <= 3/4.
  static int64_t BucketsFor(int64_t n) {
    int64_t b = kMinBuckets;
    while (4 * n > 3 * b) b *= 2;
    return b;
  }

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  bool Fits(int64_t n) const { return 4 * n <= 3 * num_buckets(); }
  int64_t MemoryBytes() const { return static_cast<int64_t>(buckets_.capacity() * sizeof(uint32_t)); }

  template <typename KeyOf>
  int64_t Find(int64_t key, const KeyOf& key_of) const {
    if (buckets_.empty()) return kNotFound;
    return FindFrom(key, Home(key), key_of);
  }

  // rows[i] = Find(keys[i]) for a whole batch, as a software pipeline: each key's home bucket is prefetched
  // kProbeDistance keys ahead of its probe, so the bucket misses of a probe into a large table overlap those of
  // the following keys.  The probe's key compare (the row's metadata record) is not prefetched: done with a
  // prefetch instruction, a batch that finds its records in the caches took 1.2x as long, and one that misses
  // them as long as without (docs/design_notes.md).  Prefetches are hints: the results are Find's.
  template <typename KeyOf>
  void FindBatch(const int64_t* keys, int64_t n, const KeyOf& key_of, int64_t* rows) const {
    if (buckets_.empty()) {
      for (int64_t i = 0; i < n; ++i) rows[i] = kNotFound;
      return;
    }
    uint64_t homes[kHomeRing];
    for (int64_t i = 0; i < n + kProbeDistance; ++i) {
      if (i < n) {
        const uint64_t home = Home(keys[i]);
        homes[i & (kHomeRing - 1)] = home;
        PrefetchLine(&buckets_[home]);
      }
      const int64_t k = i - kProbeDistance;
      if (k >= 0) rows[k] = FindFrom(keys[k], homes[k & (kHomeRing - 1)], key_of);
    }
  }

  // `key` must be absent and Fits(size + 1) true.
  void Insert(int64_t key, int64_t row) {
    const uint64_t mask = buckets_.size() - 1;
    uint64_t b = Home(key);
    while (buckets_[b] != 0) b = (b + 1) & mask;
    buckets_[b] = static_cast<uint32_t>(row + 1);
  }

  // Removes `key` (which must be present) and closes the gap: every later bucket of the run whose home is not
  // strictly inside (gap, bucket] moves back into the gap.
  template <typename KeyOf>
  void Erase(int64_t key, const KeyOf& key_of) {
    const uint64_t mask = buckets_.size() - 1;
    uint64_t gap = Home(key);
    while (key_of(int64_t{buckets_[gap]} - 1) != key) gap = (gap + 1) & mask;
    for (uint64_t b = (gap + 1) & mask;; b = (b + 1) & mask) {
      const uint32_t v = buckets_[b];
      if (v == 0) break;
      const uint64_t home = Home(key_of(int64_t{v} - 1));
      // The entry may fill the gap iff its home is not in the cyclic interval (gap, b].
      const bool home_after_gap = ((home - gap - 1) & mask) < ((b - gap) & mask);
      if (!home_after_gap) {
        buckets_[gap] = v;
        gap = b;
      }
    }
    buckets_[gap] = 0;
  }

  // Rebuilds the index with BucketsFor(n) buckets (n >= the number of indexed rows), re-inserting every row.
  // Returns false, keeping the old index, if the allocation fails.
  template <typename KeyOf>
  bool Rehash(int64_t n, const KeyOf& key_of) {
    Buckets fresh;
    try {
      fresh.assign(BucketsFor(n), 0);
    } catch (const std::bad_alloc&) {
      return false;
    }
    buckets_.swap(fresh);
    for (const uint32_t v : fresh) {
      if (v != 0) Insert(key_of(int64_t{v} - 1), int64_t{v} - 1);
    }
    return true;
  }

  void Clear() { buckets_.assign(buckets_.size(), 0); }

  // fn(row) for every indexed row, in bucket order.
  template <typename Fn>
  void ForEachRow(const Fn& fn) const {
    for (const uint32_t v : buckets_) {
      if (v != 0) fn(int64_t{v} - 1);
    }
  }

 private:
  // FindBatch's pipeline depth (keys between a home bucket's prefetch and its probe) and its ring of home
  // buckets, which holds the homes of the kProbeDistance + 1 keys in flight.
  static constexpr int64_t kProbeDistance = 16;
  static constexpr int64_t kHomeRing = 32;
  static_assert(kHomeRing > kProbeDistance && (kHomeRing & (kHomeRing - 1)) == 0, "ring too small");

  // Linear probe for `key` from its home bucket `b`; the index is not empty.
  template <typename KeyOf>
  int64_t FindFrom(int64_t key, uint64_t b, const KeyOf& key_of) const {
    const uint64_t mask = buckets_.size() - 1;
    for (;; b = (b + 1) & mask) {
      const uint32_t v = buckets_[b];
      if (v == 0) return kNotFound;
      if (key_of(int64_t{v} - 1) == key) return int64_t{v} - 1;
    }
  }

  uint64_t Home(int64_t key) const { return MixKey(static_cast<uint64_t>(key)) & (buckets_.size() - 1); }

  // On 2 MiB pages when large (huge_pages.h): a probe is a random bucket of an index far past the TLB's reach.
  using Buckets = std::vector<uint32_t, HugePageAllocator<uint32_t>>;
  Buckets buckets_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_INDEX_H_
