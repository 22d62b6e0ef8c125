// Proximal Yogi.  The proto gives only the parameters (docs/semantics.md) and cites the Yogi paper (Zaheer et al.,
// NeurIPS 2018) "plus some extensions based on FTRL"; we follow the public proximal form of Yogi
// (tensorflow/addons' Yogi optimizer), with no bias correction (use a dynamic learning rate, as for Adam):
//   m = b1 * m + (1 - b1) * g
//   v = v - (1 - b2) * sign(v - g^2) * g^2
//   eta = lr / (sqrt(v) + epsilon);   x = w - eta * m
//   x = sign(x) * max(|x| - eta * l1, 0)  (l1 > 0);   w = x / (1 + eta * l2)
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_YOGI_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_YOGI_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct ProximalYogi {
  static constexpr const char* kName = "proximal_yogi";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"v", 0.1f}, {"m", 0.0f}}};

  float l1 = 0.0f;
  float l2 = 0.0f;
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float epsilon = 0.0f;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("l1", l1);
    visit("l2", l2);
    visit("beta1", beta1);
    visit("beta2", beta2);
    visit("epsilon", epsilon);
  }

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    float* v = slots[0];
    float* m = slots[1];
    for (int64_t i = 0; i < dim; ++i) {
      const float g2 = g[i] * g[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
      const float d = v[i] - g2;
      const float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
      v[i] -= (1.0f - beta2) * sign * g2;
      const float eta = lr / (std::sqrt(v[i]) + epsilon);
      float x = w[i] - eta * m[i];
      if (l1 > 0.0f) {
        const float sx = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
        x = sx * std::max(std::fabs(x) - eta * l1, 0.0f);
      }
      w[i] = x / (1.0f + eta * l2);
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_YOGI_H_
