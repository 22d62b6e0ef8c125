// Applies one step's accumulated gradients to a table and its slots (docs/semantics.md): the row pipeline of
// row_update.h on every touched row (lazy optimizers), or on every row with a zero gradient where untouched
// (optimizers whose UpdatesAllRows() is true: non-lazy Adam).  A touched row whose summed gradient is 0 is
// still updated (docs/semantics.md, "Touched rows with a zero gradient").
//
// Work is split by the caller-supplied `Shard` function (the kernels pass TensorFlow's intra-op pool): rows are
// independent and each row's gradient is summed in a fixed order (RowGradientPlan), so the result is bitwise
// the same for any sharding.  Gradient accumulation DISABLED uses this same exact path (see docs/ops.md).
//
// Tables and slots stored in 16 bits (StoredTableBuffers, docs/low_precision.md) take the same path: each row is
// widened to fp32 scratch, updated by the same pipeline, and rounded back (stochastic_rounding.h); the rounding
// bits are keyed by the row, so that path is thread-count independent too.  All-fp32 tables never see it.
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
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/storage_types.h"
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

// One buffer of a table with any storage type: `data` is float* for kFloat32, else the 16-bit bits (uint16_t*).
struct StoredBuffer {
  void* data = nullptr;
  StorageType type = StorageType::kFloat32;
};

// A table whose table or slots may be 16-bit (docs/low_precision.md); `rounding` says how rows are written back.
struct StoredTableBuffers {
  StoredBuffer weights;
  std::vector<StoredBuffer> slots;
  int64_t vocabulary_size = 0;
  int64_t dim = 0;
  RoundingSpec rounding;

  bool AllFloat32() const {
    if (weights.type != StorageType::kFloat32) return false;
    for (const StoredBuffer& s : slots)
      if (s.type != StorageType::kFloat32) return false;
    return true;
  }
};

namespace internal {

// Runs update(row, g, scratch) over the rows the optimizer updates (touched rows, or every row), with g the
// row's accumulated gradient and scratch `scratch_floats` floats, both private to the calling shard;
// prefetch(row) is called kPrefetchDistance rows ahead on the lazy path.  `num_slots` feeds the cost model.
template <typename Prefetch, typename Update>
void ForEachUpdatedRow(bool all_rows, size_t num_slots, const RowGradientPlan& plan, int64_t vocabulary_size,
                       int64_t dim, int64_t scratch_floats, const ShardFn& shard, const Prefetch& prefetch,
                       const Update& update) {
  // Rough cycles per row: the optimizer touches (1 + slots) rows of dim floats, plus the gradient gather.
  const int64_t row_cost = dim * static_cast<int64_t>(8 + 6 * num_slots);
  if (!all_rows) {
    // A unique row costs its update plus one gradient row per contribution, and zipf ids make a few rows
    // carry thousands of contributions (the first ones: unique rows come in first-occurrence order).  So the
    // rows are cut into kWorkBlocks ranges of equal work, and those are what the shard function splits.
    const int64_t num_rows = plan.num_rows();
    constexpr int64_t kWorkBlocks = 64;
    const int64_t row_work = 2 * (1 + static_cast<int64_t>(num_slots));  // in gradient-row reads
    auto work = [&](int64_t u) { return plan.contributions(u) + row_work * u; };
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
      std::vector<float> g(dim + scratch_floats);
      RunWithRowLoopIsa([&] {
        for (int64_t u = begin; u < end; ++u) {
          if (u + kPrefetchDistance < end) prefetch(plan.row(u + kPrefetchDistance));
          plan.Accumulate(u, dim, g.data());
          update(plan.row(u), g.data(), g.data() + dim);
        }
      });
    });
    return;
  }
  // Every row: walk the row range alongside the touched rows sorted by id.
  const std::vector<int64_t> order = plan.OrderByRow();
  shard(vocabulary_size, row_cost, [&](int64_t begin, int64_t end) {
    std::vector<float> g(dim + scratch_floats);
    auto it = std::lower_bound(order.begin(), order.end(), begin,
                               [&plan](int64_t u, int64_t row) { return plan.row(u) < row; });
    RunWithRowLoopIsa([&] {
      for (int64_t row = begin; row < end; ++row) {
        if (it != order.end() && plan.row(*it) == row) {
          plan.Accumulate(*it, dim, g.data());
          ++it;
        } else {
          std::fill(g.begin(), g.begin() + dim, 0.0f);
        }
        update(row, g.data(), g.data() + dim);
      }
    });
  });
}

