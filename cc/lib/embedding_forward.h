// The forward pass of one feature (docs/semantics.md, "Combiners"): for each sample s in [begin, end),
//   out[s] = sum over the sample's ids i (input order) of scale_i * Q(E[id_i]),
// where Q is simulated quantization when enabled (else the identity).  Samples are independent, so callers
// shard [0, num_samples) freely; the per-sample summation order is fixed, so the result does not depend on
// the sharding.  Ids must already be validated against the table.
#ifndef TF_EMBED_OPS_CC_LIB_EMBEDDING_FORWARD_H_
#define TF_EMBED_OPS_CC_LIB_EMBEDDING_FORWARD_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cc/lib/feature_layout.h"
#include "cc/lib/prefetch.h"
#include "cc/lib/simulated_quantization.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {

namespace internal {

// A stored element widened to fp32: float as is, or the uint16_t bits of a 16-bit table.
struct LoadFloat {
  float operator()(float x) const { return x; }
};
struct LoadBfloat16 {
  float operator()(uint16_t x) const { return Bfloat16ToFloat(x); }
};
struct LoadFloat16 {
  float operator()(uint16_t x) const { return Float16ToFloat(x); }
};

// CombineSampleRowRange over the ids grouped by sample, member(k) being the layout's member k (a template, so a
// ragged layout's identity costs no load).
template <typename Member, typename RowOf, typename Load>
inline void CombineGroupedSamples(const FeatureLayout& layout, const Member& member, const RowOf& row_of, int64_t dim,
                                  const Quantizer* quantizer, int64_t begin, int64_t end, float* out, Load load) {
  using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(row_of(int64_t{0}))>>;
  // PrefetchRow counts floats.
  const int64_t prefetch_floats = (dim * static_cast<int64_t>(sizeof(Elem)) + 3) / 4;
  // Members are stored sample by sample, so the member kPrefetchDistance places ahead in [begin, end)'s members is
  // the one read that many rows later: every row of a bag is requested ahead, not only each sample's first.
  const int64_t members_end = layout.member_offsets[end];
  const float* const scale = layout.ScaleOrNull();
  auto prefetch_member = [&](int64_t k) {
    if (k + kPrefetchDistance < members_end) {
      PrefetchRow<false>(reinterpret_cast<const float*>(row_of(member(k + kPrefetchDistance))), prefetch_floats);
    }
  };
  for (int64_t s = begin; s < end; ++s) {
    float* o = out + s * dim;
    const int64_t first = layout.member_offsets[s], last = layout.member_offsets[s + 1];
    if (last - first == 1 && quantizer == nullptr) {
      // One id per sample (dense input, sequence positions): a scaled copy (same value as 0 + c*x).
      prefetch_member(first);
      const int64_t i = member(first);
      const float c = scale == nullptr ? 1.0f : scale[i];
      const Elem* row = row_of(i);
      for (int64_t d = 0; d < dim; ++d) o[d] = c * load(row[d]);
      continue;
    }
    std::memset(o, 0, sizeof(float) * dim);
    for (int64_t k = first; k < last; ++k) {
      prefetch_member(k);
      const int64_t i = member(k);
      const float c = scale == nullptr ? 1.0f : scale[i];
      const Elem* row = row_of(i);
      if (quantizer == nullptr) {
        for (int64_t d = 0; d < dim; ++d) o[d] += c * load(row[d]);
      } else {
        for (int64_t d = 0; d < dim; ++d) o[d] += c * (*quantizer)(load(row[d]));
      }
    }
  }
}

// row_of(i): the row id i of the feature reads (a pointer to `dim` stored elements: float, or 16-bit bits);
// `load` widens one element to fp32.
template <typename RowOf, typename Load = LoadFloat>
inline void CombineSampleRowRange(const FeatureLayout& layout, const RowOf& row_of, int64_t dim,
                                  const Quantizer* quantizer, int64_t begin, int64_t end, float* out,
                                  Load load = Load()) {
  using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(row_of(int64_t{0}))>>;
  // PrefetchRow counts floats.
  const int64_t prefetch_floats = (dim * static_cast<int64_t>(sizeof(Elem)) + 3) / 4;
  auto prefetch = [&](int64_t i) { PrefetchRow<false>(reinterpret_cast<const float*>(row_of(i)), prefetch_floats); };
  if (layout.one_id_per_sample) {
    // Sample s is id s: a scaled copy (the same value as the general path's 0 + c * x, which is kept with
    // quantization only, where it is not a plain copy).
    const float* const scale = layout.ScaleOrNull();
    for (int64_t s = begin; s < end; ++s) {
      if (s + kPrefetchDistance < end) prefetch(s + kPrefetchDistance);
      const float c = scale == nullptr ? 1.0f : scale[s];
      const Elem* row = row_of(s);
      float* o = out + s * dim;
      if (quantizer == nullptr) {
        for (int64_t d = 0; d < dim; ++d) o[d] = c * load(row[d]);
      } else {
        for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f + c * (*quantizer)(load(row[d]));
      }
    }
    return;
  }
  if (layout.members_in_input_order) {
    CombineGroupedSamples(layout, [](int64_t k) { return k; }, row_of, dim, quantizer, begin, end, out, load);
  } else {
    const int64_t* members = layout.members.data();
    CombineGroupedSamples(
        layout, [members](int64_t k) { return members[k]; }, row_of, dim, quantizer, begin, end, out, load);
  }
}

// A row-major table: row_of(i) = table + ids[i] * dim.
template <typename Elem, typename Load = LoadFloat>
inline void CombineSampleRange(const FeatureLayout& layout, const int64_t* ids, const Elem* table, int64_t dim,
                               const Quantizer* quantizer, int64_t begin, int64_t end, float* out, Load load = Load()) {
  const auto row_of = [ids, table, dim](int64_t i) { return table + ids[i] * dim; };
  CombineSampleRowRange(layout, row_of, dim, quantizer, begin, end, out, load);
}

}  // namespace internal

