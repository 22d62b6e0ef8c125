// Eviction policies of dynamic tables (docs/dynamic_tables_internals.md, "Eviction"): one sweep over the rows, two
// kinds of rule.
//   * Threshold rules (TTL, L2 norm, count and age) decide per row: the row goes when it fails the rule.
//   * Capacity rules (LRU, LFU, decayed LFU, a user score) give each row a score and keep the target_rows rows of
//     highest score; the order is total, (score, then last step, then key), so the victims never depend on where
//     the rows are stored or on threads.
// The table runs the sweep (dynamic_table_eviction.cc); this header holds the per-row rules and the selection.
#ifndef TF_EMBED_OPS_CC_LIB_EVICTION_POLICY_H_
#define TF_EMBED_OPS_CC_LIB_EVICTION_POLICY_H_

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace tf_embed_ops {

enum class EvictionPolicy { kNone, kLru, kLfu, kTtl, kL2Norm, kDecayedLfu, kCountAndAge };

// kLru / kLfu / kDecayedLfu: shrink to at most `target_rows` rows, evicting the lowest scores: last step (LRU),
// count (LFU), decayed count (decayed LFU: every eviction round multiplies each row's decayed count by `decay` in
// (0, 1] and adds the sightings since the previous round).  Ties: older last step, then smaller key.
// kTtl: evict every row not seen in the last `ttl_steps` steps (step - last_step > ttl_steps).
// kL2Norm: evict every row whose weights' L2 norm is < `min_norm`.
// kCountAndAge: evict every row that is both rare (count < `min_count`) and stale (step - last_step >
// `ttl_steps`).
struct EvictionOptions {
  EvictionPolicy policy = EvictionPolicy::kNone;
  int64_t target_rows = 0;
  int64_t ttl_steps = 0;
  double min_norm = 0.0;
  double decay = 1.0;
  int64_t min_count = 0;
};

inline bool IsCapacityPolicy(EvictionPolicy p) {
  return p == EvictionPolicy::kLru || p == EvictionPolicy::kLfu || p == EvictionPolicy::kDecayedLfu;
}

// A row's place in a capacity policy's order: lower goes first.
struct ScoredRow {
  double score;
  int64_t last_step;
  int64_t key;
  int64_t row;
  bool operator<(const ScoredRow& o) const {
    return std::tie(score, last_step, key) < std::tie(o.score, o.last_step, o.key);
  }
};

// The rows of the `excess` lowest entries, sorted by row (so the free list, and the rows later keys get, do not
// depend on nth_element).  Reorders `scored`.
inline std::vector<int64_t> LowestRows(std::vector<ScoredRow>* scored, int64_t excess) {
  std::vector<int64_t> victims;
  if (excess <= 0) return victims;
  excess = std::min<int64_t>(excess, static_cast<int64_t>(scored->size()));
  std::nth_element(scored->begin(), scored->begin() + (excess - 1), scored->end());
  victims.reserve(excess);
  for (int64_t i = 0; i < excess; ++i) victims.push_back((*scored)[i].row);
  std::sort(victims.begin(), victims.end());
  return victims;
}

// The k lowest rows of a stream (k >= 1), kept in a bounded max-heap: when few rows go (the usual round of a
// capacity policy), the sweep keeps k entries instead of scoring every row into a vector and selecting.  The
// order is total, so the set is the same as LowestRows'.
class LowestK {
 public:
  explicit LowestK(int64_t k) : k_(k) { heap_.reserve(k); }
  void Offer(const ScoredRow& r) {
    if (static_cast<int64_t>(heap_.size()) < k_) {
      heap_.push_back(r);
      std::push_heap(heap_.begin(), heap_.end());
    } else if (r < heap_.front()) {
      std::pop_heap(heap_.begin(), heap_.end());
      heap_.back() = r;
      std::push_heap(heap_.begin(), heap_.end());
    }
  }
  // The rows kept, sorted by row.
  std::vector<int64_t> Rows() const {
    std::vector<int64_t> rows;
    rows.reserve(heap_.size());
    for (const ScoredRow& r : heap_) rows.push_back(r.row);
    std::sort(rows.begin(), rows.end());
    return rows;
  }

 private:
  int64_t k_;
  std::vector<ScoredRow> heap_;
};

// The squared L2 norm of a row, in double (the threshold compares sqrt of it with min_norm).  Eight independent
// partial sums, added in a fixed order at the end, so the compiler keeps them in vector registers; the result is
// deterministic and differs from a sequential sum only in the last bits of a double.
inline double SquaredNorm(const float* w, int64_t dim) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(w[j + k]) * w[j + k];
  }
  double s = 0.0;
  for (; j < dim; ++j) s += static_cast<double>(w[j]) * w[j];
  for (int k = 0; k < 8; ++k) s += acc[k];
  return s;
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_EVICTION_POLICY_H_
