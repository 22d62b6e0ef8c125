// Adagrad as the TPU embedding engine runs it: a += g^2; w -= lr * g / sqrt(a).  There is no epsilon: the
// accumulator starts positive (Python's initial_accumulator_value must be > 0).  (docs/semantics.md, "Optimizers")
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_H_

#include <array>
#include <cmath>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct Adagrad {
  static constexpr const char* kName = "adagrad";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"accumulators", 0.1f}}};

  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& /*visit*/) const {}

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    float* a = slots[0];
    for (int64_t i = 0; i < dim; ++i) {
      a[i] += g[i] * g[i];
      w[i] -= lr * g[i] / std::sqrt(a[i]);
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_H_
