// The dense row walk's one instantiation (table_update.h): static tables and dense dynamic tables both call it.
#include "cc/lib/table_update.h"

namespace tf_embed_ops {

void UpdateTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, const StoredTableBuffers& t,
                 const ShardFn& shard, TouchedRows* touched) {
  UpdateRows(o, lr, plan, internal::DenseStorageOf(t, o), t.dim, t.rounding, shard, touched);
}

}  // namespace tf_embed_ops
