#include "cc/lib/vector_isa.h"

#include <cstdlib>
#include <cstring>

namespace tf_embed_ops {
namespace {

VectorIsa DetectRowLoopIsa() {
  const char* forced = std::getenv("TF_EMBED_OPS_ISA");
  if (forced != nullptr && std::strcmp(forced, "baseline") == 0) return VectorIsa::kBaseline;
#ifdef TF_EMBED_OPS_AVX2_CLONES
  // libgcc's CPU model checks both CPUID and that the OS saves the AVX state (XGETBV).
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return VectorIsa::kAvx2;
#endif
  return VectorIsa::kBaseline;
}

}  // namespace

VectorIsa RowLoopIsa() {
  static const VectorIsa isa = DetectRowLoopIsa();
  return isa;
}

}  // namespace tf_embed_ops
