// RMSProp, as TensorFlow's ApplyRMSProp (core/kernels/training_ops.cc), which the TPU proto links to:
//   ms += (g^2 - ms) * (1 - rho);   mom = momentum * mom + lr * g / sqrt(ms + epsilon);   w -= mom
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_RMS_PROP_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_RMS_PROP_H_

#include <array>
#include <cmath>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct RmsProp : ElementWiseOptimizer<RmsProp> {
  static constexpr const char* kName = "rms_prop";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"ms", 1.0f}, {"mom", 0.0f}}};

  float rho = 0.0f;
  float momentum = 0.0f;
  float epsilon = 0.0f;

  auto HyperParameters() const { return std::tie(rho, momentum, epsilon); }

  void UpdateElement(float lr, const float& g, float& w, float& ms, float& mom) const {
    ms += (g * g - ms) * (1.0f - rho);
    mom = mom * momentum + lr * g / std::sqrt(ms + epsilon);
    w -= mom;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_RMS_PROP_H_
