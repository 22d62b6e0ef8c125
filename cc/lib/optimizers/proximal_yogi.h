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
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct ProximalYogi : ElementWiseOptimizer<ProximalYogi> {
  static constexpr const char* kName = "proximal_yogi";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"v", 0.1f}, {"m", 0.0f}}};

  float l1 = 0.0f;
  float l2 = 0.0f;
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float epsilon = 0.0f;

  auto HyperParameters() const { return std::tie(l1, l2, beta1, beta2, epsilon); }

  void UpdateElement(float lr, const float& g, float& w, float& v, float& m) const {
    const float g2 = g * g;
    m = beta1 * m + (1.0f - beta1) * g;
    const float d = v - g2;
    const float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
    v -= (1.0f - beta2) * sign * g2;
    const float eta = lr / (std::sqrt(v) + epsilon);
    float x = w - eta * m;
    if (l1 > 0.0f) {
      const float sx = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
      x = sx * std::max(std::fabs(x) - eta * l1, 0.0f);
    }
    w = x / (1.0f + eta * l2);
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_PROXIMAL_YOGI_H_
