// Proximal Adagrad, as TensorFlow's ApplyProximalAdagrad (core/kernels/training_ops.cc):
//   a += g^2;  eta = lr / sqrt(a);  x = w - eta * g
//   w = sign(x) * max(|x| - eta * l1, 0) / (1 + eta * l2)      (l1 > 0)
//   w = x / (1 + eta * l2)                                     (l1 == 0)
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_ADAGRAD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_ADAGRAD_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct ProximalAdagrad : ElementWiseOptimizer<ProximalAdagrad> {
  static constexpr const char* kName = "proximal_adagrad";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"accumulators", 0.1f}}};

  float l1 = 0.0f;
  float l2 = 0.0f;

  auto HyperParameters() const { return std::tie(l1, l2); }

  void UpdateElement(float lr, const float& g, float& w, float& a) const {
    a += g * g;
    const float eta = lr / std::sqrt(a);
    const float x = w - eta * g;
    if (l1 > 0.0f) {
      const float sign = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
      w = sign * std::max(std::fabs(x) - eta * l1, 0.0f) / (1.0f + eta * l2);
    } else {
      w = x / (1.0f + eta * l2);
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_ADAGRAD_H_
