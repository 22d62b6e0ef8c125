// Gradient accumulation of one table for one step (docs/semantics.md, "Gradient accumulation"):
// every contribution  (w_i / norm_s) * dL/dact[s]  of every feature sharing the table is summed per row, and
// the optimizer then runs once per touched row with that sum.
//
// RowGradientPlan de-duplicates the rows either with an open-addressing hash map sized by the number of ids, or,
// when the caller gives a static table's vocabulary and it is small next to the step's ids (UsesDenseIndex), with
// a dense row -> unique-index array: one load and at most one store per id and no probing; only the touched
// entries are reset after Build, so a step never costs O(vocabulary).  Both give the same first-occurrence order
// of the unique rows.  The plan lists each unique row's contributions in a fixed order: by feature (the table's
// features in input order), then by position within the feature.  Accumulate() sums in exactly that order, so the sum
// of a row is bitwise reproducible whatever the thread count or the sharding of the unique rows, and no two
// workers ever touch the same row.
//
// Build can also sum every row's gradient in its one pass over the ids (a `sum_dim`): the ids are then read in
// input order, the gradient rows sequentially, and the walk copies a finished sum instead of gathering its
// contributions from scattered samples.  That pass is serial, so it suits a walk on one thread; the sums are the
// same contributions added in the same order, bitwise the gathered ones.
#ifndef TF_EMBED_OPS_CC_LIB_GRADIENT_ACCUMULATION_H_
#define TF_EMBED_OPS_CC_LIB_GRADIENT_ACCUMULATION_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/lib/feature_layout.h"
#include "cc/lib/prefetch.h"

namespace tf_embed_ops {

// One feature's gradient as seen by its table.  Ids must already be validated; a negative id (a dynamic
// table's key without a row) contributes nothing.
struct GradientSource {
  const int64_t* ids = nullptr;
  int64_t num_ids = 0;
  const FeatureLayout* layout = nullptr;
  const float* gradient = nullptr;  // row-major [layout->num_samples, dim]
};

// The output sample of a source's id i.
inline int64_t SampleOf(const FeatureLayout& layout, int64_t i) {
  return layout.one_id_per_sample ? i : layout.sample_of[i];
}

// Reusable: Build() may be called again for the next step, keeping the buffers' capacity.
class RowGradientPlan {
 public:
  static constexpr int64_t kMaxIds = (int64_t{1} << 31) - 1;  // unique-row indices are int32

  // The dense index is used when the vocabulary is at most kDenseIdsFactor x the step's ids (its int32 array
  // then weighs at most 4 x 64 = 256 bytes per id, a few times the hash map's 32-64, and the first step's fill
  // is amortised over few steps) and at most kMaxDenseVocabulary rows (64 MiB per plan, whatever the batch).
  static constexpr int64_t kDenseIdsFactor = 64;
  static constexpr int64_t kMaxDenseVocabulary = int64_t{1} << 24;
  static bool UsesDenseIndex(int64_t vocabulary_size, int64_t num_ids) {
    return vocabulary_size > 0 && vocabulary_size <= kMaxDenseVocabulary &&
           vocabulary_size <= kDenseIdsFactor * num_ids;
  }

  // The most floats of summed gradients a plan holds (64 MiB); a larger step gathers in the walk instead.
  static constexpr int64_t kMaxSummedFloats = int64_t{1} << 24;

  // Builds the plan over `sources` (kept by pointer: they must outlive Accumulate calls), which may hold at
  // most kMaxIds ids in all.  `vocabulary_size` > 0 says every non-negative id is < vocabulary_size (a static
  // table's validated ids, or a dynamic table's row bound) and allows the dense index; 0 always hashes.
  // `sum_dim` > 0 (the gradients' width) sums each row's gradient during the build, unless the step's ids times
  // sum_dim exceed kMaxSummedFloats; 0 leaves the summing to Accumulate.
  void Build(const std::vector<GradientSource>* sources, int64_t vocabulary_size = 0, int64_t sum_dim = 0);

