// Forward-only simulated quantization of a gathered table element (docs/semantics.md, "Simulated quantization"):
//   x = clip(v, lo, hi);  q = (hi - lo) / (N - 1);  out = floor((x - lo) / q + 0.5) * q + lo.
// Storage stays float32 and the backward pass is straight-through (gradients ignore it).
#ifndef TF_EMBED_OPS_CC_LIB_SIMULATED_QUANTIZATION_H_
#define TF_EMBED_OPS_CC_LIB_SIMULATED_QUANTIZATION_H_

#include <algorithm>
#include <cmath>

#include "cc/lib/embedding_config.h"

namespace tf_embed_ops {

class Quantizer {
 public:
  explicit Quantizer(const SimulatedQuantization& q)
      : lower_(q.lower), upper_(q.upper), step_((q.upper - q.lower) / static_cast<float>(q.num_buckets - 1)) {}

  float operator()(float v) const {
    const float x = std::min(std::max(v, lower_), upper_);
    return std::floor((x - lower_) / step_ + 0.5f) * step_ + lower_;
  }

 private:
  float lower_, upper_, step_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_SIMULATED_QUANTIZATION_H_
