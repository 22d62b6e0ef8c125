// The optimizer step of a tiered table (docs/tiered_tables.md): the one row walk of table_update.h over rows made
// resident and pinned in a TieredRowCache.  As dynamic_table_update.h does for arenas, this is an adapter with no
// loop of its own: clipping, weight decay, every optimizer, the work split and the 16-bit load/round/store are
// the static tables' own, and rounding_id(row) = row as for DenseRowStorage, so a tiered table trains bitwise
// like the in-memory table it stands for.
//
// Lazy optimizers: the step's distinct rows are acquired (pinned) at once, the walk updates them in the cache,
// and they are released dirty.  A step whose rows exceed the cache's capacity is refused before anything is
// evicted or written.  Optimizers whose UpdatesAllRows() is true walk the whole table in windows of `capacity`
// consecutive rows (acquire, walk the window with the plan's rows inside it, release), which gives the same
// numbers since rows are independent.  An I/O error in a later window leaves the earlier windows updated (the
// error says so; restore from the last checkpoint).
#ifndef TF_EMBED_OPS_CC_LIB_TIERED_ROW_STORAGE_H_
#define TF_EMBED_OPS_CC_LIB_TIERED_ROW_STORAGE_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cc/lib/distinct_rows.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/row_storage.h"
#include "cc/lib/shard.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/table_update.h"
#include "cc/lib/tiered_row_cache.h"

namespace tf_embed_ops {

// Row storage (row_storage.h) over pinned records, addressed one of three ways:
//  - by row: Row(b, row) is the address of buffer b inside row's resident record, found through a map built here
//    once per step (immutable, so the walk's threads read it without a lock);
//  - a window (consecutive rows, indexed directly): what a non-lazy walk walks;
//  - by position (ByPosition): the walk's "rows" are positions in pin.rows (a plan built over a DistinctBatch's
//    positions), so Row(b, p) is records[p] + offset, one load, and rounding_id(p) = pin.rows[p] keys stochastic
//    rounding by the table's row, as the in-memory table does.  A lazy step of a static table walks this way.
class TieredRowStorage {
 public:
  // `pin` must stay pinned while the storage is used.  window: pin.rows are consecutive and are the walk rows.
  TieredRowStorage(const TieredRowLayout& layout, const TieredPin& pin, bool window)
      : TieredRowStorage(layout, pin, window ? Index::kWindow : Index::kRow) {}
  static TieredRowStorage ByPosition(const TieredRowLayout& layout, const TieredPin& pin) {
    return TieredRowStorage(layout, pin, Index::kPosition);
  }

  int64_t num_buffers() const { return layout_.num_buffers(); }
  StorageType type(size_t b) const { return layout_.types[b]; }
  int64_t width(size_t b) const { return layout_.widths[b]; }
  void* Row(size_t b, int64_t row) const { return RecordOf(row) + offsets_[b]; }
  int64_t num_walk_rows() const { return index_ == Index::kWindow ? static_cast<int64_t>(records_.size()) : 0; }
  int64_t walk_row(int64_t i) const { return first_ + i; }
  uint64_t rounding_id(int64_t row) const {
    return static_cast<uint64_t>(index_ == Index::kPosition ? (*rows_)[row] : row);
  }

  // The record of a pinned row (or position) (the lookup reads buffer 0 through it).
  char* RecordOf(int64_t row) const {
    if (index_ == Index::kPosition) return records_[row];
    if (index_ == Index::kWindow) return records_[row - first_];
    size_t h = Home(row);
    while (map_[h].row != row) h = (h + 1) & mask_;
    return map_[h].record;
  }

 private:
  enum class Index { kRow, kWindow, kPosition };
  TieredRowStorage(const TieredRowLayout& layout, const TieredPin& pin, Index index)
      : layout_(layout),
        records_(pin.records),
        rows_(&pin.rows),
        index_(index),
        first_(pin.rows.empty() ? 0 : pin.rows[0]) {
    for (int64_t b = 0; b < layout.num_buffers(); ++b) offsets_.push_back(layout.offset(b));
    if (index_ != Index::kRow) return;
    size_t size = 2;
    while (size < 2 * pin.rows.size()) size <<= 1;
    mask_ = size - 1;
    map_.assign(size, Entry{-1, nullptr});
    for (size_t i = 0; i < pin.rows.size(); ++i) {
      size_t h = Home(pin.rows[i]);
      while (map_[h].row >= 0) h = (h + 1) & mask_;
      map_[h] = Entry{pin.rows[i], pin.records[i]};
    }
  }

  struct Entry {
    int64_t row;
    char* record;
  };
  size_t Home(int64_t row) const {
    return static_cast<size_t>((static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ULL) >> 20) & mask_;
  }

