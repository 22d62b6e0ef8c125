// Stochastic gradient descent: w -= lr * g.  No slots.  (docs/semantics.md, "Optimizers")
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SGD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SGD_H_

#include <array>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Sgd : ElementWiseOptimizer<Sgd> {
  static constexpr const char* kName = "stochastic_gradient_descent";
  static constexpr std::array<SlotInfo, 0> kSlots = {};

  // A zero gradient is a no-op, so only touched rows ever need visiting (the default UpdatesAllRows).
  void UpdateElement(float lr, const float& g, float& w) const { w -= lr * g; }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SGD_H_
