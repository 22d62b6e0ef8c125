// Lion, as the TPU proto writes it (arXiv 2302.06675):
//   c = b1 * m + (1 - b1) * g;   w -= lr * sign(c);   m = b2 * m + (1 - b2) * g
// sign(0) = 0, so an untouched row of non-lazy Lion with m = 0 does not move.  use_non_lazy_lion updates every
// row every step (zero gradient where untouched), which is why it requires gradient accumulation.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_LION_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_LION_H_

#include <array>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Lion : ElementWiseOptimizer<Lion> {
  static constexpr const char* kName = "lion";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"momenta", 0.0f}}};

  float beta1 = 0.0f;
  float beta2 = 0.0f;
  bool use_non_lazy_lion = false;

  auto HyperParameters() const { return std::tie(beta1, beta2, use_non_lazy_lion); }

  bool UpdatesAllRows() const { return use_non_lazy_lion; }

  void UpdateElement(float lr, const float& g, float& w, float& m) const {
    const float c = beta1 * m + (1.0f - beta1) * g;
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    w -= lr * sign;
    m = beta2 * m + (1.0f - beta2) * g;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_LION_H_