  const TieredRowLayout& layout_;
  const std::vector<char*>& records_;
  const std::vector<int64_t>* rows_;
  Index index_;
  int64_t first_;
  std::vector<int64_t> offsets_;
  std::vector<Entry> map_;
  size_t mask_ = 0;
};

// The plan's distinct rows, ascending (what a lazy step acquires); they are in [0, num_rows).
inline std::vector<int64_t> PlanRows(const RowGradientPlan& plan, int64_t num_rows) {
  std::vector<int64_t> rows(plan.num_rows());
  for (int64_t u = 0; u < plan.num_rows(); ++u) rows[u] = plan.row(u);
  SortDistinctRows(&rows, num_rows);
  return rows;
}

// A lazy step's rows pinned (refused with TooManyRows when they exceed the capacity; `what` names the table).
inline absl::Status AcquirePlanRows(const RowGradientPlan& plan, TieredRowCache* cache, const std::string& what,
                                    TieredPin* pin) {
  if (plan.num_rows() > cache->capacity()) return cache->TooManyRows(plan.num_rows(), what);
  return cache->Acquire(PlanRows(plan, cache->num_rows()), pin);
}

// The walk of a lazy step over rows AcquirePlanRows pinned (cannot fail); the caller releases them dirty.
inline void UpdatePinnedRows(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                             const TieredRowLayout& layout, const TieredPin& pin, const RoundingSpec& rounding,
                             const ShardFn& shard) {
  UpdateRows(o, lr, plan, TieredRowStorage(layout, pin, /*window=*/false), layout.widths[0], rounding, shard);
}

// A lazy step by position: `plan` was built over positions in pin.rows (a DistinctBatch's positions, pin.rows its
// rows), so the walk reads each record with one load (TieredRowStorage::ByPosition).  Same numbers as
// UpdatePinnedRows over the rows themselves: the plan lists the same rows in the same order (positions are a
// bijection that keeps the rows' order) and rounding is keyed by the row.  Cannot fail; the caller releases dirty.
inline void UpdatePinnedPositions(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                  const TieredRowLayout& layout, const TieredPin& pin, const RoundingSpec& rounding,
                                  const ShardFn& shard) {
  UpdateRows(o, lr, plan, TieredRowStorage::ByPosition(layout, pin), layout.widths[0], rounding, shard);
}

// The numerics check of that step (writes nothing); a found row is returned as the table's row.
inline NonFiniteUpdate FindNonFinitePinnedPositions(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                                    const TieredRowLayout& layout, const TieredPin& pin,
                                                    const RoundingSpec& rounding, const ShardFn& shard) {
  NonFiniteUpdate found =
      FindNonFiniteUpdate(o, lr, plan, TieredRowStorage::ByPosition(layout, pin), layout.widths[0], rounding, shard);
  if (found.found) found.row = pin.rows[found.row];
  return found;
}

namespace internal {

// fn(storage) over the rows the optimizer reads: the plan's rows at once (lazy), or every row in windows of
// the cache's capacity (UpdatesAllRows).  `dirty`: the rows are released dirty.  Stops at fn returning true.
template <typename Fn>
absl::Status ForEachTieredWindow(const TableOptimization& o, const RowGradientPlan& plan, TieredRowCache* cache,
                                 const std::string& what, bool dirty, const Fn& fn) {
  const TieredRowLayout& layout = cache->layout();
  TieredPin pin;
  if (!OptimizerUpdatesAllRows(o.optimizer)) {
    if (const absl::Status s = AcquirePlanRows(plan, cache, what, &pin); !s.ok()) return s;
    fn(TieredRowStorage(layout, pin, /*window=*/false));
    cache->Release(&pin, dirty);
    return absl::OkStatus();
  }
  for (int64_t first = 0; first < cache->num_rows(); first += cache->capacity()) {
    std::vector<int64_t> rows(std::min(cache->capacity(), cache->num_rows() - first));
    std::iota(rows.begin(), rows.end(), first);
    if (const absl::Status s = cache->Acquire(std::move(rows), &pin); !s.ok()) {
      if (first == 0 || !dirty) return s;
      return absl::Status(s.code(), absl::StrCat(s.message(), " (rows [0, ", first, ") of ", what,
                                                 " were updated by this step already: restore the table from the "
                                                 "last checkpoint)"));
    }
    const bool stop = fn(TieredRowStorage(layout, pin, /*window=*/true));
    cache->Release(&pin, dirty);
    if (stop) break;
  }
  return absl::OkStatus();
}

}  // namespace internal

// One optimizer step on a tiered table (see above).  o.optimizer's slots must be the layout's buffers 1.. (the
// kernels check them against the config).  Errors: TooManyRows, or the file's (I/O, CRC) from making rows
// resident; a lazy step that fails changed no row.
inline absl::Status UpdateTieredTable(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                      TieredRowCache* cache, const RoundingSpec& rounding, const ShardFn& shard,
                                      const std::string& what) {
  const int64_t dim = cache->layout().widths[0];
  return internal::ForEachTieredWindow(o, plan, cache, what, /*dirty=*/true, [&](const TieredRowStorage& storage) {
    UpdateRows(o, lr, plan, storage, dim, rounding, shard);
    return false;
  });
}

// The numerics check of that step (table_update.h's FindNonFiniteUpdate); writes no row (rows are made
// resident, clean).
inline absl::StatusOr<NonFiniteUpdate> FindNonFiniteTieredUpdate(const TableOptimization& o, float lr,
                                                                 const RowGradientPlan& plan, TieredRowCache* cache,
                                                                 const RoundingSpec& rounding, const ShardFn& shard,
                                                                 const std::string& what) {
  const int64_t dim = cache->layout().widths[0];
  NonFiniteUpdate found;
  const absl::Status s =
      internal::ForEachTieredWindow(o, plan, cache, what, /*dirty=*/false, [&](const TieredRowStorage& storage) {
        found = FindNonFiniteUpdate(o, lr, plan, storage, dim, rounding, shard);
        return found.found;  // windows ascend: the first found is the smallest row
      });
  if (!s.ok()) return s;
  return found;
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TIERED_ROW_STORAGE_H_