  // Whether the last Build summed the gradients (Accumulate then copies them).
  bool summed() const { return summed_dim_ > 0; }

  int64_t num_rows() const { return num_rows_; }
  int64_t row(int64_t u) const { return rows_[u]; }
  // Contributions to unique rows [0, u): Accumulate(u) sums contributions(u + 1) - contributions(u) rows.
  int64_t contributions(int64_t u) const { return offsets_[u]; }

  // g[0, dim) = sum of the contributions to unique row u, in the plan's fixed order.  Inline: the row loops
  // that call it are compiled per vector ISA (vector_isa.h) and must inline it to vectorise it.  After a summing
  // Build, dim must be its sum_dim.
  void Accumulate(int64_t u, int64_t dim, float* g) const;
  // Unique row u's summed gradient, dim floats: after a summing Build the plan's own sum (no copy), else
  // Accumulate's into `scratch` (dim floats), which is returned.  Valid until the next Build.
  const float* Gradient(int64_t u, int64_t dim, float* scratch) const {
    if (summed_dim_ > 0) return sums_.data() + u * dim;
    Accumulate(u, dim, scratch);
    return scratch;
  }

  // Unique-row indices u ordered by row id (for walking the whole table, as non-lazy Adam does).
  std::vector<int64_t> OrderByRow() const;

 private:
  struct Entry {
    int32_t source;
    int32_t position;  // < kMaxIds
  };
  // A hash bucket holds its key next to its value, so a probe reads one cache line with no dependent load.
  static constexpr int64_t kEmptyRow = -1;  // negative ids never enter the map
  struct Bucket {
    int64_t row;
    int32_t unique;
  };
  // First pass of Build (unique rows, their counts, and either each id's unique index for the counting sort or,
  // with kSum, each row's gradient sum): returns the number of contributions (non-negative ids).
  template <bool kSum>
  int64_t IndexByHash(int64_t total);
  template <bool kSum>
  int64_t IndexByDenseArray(int64_t vocabulary_size);

  const std::vector<GradientSource>* sources_ = nullptr;
  // Scratch kept between Build calls so a reused plan allocates (and page-faults) nothing in steady state.
  std::vector<Bucket> buckets_;
  std::vector<int32_t> dense_;  // row -> unique index, -1 between Builds (grown on demand, never shrunk)
  std::vector<int32_t> unique_of_, counts_;
  std::vector<int64_t> cursor_;
  int64_t num_rows_ = 0;
  std::vector<int64_t> rows_;     // unique rows in first-occurrence order: the first num_rows_ entries
  std::vector<int64_t> offsets_;  // num_rows_ + 1
  std::vector<Entry> entries_;    // contributions grouped by unique row, (source, position) order inside
  int64_t summed_dim_ = 0;        // > 0: the last Build summed, and sums_ holds [num_rows_, summed_dim_]
  std::vector<float> sums_;
};

inline void RowGradientPlan::Accumulate(int64_t u, int64_t dim, float* g) const {
  if (summed_dim_ > 0) {
    std::memcpy(g, sums_.data() + u * dim, sizeof(float) * dim);
    return;
  }
  std::memset(g, 0, sizeof(float) * dim);
  const int64_t num_entries = static_cast<int64_t>(entries_.size());
  for (int64_t k = offsets_[u]; k < offsets_[u + 1]; ++k) {
    if (k + kPrefetchDistance < num_entries) {
      // Next rows' gradients: entries are contiguous across unique rows, so this also covers row u + 1.
      const Entry& ahead = entries_[k + kPrefetchDistance];
      const GradientSource& a = (*sources_)[ahead.source];
      PrefetchRow<false>(a.gradient + SampleOf(*a.layout, ahead.position) * dim, dim);
    }
    const GradientSource& s = (*sources_)[entries_[k].source];
    const int64_t i = entries_[k].position;
    const float c = s.layout->Scale(i);
    const float* dact = s.gradient + SampleOf(*s.layout, i) * dim;
    for (int64_t d = 0; d < dim; ++d) g[d] += c * dact[d];
  }
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_GRADIENT_ACCUMULATION_H_
