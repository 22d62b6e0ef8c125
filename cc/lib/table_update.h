// Applies one step's accumulated gradients to a table and its slots (docs/semantics.md): the row pipeline of
// row_update.h on every touched row (lazy optimizers), or on every row with a zero gradient where untouched
// (optimizers whose UpdatesAllRows() is true: non-lazy Adam).  A touched row whose summed gradient is 0 is
// still updated (docs/semantics.md, "Touched rows with a zero gradient").
//
// This is the ONE row walk of the library: static tables (dense arrays) and dynamic tables (chunked arenas)
// both come here through a row storage (row_storage.h), and so does any future storage; only the adapters at the
// bottom (UpdateTable, UpdateDynamicTable) differ.  The walk owns, for every storage:
//   * the work split: lazy rows are cut into blocks of equal work (zipf ids make a few rows carry most of the
//     gradient rows), split by the caller-supplied `Shard` function (the kernels pass TensorFlow's intra-op
//     pool); rows are independent and each row's gradient is summed in a fixed order (RowGradientPlan), so the
//     result is bitwise the same for any sharding;
//   * the 16-bit path (docs/low_precision.md): a 16-bit row is widened to fp32 scratch, updated by the same
//     pipeline, and rounded back (stochastic_rounding.h) with bits keyed by the storage's rounding id, so it is
//     thread-count independent too; float32 buffers are updated in place, and an all-float32 table with no
//     clipping or weight decay walks a loop compiled without the 16-bit branches or those stages;
//   * the numerics check (FindNonFiniteUpdate): a dry run of the same walk that writes nothing;
//   * the touched-row marks of a tracked table (docs/tracking.md): after the walk, one bit per row of the plan in
//     the tracker's pending bitmap (from one thread: shards would share its words).
// Gradient accumulation DISABLED uses this same exact path (see docs/ops.md).
#ifndef TF_EMBED_OPS_CC_LIB_TABLE_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_TABLE_UPDATE_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/numerics.h"
#include "cc/lib/prefetch.h"
#include "cc/lib/row_storage.h"
#include "cc/lib/row_update.h"
#include "cc/lib/shard.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/touched_rows.h"
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

// What FindNonFiniteUpdate found: the first row (smallest row index) of the walk where a value would become
// NaN or +-inf.
struct NonFiniteUpdate {
  bool found = false;
  int64_t row = 0;
  bool in_gradient = false;  // true: the row's accumulated gradient; false: buffer `buffer` after the update
  int64_t buffer = 0;        // 0 the table, 1 + k slot k (after the update, as stored: 16-bit rows rounded)
  int64_t column = 0;
  float value = 0.0f;
};

// The walk's cost model, in rough cycles per updated row: the optimizer touches (1 + slots) rows of dim floats,
// plus the gradient gather.
inline int64_t RowWalkCost(int64_t dim, size_t num_slots) { return dim * static_cast<int64_t>(8 + 6 * num_slots); }

namespace internal {

// Runs update(row, g, scratch) over the rows the optimizer updates (touched rows, or every walk row of the
// storage), with g the row's accumulated gradient (read only: a summing plan's own row, with no copy) and scratch
// dim + `scratch_floats` floats private to the calling shard (the first dim for the clipped gradient of
// UpdateRowPipeline); prefetch(row) is called kPrefetchDistance rows ahead on the lazy path.  `num_slots` feeds
// the cost model.
template <typename Storage, typename Prefetch, typename Update>
void ForEachUpdatedRow(bool all_rows, size_t num_slots, const RowGradientPlan& plan, const Storage& storage,
                       int64_t dim, int64_t scratch_floats, const ShardFn& shard, const Prefetch& prefetch,
                       const Update& update) {
  const int64_t row_cost = RowWalkCost(dim, num_slots);
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
      std::vector<float> g(2 * dim + scratch_floats);  // a gathered gradient, then the scratch
      RunWithRowLoopIsa([&] {
        for (int64_t u = begin; u < end; ++u) {
          if (u + kPrefetchDistance < end) prefetch(plan.row(u + kPrefetchDistance));
          update(plan.row(u), plan.Gradient(u, dim, g.data()), g.data() + dim);
        }
      });
    });
    return;
  }
  // Every walk row (ascending): walk them alongside the touched rows sorted by row.
  const std::vector<int64_t> order = plan.OrderByRow();
  shard(storage.num_walk_rows(), row_cost, [&](int64_t begin, int64_t end) {
    if (begin >= end) return;  // (walk_row(begin) would be past the end of an empty walk)
    // A gathered (or zero) gradient, then the scratch.
    std::vector<float> g(2 * dim + scratch_floats);
    auto it = std::lower_bound(order.begin(), order.end(), storage.walk_row(begin),
                               [&plan](int64_t u, int64_t row) { return plan.row(u) < row; });
    RunWithRowLoopIsa([&] {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t row = storage.walk_row(i);
        if (it != order.end() && plan.row(*it) == row) {
          update(row, plan.Gradient(*it, dim, g.data()), g.data() + dim);
          ++it;
        } else {
          std::fill(g.begin(), g.begin() + dim, 0.0f);
          update(row, g.data(), g.data() + dim);
        }
      }
    });
  });
}

