// One probe per key per step for dynamic tables: the rows a training lookup found, kept for the fused update of
// the same step.
//
// A training step looks every key up twice: the training lookup (FindOrInsert) resolves keys to rows, and the
// fused update needs the same rows to build its gradient plan.  Probing the hash index again costs a random
// memory access per key; instead the lookup remembers (keys, rows) and the update takes them when
//   * its keys are exactly the remembered ones, in the same order (compared element by element: a cheap
//     sequential scan, against a random access per key), and
//   * the table's key -> row mapping has not changed since (DynamicTable::mapping_version: any insert, eviction
//     or import between the two changes it).
// Anything else (a different batch, another front end's lookup of the same table in between, a restore, an
// explicit eviction) falls back to probing, so the memo can only save work, never change a result.
//
// Not thread-safe: the owner (the table's resource) holds the table's lock around every call.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_LOOKUP_MEMO_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_LOOKUP_MEMO_H_

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace tf_embed_ops {

class LookupMemo {
 public:
  // A run of keys whose rows are wanted, written to `rows` (num_keys entries) by Recall.
  struct Segment {
    const int64_t* keys;
    int64_t num_keys;
    int64_t* rows;
  };

  // Remembers keys[i] -> rows[i] (i < n), resolved when the table's mapping version was `version`.  On an
  // allocation failure nothing is remembered (the update then probes).
  void Remember(const int64_t* keys, const int64_t* rows, int64_t n, uint64_t version) {
    Forget();
    try {
      keys_.assign(keys, keys + n);
      rows_.assign(rows, rows + n);
    } catch (const std::bad_alloc&) {
      Forget();
      return;
    }
    version_ = version;
    valid_ = true;
  }

  // When the segments, concatenated in order, are exactly the remembered keys and the mapping is still at the
  // remembered version: writes every segment's rows and returns true.  Otherwise writes nothing, returns false.
  bool Recall(const std::vector<Segment>& segments, uint64_t version) const {
    if (!valid_ || version != version_) return false;
    int64_t total = 0;
    for (const Segment& s : segments) total += s.num_keys;
    if (total != static_cast<int64_t>(keys_.size())) return false;
    int64_t at = 0;
    for (const Segment& s : segments) {
      if (s.num_keys > 0 && std::memcmp(s.keys, keys_.data() + at, s.num_keys * sizeof(int64_t)) != 0) return false;
      at += s.num_keys;
    }
    at = 0;
    for (const Segment& s : segments) {
      if (s.num_keys > 0) std::memcpy(s.rows, rows_.data() + at, s.num_keys * sizeof(int64_t));
      at += s.num_keys;
    }
    return true;
  }

  // Drops the remembered keys (the memory stays reserved for the next step's).
  void Forget() {
    valid_ = false;
    keys_.clear();
    rows_.clear();
  }

  bool valid() const { return valid_; }

 private:
  std::vector<int64_t> keys_;
  std::vector<int64_t> rows_;
  uint64_t version_ = 0;
  bool valid_ = false;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_LOOKUP_MEMO_H_
