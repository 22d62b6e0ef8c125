// Gradient accumulation of one table for one step (spec §1.2, TEST `_compute_gradients_wrt_embedding_table`):
// every contribution  (w_i / norm_s) * dL/dact[s]  of every feature sharing the table is summed per row, and
// the optimizer then runs once per touched row with that sum.
//
// RowGradientPlan de-duplicates the rows with an open-addressing hash map sized by the number of ids (never by
// the vocabulary), and lists each unique row's contributions in a fixed order: by feature (the table's features
// in input order), then by position within the feature.  Accumulate() sums in exactly that order, so the sum
// of a row is bitwise reproducible whatever the thread count or the sharding of the unique rows, and no two
// workers ever touch the same row.
#ifndef TF_EMBED_OPS_CC_LIB_GRADIENT_ACCUMULATION_H_
#define TF_EMBED_OPS_CC_LIB_GRADIENT_ACCUMULATION_H_

#include <cstdint>
#include <vector>

#include "cc/lib/feature_layout.h"

namespace tf_embed_ops {

// One feature's gradient as seen by its table.  Ids must already be validated.
struct GradientSource {
  const int64_t* ids = nullptr;
  int64_t num_ids = 0;
  const FeatureLayout* layout = nullptr;
  const float* gradient = nullptr;  // row-major [layout->num_samples, dim]
};

// Reusable: Build() may be called again for the next step, keeping the buffers' capacity.
class RowGradientPlan {
 public:
  // Builds the plan over `sources` (kept by pointer: they must outlive Accumulate calls).
  void Build(const std::vector<GradientSource>* sources);

  int64_t num_rows() const { return static_cast<int64_t>(rows_.size()); }
  int64_t row(int64_t u) const { return rows_[u]; }

  // g[0, dim) = sum of the contributions to unique row u, in the plan's fixed order.
  void Accumulate(int64_t u, int64_t dim, float* g) const;

  // Unique-row indices u ordered by row id (for walking the whole table, as non-lazy Adam does).
  std::vector<int64_t> OrderByRow() const;

 private:
  struct Entry {
    int32_t source;
    int64_t position;
  };
  struct Bucket {
    int64_t row;  // -1 = empty (ids are validated non-negative)
    int64_t unique;
  };
  const std::vector<GradientSource>* sources_ = nullptr;
  // Scratch kept between Build calls so a reused plan allocates (and page-faults) nothing in steady state.
  std::vector<Bucket> buckets_;
  std::vector<int64_t> unique_of_, counts_, cursor_;
  std::vector<int64_t> rows_;     // unique rows, first-occurrence order
  std::vector<int64_t> offsets_;  // rows_.size() + 1
  std::vector<Entry> entries_;    // contributions grouped by unique row, (source, position) order inside
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_GRADIENT_ACCUMULATION_H_
