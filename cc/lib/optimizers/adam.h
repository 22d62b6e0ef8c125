// Adam as the TPU embedding engine runs it (docs/semantics.md, "Bias correction"): no bias correction (TPU users
// fold it into a dynamic learning rate lr * sqrt(1 - b2^t) / (1 - b1^t)).
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
//   w -= lr * m / sqrt(v + eps^2)        if use_sum_inside_sqrt
//   w -= lr * m / (sqrt(v) + eps)        otherwise
// Lazy by default; use_non_lazy_adam updates every row every step with a zero gradient where untouched.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAM_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAM_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Adam : OptimizerDefaults {
  static constexpr const char* kName = "adam";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"momenta", 0.0f}, {"velocities", 0.0f}}};

  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-7f;
  bool use_non_lazy_adam = false;
  bool use_sum_inside_sqrt = true;

  auto HyperParameters() const { return std::tie(beta1, beta2, epsilon, use_non_lazy_adam, use_sum_inside_sqrt); }

  bool UpdatesAllRows() const { return use_non_lazy_adam; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    const float eps2 = epsilon * epsilon;  // once per row
    ForEachElement<kSlots.size()>(g, w, slots, dim, [&](auto&... e) { UpdateElement(lr, eps2, e...); });
  }

 private:
  void UpdateElement(float lr, float eps2, const float& g, float& w, float& m, float& v) const {
    m = beta1 * m + (1.0f - beta1) * g;
    v = beta2 * v + (1.0f - beta2) * g * g;
    const float denom = use_sum_inside_sqrt ? std::sqrt(v + eps2) : std::sqrt(v) + epsilon;
    w -= lr * m / denom;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAM_H_
