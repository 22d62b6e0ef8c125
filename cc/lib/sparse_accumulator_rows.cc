#include "cc/lib/sparse_accumulator_rows.h"

// Function multi-versioning needs ifunc support (ELF, glibc) and a compiler that clones non-template functions.
#if defined(__x86_64__) && defined(__ELF__) && \
    ((defined(__clang__) && __clang_major__ >= 14) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 6))
#define TF_EMBED_ROW_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TF_EMBED_ROW_KERNEL
#endif

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

TF_EMBED_ROW_KERNEL void AddRows(float* const* dst_rows, const float* const* src_rows, int64_t rows, int64_t width) {
  AddRowsImpl(dst_rows, src_rows, rows, width);
}

TF_EMBED_ROW_KERNEL void AddRows(double* const* dst_rows, const double* const* src_rows, int64_t rows, int64_t width) {
  AddRowsImpl(dst_rows, src_rows, rows, width);
}

}  // namespace tf_embed_ops
