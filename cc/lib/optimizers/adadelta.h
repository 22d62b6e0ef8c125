// Adadelta, as TensorFlow's ApplyAdadelta (core/kernels/training_ops.cc):
//   a = rho * a + (1 - rho) * g^2;   u = sqrt(upd + eps) / sqrt(a + eps) * g
//   upd = rho * upd + (1 - rho) * u^2;   w -= lr * u
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADADELTA_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADADELTA_H_

#include <array>
#include <cmath>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Adadelta : ElementWiseOptimizer<Adadelta> {
  static constexpr const char* kName = "adadelta";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"accumulators", 0.0f}, {"updates", 0.0f}}};

  float rho = 0.0f;
  float epsilon = 0.0f;

  auto HyperParameters() const { return std::tie(rho, epsilon); }

  void UpdateElement(float lr, const float& g, float& w, float& a, float& upd) const {
    a = a * rho + g * g * (1.0f - rho);
    const float u = std::sqrt(upd + epsilon) / std::sqrt(a + epsilon) * g;
    upd = upd * rho + u * u * (1.0f - rho);
    w -= u * lr;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADADELTA_H_
