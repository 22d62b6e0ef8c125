// Assign: w = g.  Well defined only with gradient accumulation (the row's summed gradient is assigned), which
// the config validator therefore requires.  The learning rate is unused.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ASSIGN_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ASSIGN_H_

#include <array>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct Assign {
  static constexpr const char* kName = "assign";
  static constexpr std::array<SlotInfo, 0> kSlots = {};

  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& /*visit*/) const {}

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float /*lr*/, const float* g, float* w, float* const* /*slots*/, int64_t dim) const {
    for (int64_t i = 0; i < dim; ++i) w[i] = g[i];
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ASSIGN_H_
