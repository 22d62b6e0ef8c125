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
#include <cstdint>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

struct FrequencyEstimator {
  static constexpr const char* kName = "frequency_estimator";
  static constexpr std::array<SlotInfo, 1> kSlots = {{{"last_hit_step", 0.0f}}};

  float tau = 0.0f;
  float max_delta = 0.0f;
  float outlier_threshold = 0.0f;
  float weight_exponent = 0.0f;

  // The hyper-parameters by their optimization_parameters.proto field names (views, serialisation).
  template <typename Visitor>
  void ForEachHyperParameter(Visitor&& visit) const {
    visit("tau", tau);
    visit("max_delta", max_delta);
    visit("outlier_threshold", outlier_threshold);
    visit("weight_exponent", weight_exponent);
  }

  bool UpdatesAllRows() const { return false; }

  void UpdateRow(float step, const float* /*g*/, float* d, float* const* slots, int64_t dim) const {
    float* last_hit = slots[0];
    for (int64_t i = 0; i < dim; ++i) {
      const float delta = step - last_hit[i];
      const float clipped = std::min(delta, max_delta);
      const bool outlier = delta >= outlier_threshold * d[i];
      d[i] = outlier ? clipped : d[i] * (1.0f - tau) + clipped * tau;
      last_hit[i] = step;
    }
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_FREQUENCY_ESTIMATOR_H_
