// Row kernels of the sparse accumulator (cc/lib/sparse_accumulator.h), over lists of row pointers.
//
// Why separate: the accumulator is bound by memory traffic (every gradient row is read once, from DRAM), and
// a core keeps more of it in flight with wider loads, so the float and double kernels run with the widest
// vector ISA the CPU has, like the embedding row loops (cc/lib/vector_isa.h: an AVX2 copy chosen at run time,
// bitwise equal to the baseline one).  Other types use the generic templates.
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
