// Finding a non-finite value in a float buffer (the opt-in numerics check of the fused update).  TensorFlow-free.
#ifndef TF_EMBED_OPS_CC_LIB_NUMERICS_H_
#define TF_EMBED_OPS_CC_LIB_NUMERICS_H_

#include <cmath>
#include <cstdint>

namespace tf_embed_ops {

// Index of the first NaN or +-inf in data[0, n), or -1 when every value is finite.  The common case (all
// finite) is one branch-free pass per block: x - x is 0 for a finite x and NaN otherwise, so a block's sum of
// x - x is NaN exactly when the block holds a non-finite value; only such a block is searched element by element.
inline int64_t FirstNonFinite(const float* data, int64_t n) {
  constexpr int64_t kBlock = 1024;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = begin + kBlock < n ? begin + kBlock : n;
    float probe = 0.0f;
    for (int64_t i = begin; i < end; ++i) probe += data[i] - data[i];
    if (probe == 0.0f) continue;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(data[i])) return i;
    }
  }
  return -1;
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_NUMERICS_H_
