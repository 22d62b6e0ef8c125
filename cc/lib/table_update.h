// Applies one step's accumulated gradients to a table and its slots (docs/semantics.md): the row pipeline of
// row_update.h on every touched row (lazy optimizers), or on every row with a zero gradient where untouched
// (optimizers whose UpdatesAllRows() is true: non-lazy Adam).  A touched row whose summed gradient is 0 is
// still updated (docs/semantics.md, "Touched rows with a zero gradient").
//
// Work is split by the caller-supplied `Shard` function (the kernels pass TensorFlow's intra-op pool): rows are
// independent and each row's gradient is summed in a fixed order (RowGradientPlan), so the result is bitwise
// the same for any sharding.  Gradient accumulation DISABLED uses this same exact path (see docs/ops.md).
#ifndef TF_EMBED_OPS_CC_LIB_TABLE_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_TABLE_UPDATE_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <variant>
#include <vector>

#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/prefetch.h"
#include "cc/lib/row_update.h"
#include "cc/lib/shard.h"
#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {

// Borrowed, row-major buffers of a table ([vocabulary_size, dim]) and its slots (kSlots order; a slot's rows are
// SlotWidth(slot, dim) wide: dim, or 1 for a per-row slot).
struct TableBuffers {
  float* weights = nullptr;
  std::vector<float*> slots;
  int64_t vocabulary_size = 0;
  int64_t dim = 0;
};

namespace internal {

template <typename Optimizer>
void UpdateTableWith(const Optimizer& optimizer, const TableOptimization& o, float lr, const RowGradientPlan& plan,
                     const TableBuffers& t, const ShardFn& shard) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  const int64_t dim = t.dim;
  // Rough cycles per row: the optimizer touches (1 + slots) rows of dim floats, plus the gradient gather.
  const int64_t row_cost = dim * static_cast<int64_t>(8 + 6 * kNumSlots);
  std::array<int64_t, kNumSlots + 1> slot_width{};
  for (size_t k = 0; k < kNumSlots; ++k) slot_width[k] = SlotWidth(Optimizer::kSlots[k], dim);
  auto update = [&](int64_t row, float* g) {
    std::array<float*, kNumSlots + 1> slot_rows{};
    for (size_t k = 0; k < kNumSlots; ++k) slot_rows[k] = t.slots[k] + row * slot_width[k];
    UpdateRowPipeline(optimizer, o, lr, g, t.weights + row * dim, slot_rows.data(), dim);
  };
  if (!optimizer.UpdatesAllRows()) {
    // A unique row costs its update plus one gradient row per contribution, and zipf ids make a few rows
    // carry thousands of contributions (the first ones: unique rows come in first-occurrence order).  So the
    // rows are cut into kWorkBlocks ranges of equal work, and those are what the shard function splits.
    const int64_t num_rows = plan.num_rows();
    constexpr int64_t kWorkBlocks = 64;
    constexpr int64_t kRowWork = 2 * (1 + static_cast<int64_t>(kNumSlots));  // in gradient-row reads
    auto work = [&](int64_t u) { return plan.contributions(u) + kRowWork * u; };
    const int64_t total_work = work(num_rows);
    std::array<int64_t, kWorkBlocks + 1> first_row{};
    for (int64_t b = 1; b < kWorkBlocks; ++b) {
      // The first row whose work reaches b / kWorkBlocks of the total (work(u) increases with u).
      int64_t lo = first_row[b - 1], hi = num_rows;
      const int64_t target = total_work * b / kWorkBlocks;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (work(mid) < target) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      first_row[b] = lo;
    }
    first_row[kWorkBlocks] = num_rows;
    shard(kWorkBlocks, row_cost * num_rows / kWorkBlocks + 1, [&](int64_t first_block, int64_t end_block) {
      const int64_t begin = first_row[first_block], end = first_row[end_block];
      std::vector<float> g(dim);
      RunWithRowLoopIsa([&] {
        for (int64_t u = begin; u < end; ++u) {
          if (u + kPrefetchDistance < end) {
            const int64_t ahead = plan.row(u + kPrefetchDistance);
            PrefetchRow<true>(t.weights + ahead * dim, dim);
            for (size_t k = 0; k < kNumSlots; ++k) {
              PrefetchRow<true>(t.slots[k] + ahead * slot_width[k], slot_width[k]);
            }
          }
          plan.Accumulate(u, dim, g.data());
          update(plan.row(u), g.data());
        }
      });
    });
    return;
  }
  // Every row: walk the row range alongside the touched rows sorted by id.
  const std::vector<int64_t> order = plan.OrderByRow();
  shard(t.vocabulary_size, row_cost, [&](int64_t begin, int64_t end) {
    std::vector<float> g(dim);
    auto it = std::lower_bound(order.begin(), order.end(), begin,
                               [&plan](int64_t u, int64_t row) { return plan.row(u) < row; });
    RunWithRowLoopIsa([&] {
      for (int64_t row = begin; row < end; ++row) {
        if (it != order.end() && plan.row(*it) == row) {
          plan.Accumulate(*it, dim, g.data());
          ++it;
        } else {
          std::fill(g.begin(), g.end(), 0.0f);
        }
        update(row, g.data());
      }
    });
  });
}

}  // namespace internal

inline void UpdateTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, const TableBuffers& t,
                        const ShardFn& shard) {
  std::visit([&](const auto& optimizer) { internal::UpdateTableWith(optimizer, o, lr, plan, t, shard); }, o.optimizer);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TABLE_UPDATE_H_
