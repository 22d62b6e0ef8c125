// The optimizer step of a dynamic table: the same per-row pipeline as static tables (row_update.h: gradient
// clipping, weight decay, the optimizer's UpdateRow, weight clipping), applied in place to the rows the table's
// arenas hold.  There is no second implementation of any optimizer: only the row addressing differs from
// table_update.h (arena pointers instead of base + row * dim).
//
// `plan` is built over ROW INDICES (FindOrInsert's output), with keys that got no row (kNotAdmitted) left out
// by the caller: such keys have no row and get no update.  Lazy optimizers update the plan's rows; optimizers
// whose UpdatesAllRows() is true (non-lazy Adam) update every live row, with a zero gradient where untouched.
// Rows are independent and each row's gradient is summed in the plan's fixed order, so the result is bitwise
// the same for any sharding.  The caller must hold the table against mutation (no insert, evict, import).
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_UPDATE_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <variant>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/prefetch.h"
#include "cc/lib/row_update.h"
#include "cc/lib/shard.h"
#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {
namespace internal {

template <typename Optimizer>
void UpdateDynamicTableWith(const Optimizer& optimizer, const TableOptimization& o, float lr,
                            const RowGradientPlan& plan, DynamicTable* table, const ShardFn& shard) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  const int64_t dim = table->dim();
  const int64_t row_cost = dim * static_cast<int64_t>(8 + 6 * kNumSlots);
  // A slot's rows are table->slot_width(k) wide (dim, or 1 for a per-row slot), as the optimizer's SlotInfo says.
  std::array<int64_t, kNumSlots + 1> slot_width{};
  for (size_t k = 0; k < kNumSlots; ++k) slot_width[k] = table->slot_width(static_cast<int64_t>(k));
  auto update = [&](int64_t row, float* g) {
    std::array<float*, kNumSlots + 1> slot_rows{};
    for (size_t k = 0; k < kNumSlots; ++k) slot_rows[k] = table->Slot(static_cast<int64_t>(k), row);
    UpdateRowPipeline(optimizer, o, lr, g, table->Weights(row), slot_rows.data(), dim);
  };
  if (!optimizer.UpdatesAllRows()) {
    shard(plan.num_rows(), row_cost, [&](int64_t begin, int64_t end) {
      std::vector<float> g(dim);
      RunWithRowLoopIsa([&] {
        for (int64_t u = begin; u < end; ++u) {
          if (u + kPrefetchDistance < end) {
            const int64_t ahead = plan.row(u + kPrefetchDistance);
            PrefetchRow<true>(table->Weights(ahead), dim);
            for (size_t k = 0; k < kNumSlots; ++k) {
              PrefetchRow<true>(table->Slot(static_cast<int64_t>(k), ahead), slot_width[k]);
            }
          }
          plan.Accumulate(u, dim, g.data());
          update(plan.row(u), g.data());
        }
      });
    });
    return;
  }
  // Every live row: the touched ones with their gradient, the others with zeros.
  const std::vector<int64_t> live = table->LiveRows();  // ascending
  const std::vector<int64_t> order = plan.OrderByRow();
  shard(static_cast<int64_t>(live.size()), row_cost, [&](int64_t begin, int64_t end) {
    if (begin >= end) return;  // (live[begin] would be past the end of an empty table)
    std::vector<float> g(dim);
    auto it = std::lower_bound(order.begin(), order.end(), live[begin],
                               [&plan](int64_t u, int64_t row) { return plan.row(u) < row; });
    RunWithRowLoopIsa([&] {
      for (int64_t i = begin; i < end; ++i) {
        if (it != order.end() && plan.row(*it) == live[i]) {
          plan.Accumulate(*it, dim, g.data());
          ++it;
        } else {
          std::fill(g.begin(), g.end(), 0.0f);
        }
        update(live[i], g.data());
      }
    });
  });
}

}  // namespace internal

// One optimizer step on `table` (see above).  o.optimizer's slot count must equal table->num_slots() and each
// slot's width SlotWidth(kSlots[k], dim) must equal table->slot_width(k) (checked by the kernels against the
// config, see CheckDynamicTableSlots).
inline void UpdateDynamicTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, DynamicTable* table,
                               const ShardFn& shard) {
  std::visit([&](const auto& optimizer) { internal::UpdateDynamicTableWith(optimizer, o, lr, plan, table, shard); },
             o.optimizer);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_UPDATE_H_