// The buffers' element types and row widths, read once per call (kNumBuffers = 1 + the optimizer's slots).
template <size_t kNumBuffers, typename Storage>
std::tuple<std::array<StorageType, kNumBuffers>, std::array<int64_t, kNumBuffers>> BufferLayout(const Storage& s) {
  std::array<StorageType, kNumBuffers> type{};
  std::array<int64_t, kNumBuffers> width{};
  for (size_t b = 0; b < kNumBuffers; ++b) {
    type[b] = s.type(b);
    width[b] = s.width(b);
  }
  return {type, width};
}

template <size_t kNumBuffers, typename Storage>
void PrefetchBuffers(const Storage& s, const std::array<StorageType, kNumBuffers>& type,
                     const std::array<int64_t, kNumBuffers>& width, int64_t row) {
  for (size_t b = 0; b < kNumBuffers; ++b) {
    // PrefetchRow counts floats: a 16-bit row is half as many floats long.
    PrefetchRow<true>(static_cast<const float*>(s.Row(b, row)), (width[b] * StorageBytes(type[b]) + 3) / 4);
  }
}

// The walk with the pipeline, in place.  kFast: every buffer is float32 and the pipeline is the optimizer alone
// (PipelineIsOptimizerOnly): the loop is compiled with neither the 16-bit branches nor the pipeline's other
// stages, which, even when skipped, made the memory-bound walk of W1 SGD about 1.4x slower.  Any other table
// takes the general loop (float32 buffers in place, 16-bit ones through scratch).
template <bool kFast, typename Optimizer, typename Storage>
void UpdateRowsWith(const Optimizer& optimizer, const TableOptimization& o, float lr, const RowGradientPlan& plan,
                    const Storage& storage, int64_t dim, const RoundingSpec& rounding, const ShardFn& shard) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  constexpr size_t kNumBuffers = kNumSlots + 1;
  const auto [type, width] = BufferLayout<kNumBuffers>(storage);
  auto prefetch = [&](int64_t ahead) { PrefetchBuffers<kNumBuffers>(storage, type, width, ahead); };
  // Each buffer's stream key, once per call (a row's key is then one MixKey).
  std::array<uint64_t, kNumBuffers> stream{};
  if (!kFast && rounding.mode == Rounding::kStochastic) {
    for (size_t b = 0; b < kNumBuffers; ++b) stream[b] = RoundingStreamKey(rounding, static_cast<int64_t>(b));
  }
  auto update = [&](int64_t row, const float* g, float* scratch) {
    std::array<void*, kNumBuffers> stored{};
    std::array<float*, kNumBuffers> rows{};
    for (size_t b = 0; b < kNumBuffers; ++b) {
      stored[b] = storage.Row(b, row);
      if (kFast || type[b] == StorageType::kFloat32) {
        rows[b] = static_cast<float*>(stored[b]);
      } else {
        rows[b] = scratch + (1 + b) * dim;
        LoadStoredRow(type[b], static_cast<const uint16_t*>(stored[b]), rows[b], width[b]);
      }
    }
    if constexpr (kFast) {
      optimizer.UpdateRow(lr, g, rows[0], rows.data() + 1, dim);
      return;
    }
    UpdateRowPipeline(optimizer, o, lr, g, scratch, rows[0], rows.data() + 1, dim);
    for (size_t b = 0; b < kNumBuffers; ++b) {
      if (type[b] == StorageType::kFloat32) continue;
      const uint64_t key =
          rounding.mode == Rounding::kStochastic ? RoundingRowKeyOf(stream[b], storage.rounding_id(row)) : 0;
      StoreStoredRow(type[b], rounding.mode, key, rows[b], static_cast<uint16_t*>(stored[b]), width[b]);
    }
  };
  ForEachUpdatedRow(optimizer.UpdatesAllRows(), kNumSlots, plan, storage, dim,
                    kFast ? 0 : static_cast<int64_t>(kNumBuffers) * dim, shard, prefetch, update);
}

