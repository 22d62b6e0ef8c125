// Runtime choice of the vector instruction set for the row loops (forward gather/combine, gradient
// accumulation, optimizer row updates, the sparse accumulator's row adds).
//
// The library is built for baseline x86-64 (SSE2) so one wheel runs on any machine, but those loops are a large
// share of a step and run about 20-25% faster with 256-bit AVX2 (benchmarks/results/REPORT.md).  So each loop is
// also compiled for AVX2 through RunWithRowLoopIsa: the callable is inlined ("flatten") into a copy of the call
// compiled with target("avx2"), chosen at run time when the CPU and the OS support AVX2.
//
// Both copies compute bitwise the same values: the loops are element-wise with a fixed summation order, the
// compiler does not re-associate (no -ffast-math), and FMA is NOT enabled, so no multiply-add is contracted
// into a single rounding.  tests/test_embedding_ops_isa.py checks this by forcing the baseline with
// TF_EMBED_OPS_ISA=baseline.
#ifndef TF_EMBED_OPS_CC_LIB_VECTOR_ISA_H_
#define TF_EMBED_OPS_CC_LIB_VECTOR_ISA_H_

namespace tf_embed_ops {

enum class VectorIsa { kBaseline, kAvx2 };

// The ISA the row loops use: AVX2 when available, unless the environment variable TF_EMBED_OPS_ISA is
// "baseline" (read once, at the first call).
VectorIsa RowLoopIsa();

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX2__)
#define TF_EMBED_OPS_AVX2_CLONES 1
namespace internal {
template <typename Fn>
__attribute__((target("avx2"), flatten)) void RunAvx2(const Fn& fn) {
  fn();
}
}  // namespace internal
#endif

// Runs fn() (a callable holding a row loop), compiled for the ISA of RowLoopIsa().
template <typename Fn>
inline void RunWithRowLoopIsa(const Fn& fn) {
#ifdef TF_EMBED_OPS_AVX2_CLONES
  if (RowLoopIsa() == VectorIsa::kAvx2) {
    internal::RunAvx2(fn);
    return;
  }
#endif
  fn();
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_VECTOR_ISA_H_
