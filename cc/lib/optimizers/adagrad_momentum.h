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
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct AdagradMomentum : OptimizerDefaults {
  static constexpr const char* kName = "adagrad_momentum";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"accumulators", 0.0f}, {"momenta", 0.0f}}};

  float momentum = 0.0f;
  bool use_nesterov = false;
  float exponent = 2.0f;
  float beta2 = 1.0f;
  float epsilon = 1e-10f;

  auto HyperParameters() const { return std::tie(momentum, use_nesterov, exponent, beta2, epsilon); }

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
    const float power = -1.0f / exponent;
    ForEachElement<kSlots.size()>(g, w, slots, dim, [&](auto&... e) {
      UpdateElement<kNesterov, kSumAccumulator, kSqrtExponent>(lr, power, e...);
    });
  }

  template <bool kNesterov, bool kSumAccumulator, bool kSqrtExponent>
  void UpdateElement(float lr, float power, const float& g, float& w, float& a, float& m) const {
    const float g2 = g * g;
    a = kSumAccumulator ? a + g2 : beta2 * a + (1.0f - beta2) * g2;
    const float scale = kSqrtExponent ? 1.0f / std::sqrt(a + epsilon) : std::pow(a + epsilon, power);
    const float s = g * scale;
    m = momentum * m + s;
    w -= lr * (kNesterov ? momentum * m + s : m);
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ADAGRAD_MOMENTUM_H_
