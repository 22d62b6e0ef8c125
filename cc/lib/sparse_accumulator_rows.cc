#include "cc/lib/sparse_accumulator_rows.h"

#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {
namespace {

template <typename T>
inline void AddRowsImpl(T* const* dst_rows, const T* const* src_rows, int64_t rows, int64_t width) {
  for (int64_t k = 0; k < rows; ++k) {
    T* __restrict dst = dst_rows[k];
    const T* __restrict src = src_rows[k];
    for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
  }
}

}  // namespace

void AddRows(float* const* dst_rows, const float* const* src_rows, int64_t rows, int64_t width) {
  RunWithRowLoopIsa([&] { AddRowsImpl(dst_rows, src_rows, rows, width); });
}

void AddRows(double* const* dst_rows, const double* const* src_rows, int64_t rows, int64_t width) {
  RunWithRowLoopIsa([&] { AddRowsImpl(dst_rows, src_rows, rows, width); });
}

}  // namespace tf_embed_ops
