// The forward pass of one feature (docs/semantics.md, "Combiners"): for each sample s in [begin, end),
//   out[s] = sum over the sample's ids i (input order) of scale_i * Q(E[id_i]),
// where Q is simulated quantization when enabled (else the identity).  Samples are independent, so callers
// shard [0, num_samples) freely; the per-sample summation order is fixed, so the result does not depend on
// the sharding.  Ids must already be validated against the table.
#ifndef TF_EMBED_OPS_CC_LIB_EMBEDDING_FORWARD_H_
#define TF_EMBED_OPS_CC_LIB_EMBEDDING_FORWARD_H_

#include <cstdint>
#include <cstring>

#include "cc/lib/feature_layout.h"
#include "cc/lib/prefetch.h"
#include "cc/lib/simulated_quantization.h"
#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {

namespace internal {

// row_of(i): the row id i of the feature reads (a pointer to `dim` floats).
template <typename RowOf>
inline void CombineSampleRowRange(const FeatureLayout& layout, const RowOf& row_of, int64_t dim,
                                  const Quantizer* quantizer, int64_t begin, int64_t end, float* out) {
  if (layout.one_id_per_sample) {
    // Sample s is id s: a scaled copy (the same value as the general path's 0 + c * x, which is kept with
    // quantization only, where it is not a plain copy).
    for (int64_t s = begin; s < end; ++s) {
      if (s + kPrefetchDistance < end) PrefetchRow<false>(row_of(s + kPrefetchDistance), dim);
      const float c = layout.scale[s];
      const float* row = row_of(s);
      float* o = out + s * dim;
      if (quantizer == nullptr) {
        for (int64_t d = 0; d < dim; ++d) o[d] = c * row[d];
      } else {
        for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f + c * (*quantizer)(row[d]);
      }
    }
    return;
  }
  for (int64_t s = begin; s < end; ++s) {
    const int64_t ahead = s + kPrefetchDistance;
    if (ahead < end && layout.member_offsets[ahead] < layout.member_offsets[ahead + 1]) {
      PrefetchRow<false>(row_of(layout.members[layout.member_offsets[ahead]]), dim);
    }
    float* o = out + s * dim;
    const int64_t first = layout.member_offsets[s], last = layout.member_offsets[s + 1];
    if (last - first == 1 && quantizer == nullptr) {
      // One id per sample (dense input, sequence positions): a scaled copy (same value as 0 + c*x).
      const int64_t i = layout.members[first];
      const float c = layout.scale[i];
      const float* row = row_of(i);
      for (int64_t d = 0; d < dim; ++d) o[d] = c * row[d];
      continue;
    }
    std::memset(o, 0, sizeof(float) * dim);
    for (int64_t k = first; k < last; ++k) {
      const int64_t i = layout.members[k];
      const float c = layout.scale[i];
      const float* row = row_of(i);
      if (quantizer == nullptr) {
        for (int64_t d = 0; d < dim; ++d) o[d] += c * row[d];
      } else {
        for (int64_t d = 0; d < dim; ++d) o[d] += c * (*quantizer)(row[d]);
      }
    }
  }
}

// A row-major table: row_of(i) = table + ids[i] * dim.
inline void CombineSampleRange(const FeatureLayout& layout, const int64_t* ids, const float* table, int64_t dim,
                               const Quantizer* quantizer, int64_t begin, int64_t end, float* out) {
  const auto row_of = [ids, table, dim](int64_t i) { return table + ids[i] * dim; };
  CombineSampleRowRange(layout, row_of, dim, quantizer, begin, end, out);
}

}  // namespace internal

// `table` is row-major [vocabulary_size, dim]; `out` is row-major [num_samples, dim].  `quantizer` may be null.
inline void CombineSamples(const FeatureLayout& layout, const int64_t* ids, const float* table, int64_t dim,
                           const Quantizer* quantizer, int64_t begin, int64_t end, float* out) {
  RunWithRowLoopIsa([&] { internal::CombineSampleRange(layout, ids, table, dim, quantizer, begin, end, out); });
}

// The same for rows that are not one array (dynamic tables' chunked arenas): row_of(i) is the row id i of the
// feature reads, e.g. a row of zeros for a key without a row.
template <typename RowOf>
inline void CombineSampleRows(const FeatureLayout& layout, const RowOf& row_of, int64_t dim, const Quantizer* quantizer,
                              int64_t begin, int64_t end, float* out) {
  RunWithRowLoopIsa([&] { internal::CombineSampleRowRange(layout, row_of, dim, quantizer, begin, end, out); });
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_EMBEDDING_FORWARD_H_
