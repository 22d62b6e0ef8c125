// The per-row training pipeline of the TPU embedding engine (docs/semantics.md, "The training step, row by row",
// "Weight decay" and "Gradient clipping"), written once for
// every optimizer struct (Sgd, Adagrad, ... : UpdateRow(lr, g, w, slots, dim)):
//   g = clip(g, gradient_clipping_limits)                     (on the accumulated sum)
//   w -= wd * (multiply_weight_decay_factor_by_learning_rate ? lr : 1) * w    (decoupled decay, before the step)
//   w, slots = optimizer(w, slots, g, lr)
//   w = clip(w, clipping_limits)                               (apply_weight_clipping_to_table, SparseCore)
#ifndef TF_EMBED_OPS_CC_LIB_ROW_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_ROW_UPDATE_H_

#include <algorithm>
#include <cstdint>

#include "cc/lib/embedding_config.h"

namespace tf_embed_ops {

// Whether o's pipeline is its optimizer alone: no gradient clipping, weight decay or weight clipping.
inline bool PipelineIsOptimizerOnly(const TableOptimization& o) {
  return !o.gradient_clipping.IsActive() && o.weight_decay_factor == 0.0f && !o.weight_clipping.IsActive();
}

// `g` is only read (it may be the accumulation plan's own sum); a clipped gradient is written to `clipped`, dim
// floats of the caller's scratch.
template <typename Optimizer>
inline void UpdateRowPipeline(const Optimizer& optimizer, const TableOptimization& o, float lr, const float* g,
                              float* clipped, float* w, float* const* slots, int64_t dim) {
  if (o.gradient_clipping.IsActive()) {
    for (int64_t d = 0; d < dim; ++d)
      clipped[d] = std::min(std::max(g[d], o.gradient_clipping.lower), o.gradient_clipping.upper);
    g = clipped;
  }
  if (o.weight_decay_factor != 0.0f) {
    const float decay = o.weight_decay_factor * (o.multiply_weight_decay_factor_by_learning_rate ? lr : 1.0f);
    for (int64_t d = 0; d < dim; ++d) w[d] -= decay * w[d];
  }
  optimizer.UpdateRow(lr, g, w, slots, dim);
  if (o.weight_clipping.IsActive()) {
    for (int64_t d = 0; d < dim; ++d) w[d] = std::min(std::max(w[d], o.weight_clipping.lower), o.weight_clipping.upper);
  }
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_ROW_UPDATE_H_
