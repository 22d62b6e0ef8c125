// Assign: w = g.  Well defined only with gradient accumulation (the row's summed gradient is assigned), which
// the config validator therefore requires.  The learning rate is unused.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ASSIGN_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ASSIGN_H_

#include <array>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Assign : ElementWiseOptimizer<Assign> {
  static constexpr const char* kName = "assign";
  static constexpr std::array<SlotInfo, 0> kSlots = {};

  void UpdateElement(float /*lr*/, const float& g, float& w) const { w = g; }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ASSIGN_H_
