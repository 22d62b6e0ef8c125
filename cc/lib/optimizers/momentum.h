// Momentum, as TensorFlow's ApplyMomentum (core/kernels/training_ops.cc), which the TPU proto links to:
//   m = momentum * m + g;   w -= lr * m,   or with Nesterov   w -= lr * g + lr * momentum * m
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_MOMENTUM_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_MOMENTUM_H_

#include <array>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct Momentum {
  static constexpr const char* kName = "momentum";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"momenta", 0.0f}}};

  float momentum = 0.0f;
  bool use_nesterov = false;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("momentum", momentum);
    visit("use_nesterov", use_nesterov);
  }

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    float* m = slots[0];
    for (int64_t i = 0; i < dim; ++i) {
      m[i] = momentum * m[i] + g[i];
      w[i] -= use_nesterov ? g[i] * lr + m[i] * momentum * lr : m[i] * lr;
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_MOMENTUM_H_
