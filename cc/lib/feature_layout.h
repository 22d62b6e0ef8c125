// Where each id of a feature lands: the TPU enqueue's (sample_indices_or_row_splits, ids, weights) triple
// (docs/semantics.md, "Tables, features and input forms") resolved into per-id output samples and combiner
// factors, plus the sample -> ids grouping the
// forward pass walks.  TensorFlow-free; the kernels build one FeatureLayout per feature per call.
//
// Input forms (`splits_or_indices` with `splits_or_indices_rank`):
//   rank 0 (empty): every id is its own sample (dense input); num_ids must equal the number of samples.
//   rank 1: ragged row_splits, sample = row; splits[0] = 0, non-decreasing, splits[last] = num_ids, and there
//           are exactly num_samples + 1 splits.
//   rank 2: sparse indices [num_ids, cols], cols >= 1; sample = row-major position of indices[:, :-1] inside
//           sample_shape (the last column is the reduced one); cols - 1 must equal the rank of sample_shape and
//           each coordinate must lie inside it.
#ifndef TF_EMBED_OPS_CC_LIB_FEATURE_LAYOUT_H_
#define TF_EMBED_OPS_CC_LIB_FEATURE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cc/lib/combiner.h"

namespace tf_embed_ops {

// Borrowed views of one feature's inputs.
struct FeatureBatch {
  const int64_t* splits_or_indices = nullptr;
  int splits_or_indices_rank = 0;      // 0, 1 or 2 (see above)
  int64_t splits_or_indices_rows = 0;  // dim 0 of splits_or_indices
  int64_t splits_or_indices_cols = 0;  // dim 1 when rank 2
  const int64_t* ids = nullptr;
  int64_t num_ids = 0;
  const float* weights = nullptr;     // nullptr or num_ids entries
  int64_t num_weights = 0;            // 0 (all ones) or num_ids
  std::vector<int64_t> sample_shape;  // output shape without the embedding dimension
};

struct FeatureLayout {
  int64_t num_samples = 0;  // prod(sample_shape)
  // Dense input: id i is sample i.  sample_of, member_offsets and members are then left empty (the identity),
  // which spares building and reading three id-sized arrays on the common one-id-per-sample path.
  bool one_id_per_sample = false;
  // Ragged input lists each sample's ids together, in input order: members is then the identity and is left
  // empty (member k is id k).
  bool members_in_input_order = false;
  std::vector<int64_t> sample_of;  // per id: its output sample (built with LayoutParts::kSampleOf)
  std::vector<float> scale;        // per id: w_i / norm_s (0 where the norm is 0); empty when unit_scale
  // Every factor is 1 (unweighted input, with one id per sample or the sum combiner): scale is then left empty.
  bool unit_scale = false;
  // Ids grouped by sample, each group in input order (built with LayoutParts::kGrouping): ids of sample s are
  // Member(member_offsets[s]) .. Member(member_offsets[s + 1] - 1).
  std::vector<int64_t> member_offsets;
  std::vector<int64_t> members;
  int64_t Member(int64_t k) const { return members_in_input_order ? k : members[k]; }
  float Scale(int64_t i) const { return unit_scale ? 1.0f : scale[i]; }
  // scale's data, or null when every factor is 1: for loops that read it through a pointer.
  const float* ScaleOrNull() const { return unit_scale ? nullptr : scale.data(); }
  // Scratch of BuildFeatureLayout; a layout reused for the next step keeps every buffer's capacity.
  std::vector<int64_t> cursor;
};

// The most samples one feature may have per call.  Only sparse-indices input can ask for more samples than it
// has ids (sample_shape is a plain input there), and the layout keeps int64 bookkeeping per sample, so an
// absurd sample_shape must be refused before anything is sized by it.  2^31 - 1 is far beyond any batch.
inline constexpr int64_t kMaxSamples = (int64_t{1} << 31) - 1;

// Checks everything about `batch` that does not depend on the table, in one serial pass that neither allocates
// nor writes: sample_shape (non-negative, product without int64 overflow, at most kMaxSamples samples), the
// weights count, and the splits or indices completely (every row split in [0, num_ids], first 0,
// non-decreasing, last num_ids; every index coordinate inside sample_shape; sparse indices may come in any
// order: ids are grouped by sample with a stable sort).  On success `*num_samples` = prod(sample_shape).
// `label` names the feature in error messages, which also give the position and the value.
absl::Status ValidateFeatureBatch(const FeatureBatch& batch, const std::string& label, int64_t* num_samples);

// What a kernel reads of a layout beyond the factors (scale, built unless they are all 1): the forward pass walks
// the ids grouped by sample (member_offsets, members), the gradient accumulation each id's sample (sample_of).  A
// kernel builds only its part: on bags, each part is id-sized arrays written every call.
enum class LayoutParts { kGrouping = 1, kSampleOf = 2, kAll = 3 };

// Builds the layout of a batch that ValidateFeatureBatch accepted (with `num_samples` from it).  Indexes by
// the validated splits and indices without checking them again, so it must never see an unvalidated batch.
// The parts `parts` leaves out are left empty; sparse indices build both (their grouping is sorted by sample_of).
void BuildValidatedFeatureLayout(const FeatureBatch& batch, int64_t num_samples, Combiner combiner, FeatureLayout* out,
                                 LayoutParts parts = LayoutParts::kAll);

// ValidateFeatureBatch, then BuildValidatedFeatureLayout.
absl::Status BuildFeatureLayout(const FeatureBatch& batch, Combiner combiner, const std::string& label,
                                FeatureLayout* out);

// Every id in [0, vocabulary_size); the error names the feature, the position, the id and the range.
absl::Status ValidateIds(const int64_t* ids, int64_t num_ids, int64_t vocabulary_size, const std::string& label,
                         const std::string& table_name);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_FEATURE_LAYOUT_H_
