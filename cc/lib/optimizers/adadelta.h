// Adadelta, as TensorFlow's ApplyAdadelta (core/kernels/training_ops.cc):
//   a = rho * a + (1 - rho) * g^2;   u = sqrt(upd + eps) / sqrt(a + eps) * g
//   upd = rho * upd + (1 - rho) * u^2;   w -= lr * u
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADADELTA_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADADELTA_H_

#include <array>
#include <cmath>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct Adadelta {
  static constexpr const char* kName = "adadelta";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"accumulators", 0.0f}, {"updates", 0.0f}}};

  float rho = 0.0f;
  float epsilon = 0.0f;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("rho", rho);
    visit("epsilon", epsilon);
  }

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    float* a = slots[0];
    float* upd = slots[1];
    for (int64_t i = 0; i < dim; ++i) {
      a[i] = a[i] * rho + g[i] * g[i] * (1.0f - rho);
      const float u = std::sqrt(upd[i] + epsilon) / std::sqrt(a[i] + epsilon) * g[i];
      upd[i] = upd[i] * rho + u * u * (1.0f - rho);
      w[i] -= u * lr;
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADADELTA_H_