// The same walk as UpdateRowsWith, writing nothing: every row is copied to scratch, updated there, and rounded as
// it would be stored; the first (smallest) row whose accumulated gradient holds a NaN or +-inf, or one of whose
// buffers would hold one after the update where it held none before, is reported.  (A buffer row that is already
// non-finite is not reported again: the check is about what this step would introduce.)
template <typename Optimizer, typename Storage>
NonFiniteUpdate FindNonFiniteUpdateWith(const Optimizer& optimizer, const TableOptimization& o, float lr,
                                        const RowGradientPlan& plan, const Storage& storage, int64_t dim,
                                        const RoundingSpec& rounding, const ShardFn& shard) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  constexpr size_t kNumBuffers = kNumSlots + 1;
  const auto [type, width] = BufferLayout<kNumBuffers>(storage);
  std::mutex mu;
  NonFiniteUpdate first;
  auto report = [&](const NonFiniteUpdate& found) {
    std::lock_guard<std::mutex> lock(mu);
    if (!first.found || found.row < first.row || (found.row == first.row && found.in_gradient)) first = found;
  };
  auto prefetch = [&](int64_t ahead) { PrefetchBuffers<kNumBuffers>(storage, type, width, ahead); };
  auto check = [&](int64_t row, const float* g, float* scratch) {
    const int64_t bad_g = FirstNonFinite(g, dim);
    if (bad_g >= 0) {
      report(NonFiniteUpdate{true, row, true, 0, bad_g, g[bad_g]});
      return;
    }
    std::array<float*, kNumBuffers> rows{};
    std::array<bool, kNumBuffers> was_finite{};
    uint16_t* rounded = reinterpret_cast<uint16_t*>(scratch + (1 + kNumBuffers) * dim);  // dim 16-bit values
    for (size_t b = 0; b < kNumBuffers; ++b) {
      rows[b] = scratch + (1 + b) * dim;
      const void* stored = storage.Row(b, row);
      if (type[b] == StorageType::kFloat32) {
        std::copy_n(static_cast<const float*>(stored), width[b], rows[b]);
      } else {
        LoadStoredRow(type[b], static_cast<const uint16_t*>(stored), rows[b], width[b]);
      }
      was_finite[b] = FirstNonFinite(rows[b], width[b]) < 0;
    }
    UpdateRowPipeline(optimizer, o, lr, g, scratch, rows[0], rows.data() + 1, dim);
    for (size_t b = 0; b < kNumBuffers; ++b) {
      if (!was_finite[b]) continue;
      if (type[b] != StorageType::kFloat32) {
        const uint64_t key = rounding.mode == Rounding::kStochastic
                                 ? RoundingRowKey(rounding, static_cast<int64_t>(b), storage.rounding_id(row))
                                 : 0;
        StoreStoredRow(type[b], rounding.mode, key, rows[b], rounded, width[b]);
        LoadStoredRow(type[b], rounded, rows[b], width[b]);
      }
      const int64_t bad = FirstNonFinite(rows[b], width[b]);
      if (bad >= 0) {
        report(NonFiniteUpdate{true, row, false, static_cast<int64_t>(b), bad, rows[b][bad]});
        return;
      }
    }
  };
  ForEachUpdatedRow(optimizer.UpdatesAllRows(), kNumSlots, plan, storage, dim,
                    static_cast<int64_t>(kNumBuffers + 1) * dim, shard, prefetch, check);
  return first;
}

template <typename Storage>
bool AllFloat32(const Storage& s) {
  for (int64_t b = 0; b < s.num_buffers(); ++b)
    if (s.type(b) != StorageType::kFloat32) return false;
  return true;
}

