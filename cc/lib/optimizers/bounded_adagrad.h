// Bounded Adagrad.  The proto gives only the parameters; this is our documented reading of them (docs/semantics.md),
// Adagrad (Duchi et al.) with two optional bounds:
//   update_accumulator_first:  a = min(a + g^2, max_acc);  step = lr * g / sqrt(a)
//   otherwise:                 step = lr * g / sqrt(a);    a = min(a + g^2, max_acc)
//   step = clamp(step, -max_var_update, max_var_update);   w -= step
// A bound of 0 (the proto default) disables it.  No public TensorFlow kernel exists to compare with.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_BOUNDED_ADAGRAD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_BOUNDED_ADAGRAD_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct BoundedAdagrad : ElementWiseOptimizer<BoundedAdagrad> {
  static constexpr const char* kName = "bounded_adagrad";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"accumulators", 0.1f}}};

  bool update_accumulator_first = false;
  float max_var_update = 0.0f;
  float max_accumulator = 0.0f;

  auto HyperParameters() const { return std::tie(update_accumulator_first, max_var_update, max_accumulator); }

  float Bound(float a) const { return max_accumulator > 0.0f ? std::min(a, max_accumulator) : a; }

  void UpdateElement(float lr, const float& g, float& w, float& a) const {
    const float a_new = Bound(a + g * g);
    float step = lr * g / std::sqrt(update_accumulator_first ? a_new : a);
    if (max_var_update > 0.0f) step = std::clamp(step, -max_var_update, max_var_update);
    w -= step;
    a = a_new;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_BOUNDED_ADAGRAD_H_
