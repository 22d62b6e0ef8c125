// Centered RMSProp, as TensorFlow's ApplyCenteredRMSProp (core/kernels/training_ops.cc):
//   ms += (g^2 - ms) * (1 - rho);   mg += (g - mg) * (1 - rho)
//   mom = momentum * mom + lr * g / sqrt(ms - mg^2 + epsilon);   w -= mom
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_CENTERED_RMS_PROP_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_CENTERED_RMS_PROP_H_

#include <array>
#include <cmath>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct CenteredRmsProp {
  static constexpr const char* kName = "centered_rms_prop";
  static constexpr std::array<SlotInfo, 3> kSlots = {{{"ms", 1.0f}, {"mom", 0.0f}, {"mg", 0.0f}}};

  float rho = 0.0f;
  float momentum = 0.0f;
  float epsilon = 0.0f;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("rho", rho);
    visit("momentum", momentum);
    visit("epsilon", epsilon);
  }

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    float* ms = slots[0];
    float* mom = slots[1];
    float* mg = slots[2];
    for (int64_t i = 0; i < dim; ++i) {
      ms[i] += (g[i] * g[i] - ms[i]) * (1.0f - rho);
      mg[i] += (g[i] - mg[i]) * (1.0f - rho);
      const float denom = ms[i] - mg[i] * mg[i] + epsilon;
      mom[i] = mom[i] * momentum + lr * g[i] / std::sqrt(denom);
      w[i] -= mom[i];
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_CENTERED_RMS_PROP_H_
