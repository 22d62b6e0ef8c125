// Online Yogi.  The proto gives only the parameters (l1, l2, beta2; docs/semantics.md) and says "Yogi plus FTRL-style
// extensions".  Our documented reading: FTRL-proximal (ftrl.h, lr_power = -1/2, beta = 0) whose squared-gradient
// accumulator is Yogi's additive second moment instead of Adagrad's sum:
//   v' = v - (1 - b2) * sign(v - g^2) * g^2
//   lin += g - (sqrt(v') - sqrt(v)) / lr * w;   w = (clamp(lin, -l1, l1) - lin) / (sqrt(v') / lr + 2 * l2);  v = v'
// No public kernel exists to compare with.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ONLINE_YOGI_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ONLINE_YOGI_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct OnlineYogi : ElementWiseOptimizer<OnlineYogi> {
  static constexpr const char* kName = "online_yogi";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"vs", 0.1f}, {"linears", 0.0f}}};

  float l1 = 0.0f;
  float l2 = 0.0f;
  float beta2 = 0.0f;

  auto HyperParameters() const { return std::tie(l1, l2, beta2); }

  void UpdateElement(float lr, const float& g, float& w, float& v, float& lin) const {
    const float g2 = g * g;
    const float d = v - g2;
    const float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
    const float v_new = v - (1.0f - beta2) * sign * g2;
    const float root_new = std::sqrt(v_new);
    lin += g - (root_new - std::sqrt(v)) / lr * w;
    w = (std::clamp(lin, -l1, l1) - lin) / (root_new / lr + 2.0f * l2);
    v = v_new;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ONLINE_YOGI_H_
