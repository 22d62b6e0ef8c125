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

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct Ftrl {
  static constexpr const char* kName = "ftrl";
  static constexpr std::array<SlotInfo, 2> kSlots = {{{"accumulators", 0.1f}, {"linears", 0.0f}}};

  float l1 = 0.0f;
  float l2 = 0.0f;
  float lr_power = -0.5f;
  float beta = 0.0f;
  bool multiply_linear_by_lr = false;
  bool allow_zero_accumulator = false;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("l1", l1);
    visit("l2", l2);
    visit("lr_power", lr_power);
    visit("beta", beta);
    visit("multiply_linear_by_lr", multiply_linear_by_lr);
    visit("allow_zero_accumulator", allow_zero_accumulator);
  }

  bool UpdatesAllRows() const { return false; }

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
    float* a = slots[0];
    float* lin = slots[1];
    for (int64_t i = 0; i < dim; ++i) {
      const float a_new = a[i] + g[i] * g[i];
      const float p_new = Power<kSqrtPower>(a_new);
      const float sigma = p_new - Power<kSqrtPower>(a[i]);
      float quad, thr;
      if (kMultiplyLinearByLr) {
        lin[i] += lr * g[i] - sigma * w[i];
        quad = p_new + 2.0f * lr * l2 + beta;
        thr = lr * l1;
      } else {
        lin[i] += g[i] - sigma / lr * w[i];
        quad = (p_new + beta) / lr + 2.0f * l2;
        thr = l1;
      }
      w[i] = (std::clamp(lin[i], -thr, thr) - lin[i]) / quad;
      a[i] = a_new;
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FTRL_H_
