// Centered RMSProp, as TensorFlow's ApplyCenteredRMSProp (core/kernels/training_ops.cc):
//   ms += (g^2 - ms) * (1 - rho);   mg += (g - mg) * (1 - rho)
//   mom = momentum * mom + lr * g / sqrt(ms - mg^2 + epsilon);   w -= mom
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_CENTERED_RMS_PROP_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_CENTERED_RMS_PROP_H_

#include <array>
#include <cmath>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct CenteredRmsProp : ElementWiseOptimizer<CenteredRmsProp> {
  static constexpr const char* kName = "centered_rms_prop";
  static constexpr std::array<SlotInfo, 3> kSlots = {{{"ms", 1.0f}, {"mom", 0.0f}, {"mg", 0.0f}}};

  float rho = 0.0f;
  float momentum = 0.0f;
  float epsilon = 0.0f;

  auto HyperParameters() const { return std::tie(rho, momentum, epsilon); }

  void UpdateElement(float lr, const float& g, float& w, float& ms, float& mom, float& mg) const {
    ms += (g * g - ms) * (1.0f - rho);
    mg += (g - mg) * (1.0f - rho);
    const float denom = ms - mg * mg + epsilon;
    mom = mom * momentum + lr * g / std::sqrt(denom);
    w -= mom;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_CENTERED_RMS_PROP_H_
