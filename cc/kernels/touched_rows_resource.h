// Touched-row tracking of static tables (docs/tracking.md): a TouchedRows per tracked table, found by the fused
// update through a process-wide registry keyed by the table's resource: the variable of an in-memory table, the
// TieredTableResource of a tiered one (so enabling tracking needs no new input on the training op, and a step
// function traced before tracking was enabled marks rows too).
//
// Lifetime: a TouchedRowsResource holds a reference to its table resource (the registry key cannot be reused
// while the entry exists) and is owned by the reference-counting handles TfEmbed>TouchedRowsTrack returns;
// tracking a table twice returns the same resource, so every consumer shares one set of stamps and keeps its own
// version.  The last handle gone, the entry leaves the registry.
#ifndef TF_EMBED_OPS_CC_KERNELS_TOUCHED_ROWS_RESOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_TOUCHED_ROWS_RESOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/touched_rows.h"
#include "cc/lib/touched_rows_update.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/lib/core/refcount.h"
#include "tsl/platform/mutex.h"
#include "tsl/platform/thread_annotations.h"

namespace tf_embed_ops {

class TouchedRowsResource : public tensorflow::ResourceBase {
 public:
  std::string DebugString() const override;
  int64_t MemoryUsed() const override;

  int64_t num_rows() const { return num_rows_; }
  // A new reference unless the last one is being dropped (the registry holds no reference of its own).
  bool TryAcquire() const { return TryRef(); }
  tsl::mutex* mu() const TF_LOCK_RETURNED(mu_) { return &mu_; }
  TouchedRows* rows() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return &rows_; }

  // The tracker of `table` (a tf Var: rows = its first dimension; a TieredTableResource: its rows), created on
  // first use; the caller owns one reference.
  static absl::StatusOr<TouchedRowsResource*> Track(tensorflow::ResourceBase* table, int64_t num_rows);

 private:
  TouchedRowsResource(tensorflow::ResourceBase* table, int64_t num_rows);
  ~TouchedRowsResource() override;

  tensorflow::ResourceBase* const table_;  // one reference held
  const int64_t num_rows_;
  bool allocated_ = false;  // set once by the constructor
  mutable tsl::mutex mu_;
  TouchedRows rows_ TF_GUARDED_BY(mu_);
};

// The tracker of `table` held for one fused update that marks its rows after its walk (table_update.h's `touched`):
// found and locked at construction, under the table's exclusive lock; unlocked at destruction.  rows() is null
// when `table` is not tracked (one atomic load).  `table`: the variable of an in-memory table.
class TrackedUpdate {
 public:
  explicit TrackedUpdate(const tensorflow::ResourceBase* table);
  ~TrackedUpdate();
  TrackedUpdate(const TrackedUpdate&) = delete;
  TrackedUpdate& operator=(const TrackedUpdate&) = delete;

  TouchedRows* rows() const { return rows_; }

 private:
  tensorflow::core::RefCountPtr<TouchedRowsResource> resource_;
  TouchedRows* rows_ = nullptr;
};

// The fused update's hook, after the table's rows were written (under the table's exclusive lock): marks the
// plan's unique rows, or every row when the optimizer updated them all.  A no-op (one atomic load) when no
// table is tracked.  `table`: the TieredTableResource of a tiered table.
void MarkTouchedRows(const tensorflow::ResourceBase* table, const RowGradientPlan& plan, bool all_rows);

// The same for a lazy step whose rows are listed (a tiered table's pinned rows, its plan being over their
// positions): marks `rows`.
void MarkTouchedRowList(const tensorflow::ResourceBase* table, const std::vector<int64_t>& rows);

// Rows [first, first + n) of `table` written by other means than the fused update (a tiered table's
// TieredTableWriteRows: initialisation, restore); every row when the range is the whole table.
void MarkTouchedRowRange(const tensorflow::ResourceBase* table, int64_t first, int64_t n);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_TOUCHED_ROWS_RESOURCE_H_
