// Momentum, as TensorFlow's ApplyMomentum (core/kernels/training_ops.cc), which the TPU proto links to:
//   m = momentum * m + g;   w -= lr * m,   or with Nesterov   w -= lr * g + lr * momentum * m
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_MOMENTUM_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_MOMENTUM_H_

#include <array>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Momentum : ElementWiseOptimizer<Momentum> {
  static constexpr const char* kName = "momentum";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"momenta", 0.0f}}};

  float momentum = 0.0f;
  bool use_nesterov = false;

  auto HyperParameters() const { return std::tie(momentum, use_nesterov); }

  void UpdateElement(float lr, const float& g, float& w, float& m) const {
    m = momentum * m + g;
    w -= use_nesterov ? g * lr + m * momentum * lr : m * lr;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_MOMENTUM_H_
