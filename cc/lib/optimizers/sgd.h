// Stochastic gradient descent: w -= lr * g.  No slots.  (docs/semantics.md, "Optimizers")
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SGD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SGD_H_

#include <array>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct Sgd {
  static constexpr const char* kName = "stochastic_gradient_descent";
  static constexpr std::array<SlotInfo, 0> kSlots = {};

  // A zero gradient is a no-op, so only touched rows ever need visiting.
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& /*visit*/) const {}

  bool UpdatesAllRows() const { return false; }

  // `slots` holds kSlots.size() row pointers, each of `dim` floats.
  void UpdateRow(float lr, const float* g, float* w, float* const* /*slots*/, int64_t dim) const {
    for (int64_t i = 0; i < dim; ++i) w[i] -= lr * g[i];
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SGD_H_
