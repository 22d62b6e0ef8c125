// Adagrad as the TPU embedding engine runs it: a += g^2; w -= lr * g / sqrt(a).  There is no epsilon: the
// accumulator starts positive (Python's initial_accumulator_value must be > 0).  (docs/semantics.md, "Optimizers")
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_H_

#include <array>
#include <cmath>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Adagrad : ElementWiseOptimizer<Adagrad> {
  static constexpr const char* kName = "adagrad";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"accumulators", 0.1f}}};

  void UpdateElement(float lr, const float& g, float& w, float& a) const {
    a += g * g;
    w -= lr * g / std::sqrt(a);
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_H_
