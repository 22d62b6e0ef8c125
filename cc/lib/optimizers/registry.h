// The list of optimizers the engine runs.  Adding one = one header with a struct shaped like Sgd (kName,
// kSlots, UpdatesAllRows(), UpdateRow()) plus one entry in OptimizerParams below; cc/config maps its proto
// message to the struct.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_

#include <string>
#include <variant>
#include <vector>

#include "cc/lib/optimizers/adagrad.h"
#include "cc/lib/optimizers/adagrad_momentum.h"
#include "cc/lib/optimizers/adam.h"
#include "cc/lib/optimizers/ftrl.h"
#include "cc/lib/optimizers/sgd.h"
#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

using OptimizerParams = std::variant<Sgd, Adagrad, AdagradMomentum, Adam, Ftrl>;

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