// `table` is row-major [vocabulary_size, dim]; `out` is row-major [num_samples, dim].  `quantizer` may be null.
inline void CombineSamples(const FeatureLayout& layout, const int64_t* ids, const float* table, int64_t dim,
                           const Quantizer* quantizer, int64_t begin, int64_t end, float* out) {
  RunWithRowLoopIsa([&] {
    internal::CombineSampleRange(layout, ids, table, dim, quantizer, begin, end, out, internal::LoadFloat());
  });
}

// A 16-bit table (`type` bfloat16 or float16, `table` its bits): the rows are widened to fp32 as they are read,
// so the activations are fp32 and equal those of an fp32 table holding the same (exactly representable) values.
inline void CombineSamples(const FeatureLayout& layout, const int64_t* ids, StorageType type, const uint16_t* table,
                           int64_t dim, const Quantizer* quantizer, int64_t begin, int64_t end, float* out) {
  RunWithRowLoopIsa([&] {
    if (type == StorageType::kBfloat16) {
      internal::CombineSampleRange(layout, ids, table, dim, quantizer, begin, end, out, internal::LoadBfloat16());
    } else {
      internal::CombineSampleRange(layout, ids, table, dim, quantizer, begin, end, out, internal::LoadFloat16());
    }
  });
}

// The same for rows that are not one array (dynamic tables' chunked arenas): row_of(i) is the fp32 row id i of
// the feature reads, e.g. a row of zeros for a key without a row.
template <typename RowOf>
inline void CombineSampleRows(const FeatureLayout& layout, const RowOf& row_of, int64_t dim, const Quantizer* quantizer,
                              int64_t begin, int64_t end, float* out) {
  RunWithRowLoopIsa([&] { internal::CombineSampleRowRange(layout, row_of, dim, quantizer, begin, end, out); });
}

// 16-bit rows that are not one array: row_of(i) points at the `type` bits (bfloat16 or float16) of row id i.
template <typename RowOf>
inline void CombineSampleRows(const FeatureLayout& layout, StorageType type, const RowOf& row_of, int64_t dim,
                              const Quantizer* quantizer, int64_t begin, int64_t end, float* out) {
  RunWithRowLoopIsa([&] {
    if (type == StorageType::kBfloat16) {
      internal::CombineSampleRowRange(layout, row_of, dim, quantizer, begin, end, out, internal::LoadBfloat16());
    } else {
      internal::CombineSampleRowRange(layout, row_of, dim, quantizer, begin, end, out, internal::LoadFloat16());
    }
  });
}

// Rows of any storage and type, as every kind of table gives them: row_address(i) is the address of the row id i
// reads, `dim` elements of `type` (float, or the bits of a 16-bit type).  The type is dispatched once per call.
template <typename RowAddress>
inline void CombineFeatureRows(const FeatureLayout& layout, StorageType type, const RowAddress& row_address,
                               int64_t dim, const Quantizer* quantizer, int64_t begin, int64_t end, float* out) {
  if (type == StorageType::kFloat32) {
    const auto row_of = [&row_address](int64_t i) { return static_cast<const float*>(row_address(i)); };
    CombineSampleRows(layout, row_of, dim, quantizer, begin, end, out);
  } else {
    const auto row_of = [&row_address](int64_t i) { return static_cast<const uint16_t*>(row_address(i)); };
    CombineSampleRows(layout, type, row_of, dim, quantizer, begin, end, out);
  }
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_EMBEDDING_FORWARD_H_
