// Proximal Adagrad, as TensorFlow's ApplyProximalAdagrad (core/kernels/training_ops.cc):
//   a += g^2;  eta = lr / sqrt(a);  x = w - eta * g
//   w = sign(x) * max(|x| - eta * l1, 0) / (1 + eta * l2)      (l1 > 0)
//   w = x / (1 + eta * l2)                                     (l1 == 0)
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_ADAGRAD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_ADAGRAD_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct ProximalAdagrad {
  static constexpr const char* kName = "proximal_adagrad";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"accumulators", 0.1f}}};

  float l1 = 0.0f;
  float l2 = 0.0f;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("l1", l1);
    visit("l2", l2);
  }

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    float* a = slots[0];
    for (int64_t i = 0; i < dim; ++i) {
      a[i] += g[i] * g[i];
      const float eta = lr / std::sqrt(a[i]);
      const float x = w[i] - eta * g[i];
      if (l1 > 0.0f) {
        const float sign = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
        w[i] = sign * std::max(std::fabs(x) - eta * l1, 0.0f) / (1.0f + eta * l2);
      } else {
        w[i] = x / (1.0f + eta * l2);
      }
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_ADAGRAD_H_
