// Questions about the optimizer a table runs, answered by its math struct.  The list of optimizers and their
// schema (proto fields, ranges, Python names) live in schema.h; adding an optimizer touches only its math header
// and its schema entry there.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_

#include <variant>
#include <vector>

#include "cc/lib/optimizers/schema.h"
#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

inline const char* OptimizerName(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return o.kName; }, p);
}

inline std::vector<SlotInfo> OptimizerSlots(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return std::vector<SlotInfo>(o.kSlots.begin(), o.kSlots.end()); }, p);
}

inline bool OptimizerUpdatesAllRows(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return o.UpdatesAllRows(); }, p);
}

// The schema entry of the optimizer `p` holds.
inline const OptimizerSchema& SchemaFor(const OptimizerParams& p) { return kOptimizerSchemas[p.index()]; }

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_
