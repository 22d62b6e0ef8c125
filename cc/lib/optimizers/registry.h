// The list of optimizers the engine runs.  Adding one = one header with a struct shaped like Adam (kName,
// kSlots, ForEachHyperParameter(), UpdatesAllRows(), UpdateRow()) plus one entry in OptimizerParams below;
// cc/config maps its proto message to the struct.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_

#include <string>
#include <variant>
#include <vector>

#include "cc/lib/optimizers/adadelta.h"
#include "cc/lib/optimizers/adagrad.h"
#include "cc/lib/optimizers/adagrad_momentum.h"
#include "cc/lib/optimizers/adam.h"
#include "cc/lib/optimizers/assign.h"
#include "cc/lib/optimizers/bounded_adagrad.h"
#include "cc/lib/optimizers/centered_rms_prop.h"
#include "cc/lib/optimizers/frequency_estimator.h"
#include "cc/lib/optimizers/ftrl.h"
#include "cc/lib/optimizers/lion.h"
#include "cc/lib/optimizers/momentum.h"
#include "cc/lib/optimizers/online_yogi.h"
#include "cc/lib/optimizers/proximal_adagrad.h"
#include "cc/lib/optimizers/proximal_yogi.h"
#include "cc/lib/optimizers/rms_prop.h"
#include "cc/lib/optimizers/sgd.h"
#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

// The five optimizers of tf.tpu.experimental.embedding first, then the rest of optimization_parameters.proto
// whose update rule is public (or, for BoundedAdagrad and the Yogis, documented in our docs as a reading).
using OptimizerParams =
    std::variant<Sgd, Adagrad, AdagradMomentum, Adam, Ftrl, Momentum, RmsProp, CenteredRmsProp, Adadelta,
                 ProximalAdagrad, Lion, BoundedAdagrad, OnlineYogi, ProximalYogi, FrequencyEstimator, Assign>;

inline const char* OptimizerName(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return o.kName; }, p);
}

inline std::vector<SlotInfo> OptimizerSlots(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return std::vector<SlotInfo>(o.kSlots.begin(), o.kSlots.end()); }, p);
}

inline bool OptimizerUpdatesAllRows(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return o.UpdatesAllRows(); }, p);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_
