// FTRL-proximal as SparseCore and TF's ApplyFtrl run it (docs/semantics.md, "Optimizers").  With p = -lr_power,
// a' = a + g^2:
//   standard:              lin += g - (a'^p - a^p) / lr * w;   quad = (a'^p + beta) / lr + 2 * l2;   thr = l1
//   multiply_linear_by_lr: lin += lr*g - (a'^p - a^p) * w;     quad = a'^p + 2 * lr * l2 + beta;    thr = lr*l1
//   w = (clamp(lin, -thr, thr) - lin) / quad;   a = a'
// allow_zero_accumulator is deprecated in the proto and ignored, as on TPU.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FTRL_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FTRL_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct Ftrl : OptimizerDefaults {
  static constexpr const char* kName = "ftrl";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"accumulators", 0.1f}, {"linears", 0.0f}}};

  float l1 = 0.0f;
  float l2 = 0.0f;
  float lr_power = -0.5f;
  float beta = 0.0f;
  bool multiply_linear_by_lr = false;
  bool allow_zero_accumulator = false;

  auto HyperParameters() const {
    return std::tie(l1, l2, lr_power, beta, multiply_linear_by_lr, allow_zero_accumulator);
  }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    // The options are loop-invariant: dispatch once so each variant's loop is branch-free and vectorises.
    // lr_power = -0.5 (the default) takes sqrt, which is exact and much faster than pow.
    const bool sqrt_power = lr_power == -0.5f;
    if (multiply_linear_by_lr) {
      sqrt_power ? Update<true, true>(lr, g, w, slots, dim) : Update<true, false>(lr, g, w, slots, dim);
    } else {
      sqrt_power ? Update<false, true>(lr, g, w, slots, dim) : Update<false, false>(lr, g, w, slots, dim);
    }
  }

 private:
  template <bool kSqrtPower>
  float Power(float x) const {
    return kSqrtPower ? std::sqrt(x) : std::pow(x, -lr_power);
  }

  template <bool kMultiplyLinearByLr, bool kSqrtPower>
  void Update(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    ForEachElement<kSlots.size()>(g, w, slots, dim,
                                  [&](auto&... e) { UpdateElement<kMultiplyLinearByLr, kSqrtPower>(lr, e...); });
  }

  template <bool kMultiplyLinearByLr, bool kSqrtPower>
  void UpdateElement(float lr, const float& g, float& w, float& a, float& lin) const {
    const float a_new = a + g * g;
    const float p_new = Power<kSqrtPower>(a_new);
    const float sigma = p_new - Power<kSqrtPower>(a);
    float quad, thr;
    if (kMultiplyLinearByLr) {
      lin += lr * g - sigma * w;
      quad = p_new + 2.0f * lr * l2 + beta;
      thr = lr * l1;
    } else {
      lin += g - sigma / lr * w;
      quad = (p_new + beta) / lr + 2.0f * l2;
      thr = l1;
    }
    w = (std::clamp(lin, -thr, thr) - lin) / quad;
    a = a_new;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FTRL_H_
