// Row kernels of the sparse accumulator (cc/lib/sparse_accumulator.h), over lists of row pointers.
//
// Why separate: the accumulator is bound by memory traffic (every gradient row is read once, from DRAM), and
// a core keeps more of it in flight with wider loads, so on x86-64 the float and double kernels are compiled
// for AVX-512, AVX2 and the baseline, and the loader picks the best the CPU has (GCC/clang target_clones,
// resolved once at load time).  The package itself is built for the baseline ISA, as TensorFlow is.  The
// element-wise operations are the same in every variant (no reassociation, no FMA), so results are bitwise
// identical whichever runs.  Other types use the generic templates.
#ifndef TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_ROWS_H_
#define TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_ROWS_H_

#include <cstdint>

namespace tf_embed_ops {

// dst_rows[k][j] += src_rows[k][j] for k < rows, j < width.  A destination row must not overlap any source row.
template <typename T>
void AddRows(T* const* dst_rows, const T* const* src_rows, int64_t rows, int64_t width) {
  for (int64_t k = 0; k < rows; ++k) {
    T* dst = dst_rows[k];
    const T* src = src_rows[k];
    for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
  }
}
void AddRows(float* const* dst_rows, const float* const* src_rows, int64_t rows, int64_t width);
void AddRows(double* const* dst_rows, const double* const* src_rows, int64_t rows, int64_t width);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_ROWS_H_
