// Row-wise Adagrad as FBGEMM runs it on CPU (EXACT_ROWWISE_ADAGRAD): one accumulator per row, which grows by the
// mean over the row of the squared gradient.  The formula, with FBGEMM's weight-decay modes, is the CPU update
// of fbgemm_gpu/codegen/genscript/optimizers.py, rowwise_adagrad() ("split_weight_update_cpu"), in float32:
//   s  = sum_d (g_d + [L2] weight_decay * w_d)^2            (eight partial sums, as FBGEMM's fp32 kernel)
//   a += s / dim
//   m  = lr / (sqrt(a) + epsilon)                            (epsilon outside the square root)
//   c  = 1 - m * weight_decay   (L2)  |  1 - lr * weight_decay   (decoupled)  |  1   (no decay)
//   w  = c * w - g * m                                       (the raw gradient: L2 enters through c)
// FBGEMM's WeightDecayMode maps to weight_decay == 0 (NONE), > 0 (L2), > 0 with decoupled_weight_decay (DECOUPLED).
// The slot is per row ([vocabulary_size, 1]); docs/optimizers.md, "RowWiseAdagrad".  It is not a TPU optimizer:
// a config carries it in the extension field kRowWiseAdagradField of OptimizationParameters (schema.h).
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ROWWISE_ADAGRAD_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ROWWISE_ADAGRAD_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

// Not element-wise: the row shares one accumulator, grown by a sum over the row before any weight moves.
struct RowWiseAdagrad : OptimizerDefaults {
  static constexpr const char* kName = "rowwise_adagrad";
  // FBGEMM starts momentum1 at 0 (epsilon keeps the first step finite).
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"row_accumulators", 0.0f, /*per_row=*/true}}};

  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;

  auto HyperParameters() const { return std::tie(epsilon, weight_decay, decoupled_weight_decay); }

  // sum_d (g_d + l2 * w_d)^2 in eight partial sums added pairwise: the order of FBGEMM's fp32 kernel
  // (fbgemm::GenerateSparseAdaGrad with rowwise=true; its reference is rowwise_sparse_adagrad_ref in
  // src/RefImplementations.cc).  Lane k sums elements k, k + 8, ...; blocks of 8 keep the lanes in one register.
  // Without L2 the weights are not read, so a non-finite weight cannot reach the accumulator (0 * inf).
  template <bool kL2>
  static float SumSquares(const float* g, const float* w, float l2, int64_t dim) {
    std::array<float, 8> partial{};
    auto term = [&](int64_t i) { return kL2 ? g[i] + l2 * w[i] : g[i]; };
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      for (int k = 0; k < 8; ++k) {
        const float gi = term(i + k);
        partial[k] += gi * gi;
      }
    }
    for (int k = 0; i < dim; ++i, ++k) {
      const float gi = term(i);
      partial[k] += gi * gi;
    }
    return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
           ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  }

  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    const float l2 = decoupled_weight_decay ? 0.0f : weight_decay;
    const float sum_square = l2 == 0.0f ? SumSquares<false>(g, w, 0.0f, dim) : SumSquares<true>(g, w, l2, dim);
    float* a = slots[0];
    a[0] += sum_square / static_cast<float>(dim);
    const float multiplier = lr / (std::sqrt(a[0]) + epsilon);
    if (weight_decay == 0.0f) {
      for (int64_t d = 0; d < dim; ++d) w[d] -= g[d] * multiplier;
      return;
    }
    const float correction = 1.0f - (decoupled_weight_decay ? lr : multiplier) * weight_decay;
    for (int64_t d = 0; d < dim; ++d) w[d] = correction * w[d] - g[d] * multiplier;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_ROWWISE_ADAGRAD_H_
