// Frequency estimator (exactly the sequence the TPU proto documents).  The table row holds D, the running
// average of global steps between two hits of the row; the slot holds the step of the last hit.  The current
// global step arrives as the table's (dynamic) learning rate, as TPUEstimator passed it; the gradient is
// ignored (TPU requires it to be zero):
//   delta = step - last_hit;  cd = min(delta, max_delta);  outlier = delta >= outlier_threshold * D
//   D = outlier ? cd : D * (1 - tau) + cd * tau;  last_hit = step
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FREQUENCY_ESTIMATOR_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FREQUENCY_ESTIMATOR_H_

#include <algorithm>
#include <array>
#include <tuple>

#include "cc/lib/optimizers/optimizer.h"

namespace tf_embed_ops {

struct FrequencyEstimator : ElementWiseOptimizer<FrequencyEstimator> {
  static constexpr const char* kName = "frequency_estimator";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"last_hit_step", 0.0f}}};

  float tau = 0.0f;
  float max_delta = 0.0f;
  float outlier_threshold = 0.0f;
  float weight_exponent = 0.0f;

  auto HyperParameters() const { return std::tie(tau, max_delta, outlier_threshold, weight_exponent); }

  void UpdateElement(float step, const float& /*g*/, float& d, float& last_hit) const {
    const float delta = step - last_hit;
    const float clipped = std::min(delta, max_delta);
    const bool outlier = delta >= outlier_threshold * d;
    d = outlier ? clipped : d * (1.0f - tau) + clipped * tau;
    last_hit = step;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FREQUENCY_ESTIMATOR_H_