inline DenseRowStorage DenseStorageOf(const StoredTableBuffers& t, const TableOptimization& o) {
  std::vector<StoredBuffer> buffers{t.weights};
  std::vector<int64_t> widths{t.dim};
  const std::vector<SlotInfo> slots = OptimizerSlots(o.optimizer);
  for (size_t k = 0; k < t.slots.size(); ++k) {
    buffers.push_back(t.slots[k]);
    widths.push_back(SlotWidth(slots[k], t.dim));
  }
  return DenseRowStorage(std::move(buffers), std::move(widths), t.vocabulary_size);
}

inline StoredTableBuffers Stored(const TableBuffers& t) {
  StoredTableBuffers s;
  s.weights = StoredBuffer{t.weights, StorageType::kFloat32};
  for (float* slot : t.slots) s.slots.push_back(StoredBuffer{slot, StorageType::kFloat32});
  s.vocabulary_size = t.vocabulary_size;
  s.dim = t.dim;
  return s;
}

}  // namespace internal

// One optimizer step on any row storage (row_storage.h).  o.optimizer's slot count must equal
// storage.num_buffers() - 1 and buffer 1 + k must be SlotWidth(kSlots[k], dim) wide.
// `touched`: the table's tracker (docs/tracking.md; every plan row < its capacity), or null.  The step is one
// update of it: every row the walk writes is marked, or all rows at once when the optimizer writes every row.
// The caller holds whatever guards the tracker against its readers for the whole call.
template <typename Storage>
void UpdateRows(const TableOptimization& o, float lr, const RowGradientPlan& plan, const Storage& storage, int64_t dim,
                const RoundingSpec& rounding, const ShardFn& shard, TouchedRows* touched = nullptr) {
  const bool fast = internal::AllFloat32(storage) && PipelineIsOptimizerOnly(o);
  std::visit(
      [&](const auto& optimizer) {
        TouchedRows* marks = touched;
        if (touched != nullptr) {
          touched->BeginUpdate();
          if (optimizer.UpdatesAllRows()) {
            touched->MarkAll();
            marks = nullptr;
          }
        }
        if (fast) {
          internal::UpdateRowsWith<true>(optimizer, o, lr, plan, storage, dim, rounding, shard);
        } else {
          internal::UpdateRowsWith<false>(optimizer, o, lr, plan, storage, dim, rounding, shard);
        }
        if (marks != nullptr) {
          for (int64_t u = 0; u < plan.num_rows(); ++u) marks->Mark(plan.row(u));
        }
      },
      o.optimizer);
}

// The numerics check of a step, before it writes anything (see FindNonFiniteUpdateWith).  A caller that must
// leave every table unchanged when the check fires runs it on every table first, then UpdateRows on each: the
// two walks compute bitwise the same rows, so a step the check passes writes exactly the checked values.
template <typename Storage>
NonFiniteUpdate FindNonFiniteUpdate(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                    const Storage& storage, int64_t dim, const RoundingSpec& rounding,
                                    const ShardFn& shard) {
  return std::visit(
      [&](const auto& optimizer) {
        return internal::FindNonFiniteUpdateWith(optimizer, o, lr, plan, storage, dim, rounding, shard);
      },
      o.optimizer);
}

// Static tables (a float32 table and slots, or any storage types), and dynamic tables whose rows are one dense
// array (dynamic_table_update.h); `touched` as UpdateRows'.  Compiled once, in table_update.cc, for both.
void UpdateTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, const StoredTableBuffers& t,
                 const ShardFn& shard, TouchedRows* touched = nullptr);
inline void UpdateTable(const TableOptimization& o, float lr, const RowGradientPlan& plan, const TableBuffers& t,
                        const ShardFn& shard, TouchedRows* touched = nullptr) {
  UpdateTable(o, lr, plan, internal::Stored(t), shard, touched);
}
inline NonFiniteUpdate FindNonFiniteUpdate(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                           const StoredTableBuffers& t, const ShardFn& shard) {
  return FindNonFiniteUpdate(o, lr, plan, internal::DenseStorageOf(t, o), t.dim, t.rounding, shard);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TABLE_UPDATE_H_
