// Combiners of the TPU embedding engine (docs/semantics.md, "Combiners"): a sample s with member ids i is reduced to
//   act[s] = sum_i w_i * E[id_i] / norm_s,   norm_s = 1 (sum) | sum_i w_i (mean) | sqrt(sum_i w_i^2) (sqrtn).
// A zero norm (and so an empty sample) gives a zero activation and no gradient (div_no_nan, as TF's
// serving path and V0 do).  Both passes use the same per-id factor w_i / norm_s, so the backward pass is the
// exact transpose of the forward one.
#ifndef TF_EMBED_OPS_CC_LIB_COMBINER_H_
#define TF_EMBED_OPS_CC_LIB_COMBINER_H_

#include <cmath>
#include <string>

namespace tf_embed_ops {

enum class Combiner { kSum, kMean, kSqrtn };

// "sum", "mean" or "sqrtn" (the only spellings TF's enqueue kernels accept).  Returns false otherwise.
inline bool ParseCombiner(const std::string& name, Combiner* out) {
  if (name == "sum") {
    *out = Combiner::kSum;
  } else if (name == "mean") {
    *out = Combiner::kMean;
  } else if (name == "sqrtn") {
    *out = Combiner::kSqrtn;
  } else {
    return false;
  }
  return true;
}

// The factor 1 / norm_s from the sample's sum of weights and sum of squared weights; 0 where norm_s is 0.
inline float InverseNorm(Combiner combiner, double sum_w, double sum_w2) {
  double norm = 1.0;
  if (combiner == Combiner::kMean) norm = sum_w;
  if (combiner == Combiner::kSqrtn) norm = std::sqrt(sum_w2);
  return norm == 0.0 ? 0.0f : static_cast<float>(1.0 / norm);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_COMBINER_H_
