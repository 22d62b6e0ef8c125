// AdagradMomentum in the SparseCore form, with the gradient folded into the momentum (docs/semantics.md,
// "AdagradMomentum": the SparseCore ops and TF's golden test agree, the proto comment does not; checkpoints
// store this form):
//   a = (beta2 == 1) ? a + g^2 : beta2 * a + (1 - beta2) * g^2
//   s = g * (a + epsilon)^(-1/exponent)
//   m = momentum * m + s
//   w -= lr * (use_nesterov ? momentum * m + s : m)
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_MOMENTUM_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_MOMENTUM_H_

#include <array>
#include <cmath>
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct AdagradMomentum {
  static constexpr const char* kName = "adagrad_momentum";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"accumulators", 0.0f}, {"momenta", 0.0f}}};

  float momentum = 0.0f;
  bool use_nesterov = false;
  float exponent = 2.0f;
  float beta2 = 1.0f;
  float epsilon = 1e-10f;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("momentum", momentum);
    visit("use_nesterov", use_nesterov);
    visit("exponent", exponent);
    visit("beta2", beta2);
    visit("epsilon", epsilon);
  }

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    // The options are loop-invariant: dispatch once so each variant's loop is branch-free and vectorises.
    // exponent 2 is the common case: sqrt is exact-rounded and much faster than pow.
    const bool sum = beta2 == 1.0f, sqrt_exp = exponent == 2.0f;
    if (use_nesterov) {
      sum ? (sqrt_exp ? Update<true, true, true>(lr, g, w, slots, dim)
                      : Update<true, true, false>(lr, g, w, slots, dim))
          : (sqrt_exp ? Update<true, false, true>(lr, g, w, slots, dim)
                      : Update<true, false, false>(lr, g, w, slots, dim));
    } else {
      sum ? (sqrt_exp ? Update<false, true, true>(lr, g, w, slots, dim)
                      : Update<false, true, false>(lr, g, w, slots, dim))
          : (sqrt_exp ? Update<false, false, true>(lr, g, w, slots, dim)
                      : Update<false, false, false>(lr, g, w, slots, dim));
    }
  }

 private:
  template <bool kNesterov, bool kSumAccumulator, bool kSqrtExponent>
  void Update(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    float* a = slots[0];
    float* m = slots[1];
    const float power = -1.0f / exponent;
    for (int64_t i = 0; i < dim; ++i) {
      const float g2 = g[i] * g[i];
      a[i] = kSumAccumulator ? a[i] + g2 : beta2 * a[i] + (1.0f - beta2) * g2;
      const float scale = kSqrtExponent ? 1.0f / std::sqrt(a[i] + epsilon) : std::pow(a[i] + epsilon, power);
      const float s = g[i] * scale;
      m[i] = momentum * m[i] + s;
      w[i] -= lr * (kNesterov ? momentum * m[i] + s : m[i]);
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_MOMENTUM_H_