template <typename Optimizer>
void UpdateTableWith(const Optimizer& optimizer, const TableOptimization& o, float lr, const RowGradientPlan& plan,
                     const TableBuffers& t, const ShardFn& shard) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  const int64_t dim = t.dim;
  std::array<int64_t, kNumSlots + 1> slot_width{};
  for (size_t k = 0; k < kNumSlots; ++k) slot_width[k] = SlotWidth(Optimizer::kSlots[k], dim);
  auto prefetch = [&](int64_t ahead) {
    PrefetchRow<true>(t.weights + ahead * dim, dim);
    for (size_t k = 0; k < kNumSlots; ++k) PrefetchRow<true>(t.slots[k] + ahead * slot_width[k], slot_width[k]);
  };
  auto update = [&](int64_t row, float* g, float* /*scratch*/) {
    std::array<float*, kNumSlots + 1> slot_rows{};
    for (size_t k = 0; k < kNumSlots; ++k) slot_rows[k] = t.slots[k] + row * slot_width[k];
    UpdateRowPipeline(optimizer, o, lr, g, t.weights + row * dim, slot_rows.data(), dim);
  };
  ForEachUpdatedRow(optimizer.UpdatesAllRows(), kNumSlots, plan, t.vocabulary_size, dim, 0, shard, prefetch, update);
}

// 16-bit buffers: each row is widened into fp32 scratch, goes through the same pipeline, and is rounded back
// (fp32 buffers of a mixed table are updated in place).
template <typename Optimizer>
void UpdateStoredTableWith(const Optimizer& optimizer, const TableOptimization& o, float lr,
                           const RowGradientPlan& plan, const StoredTableBuffers& t, const ShardFn& shard) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  constexpr size_t kNumBuffers = kNumSlots + 1;
  const int64_t dim = t.dim;
  std::array<StoredBuffer, kNumBuffers> buffers{};
  std::array<int64_t, kNumBuffers> width{};  // elements per row: dim, or 1 for a per-row slot
  buffers[0] = t.weights;
  width[0] = dim;
  for (size_t k = 0; k < kNumSlots; ++k) {
    buffers[k + 1] = t.slots[k];
    width[k + 1] = SlotWidth(Optimizer::kSlots[k], dim);
  }
  auto prefetch = [&](int64_t ahead) {
    for (size_t b = 0; b < kNumBuffers; ++b) {
      // PrefetchRow counts floats: a 16-bit row is half as many floats long.
      const int64_t bytes = width[b] * StorageBytes(buffers[b].type);
      PrefetchRow<true>(reinterpret_cast<const float*>(static_cast<const char*>(buffers[b].data) + ahead * bytes),
                        (bytes + 3) / 4);
    }
  };
  auto update = [&](int64_t row, float* g, float* scratch) {
    std::array<float*, kNumBuffers> rows{};
    for (size_t b = 0; b < kNumBuffers; ++b) {
      if (buffers[b].type == StorageType::kFloat32) {
        rows[b] = static_cast<float*>(buffers[b].data) + row * width[b];
      } else {
        rows[b] = scratch + b * dim;
        LoadStoredRow(buffers[b].type, static_cast<const uint16_t*>(buffers[b].data) + row * width[b], rows[b],
                      width[b]);
      }
    }
    UpdateRowPipeline(optimizer, o, lr, g, rows[0], rows.data() + 1, dim);
    for (size_t b = 0; b < kNumBuffers; ++b) {
      if (buffers[b].type == StorageType::kFloat32) continue;
      const uint64_t key =
          t.rounding.mode == Rounding::kStochastic ? RoundingRowKey(t.rounding, static_cast<int64_t>(b), row) : 0;
      StoreStoredRow(buffers[b].type, t.rounding.mode, key, rows[b],
                     static_cast<uint16_t*>(buffers[b].data) + row * width[b], width[b]);
    }
  };
  ForEachUpdatedRow(optimizer.UpdatesAllRows(), kNumSlots, plan, t.vocabulary_size, dim,
                    static_cast<int64_t>(kNumBuffers) * dim, shard, prefetch, update);
}

}  // namespace internal

inline void UpdateTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, const TableBuffers& t,
                        const ShardFn& shard) {
  std::visit([&](const auto& optimizer) { internal::UpdateTableWith(optimizer, o, lr, plan, t, shard); }, o.optimizer);
}

// Any storage types; an all-float32 table takes exactly UpdateTable's path.
inline void UpdateTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, const StoredTableBuffers& t,
                        const ShardFn& shard) {
  if (t.AllFloat32()) {
    TableBuffers f32{static_cast<float*>(t.weights.data), {}, t.vocabulary_size, t.dim};
    for (const StoredBuffer& s : t.slots) f32.slots.push_back(static_cast<float*>(s.data));
    UpdateTable(o, lr, plan, f32, shard);
    return;
  }
  std::visit([&](const auto& optimizer) { internal::UpdateStoredTableWith(optimizer, o, lr, plan, t, shard); },
             o.optimizer);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TABLE_UPDATE_H_
