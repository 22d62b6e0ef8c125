// The optimizer step of a dynamic table: the one row walk of table_update.h over the table's arenas
// (ArenaRowStorage, row_storage.h).  There is no second walk and no second implementation of any optimizer:
// gradient clipping, weight decay, the optimizer's UpdateRow, weight clipping, the skew-balanced work split and
// the 16-bit load/round/store are the static tables' own.
//
// `plan` is built over ROW INDICES (FindOrInsert's output), with keys that got no row (kNotAdmitted) left out
// by the caller: such keys have no row and get no update.  Lazy optimizers update the plan's rows; optimizers
// whose UpdatesAllRows() is true (non-lazy Adam) update every live row, with a zero gradient where untouched.
// Stochastic rounding of 16-bit rows is keyed by the row's KEY (not its reusable row index), so a restored table
// rounds as the saved one would have.  The caller must hold the table against mutation (no insert, evict,
// import).
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_UPDATE_H_

#include <cstdint>
#include <variant>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/row_storage.h"
#include "cc/lib/shard.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/table_update.h"

namespace tf_embed_ops {

// A dynamic table's arenas.  The caller holds the table against mutation (no insert, evict, import) while the
// storage is in use: the live-row list is taken at construction.  It is built from a const table for the
// numerics check, which only reads rows; only UpdateDynamicTable (which takes the table non-const) writes
// through Row().
class ArenaRowStorage {
 public:
  // `walk_live_rows`: list the live rows (only a non-lazy optimizer walks them; a lazy one never asks).
  ArenaRowStorage(const DynamicTable& table, bool walk_live_rows)
      : table_(table), live_(walk_live_rows ? table.LiveRows() : std::vector<int64_t>()) {}

  int64_t num_buffers() const { return 1 + table_.num_slots(); }
  StorageType type(size_t b) const { return table_.buffer_type(static_cast<int64_t>(b)); }
  int64_t width(size_t b) const { return table_.buffer_width(static_cast<int64_t>(b)); }
  void* Row(size_t b, int64_t row) const { return const_cast<void*>(table_.BufferRow(static_cast<int64_t>(b), row)); }
  int64_t num_walk_rows() const { return static_cast<int64_t>(live_.size()); }
  int64_t walk_row(int64_t i) const { return live_[i]; }
  uint64_t rounding_id(int64_t row) const { return static_cast<uint64_t>(table_.KeyOf(row)); }

 private:
  const DynamicTable& table_;
  std::vector<int64_t> live_;  // ascending
};

inline bool UpdatesAllRows(const TableOptimization& o) {
  return std::visit([](const auto& optimizer) { return optimizer.UpdatesAllRows(); }, o.optimizer);
}

// One optimizer step on `table` (see above).  o.optimizer's slot count must equal table->num_slots() and each
// slot's width SlotWidth(kSlots[k], dim) must equal table->slot_width(k) (checked by the kernels against the
// config, see CheckDynamicTableSlots).  `rounding` matters only for a table with 16-bit buffers.  A tracked table's
// tracker (docs/tracking.md) gets the step as one update, marked by the walk.
// A lazy step on a table whose rows are dense float32 arrays walks them as a static table's (UpdateTable): the
// chunked storage's per-row address, even one branch on whether a row is reached directly, made the
// prefetch-bound walk about 1.2x slower.  Rounding ids (keys, for 16-bit rows) do not arise in float32.
inline void UpdateDynamicTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, DynamicTable* table,
                               const ShardFn& shard, const RoundingSpec& rounding = RoundingSpec()) {
  if (!UpdatesAllRows(o) && table->DenseFloat32Rows()) {
    StoredTableBuffers dense;
    dense.weights = StoredBuffer{table->Weights(0), StorageType::kFloat32};
    for (int64_t s = 0; s < table->num_slots(); ++s) {
      dense.slots.push_back(StoredBuffer{table->Slot(s, 0), StorageType::kFloat32});
    }
    dense.vocabulary_size = table->row_bound();
    dense.dim = table->dim();
    UpdateTable(o, lr, plan, dense, shard, table->tracker());
    return;
  }
  UpdateRows(o, lr, plan, ArenaRowStorage(*table, UpdatesAllRows(o)), table->dim(), rounding, shard, table->tracker());
}

// The numerics check of that step (table_update.h's FindNonFiniteUpdate); writes nothing.
inline NonFiniteUpdate FindNonFiniteDynamicUpdate(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                                  const DynamicTable& table, const ShardFn& shard,
                                                  const RoundingSpec& rounding = RoundingSpec()) {
  return FindNonFiniteUpdate(o, lr, plan, ArenaRowStorage(table, UpdatesAllRows(o)), table.dim(), rounding, shard);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_UPDATE_H_
