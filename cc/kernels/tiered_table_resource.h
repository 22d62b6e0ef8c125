// A tiered table as a TensorFlow resource (docs/tiered_tables.md, "Ops"): one cc/lib TieredRowCache (which owns
// the row file), the attrs it was made with (a second handle op under the same name must give the same), and a
// reader/writer lock.
//
// Locking: the cache is thread-safe by itself; mu() orders what it cannot know about.  Ops that change rows (the
// fused update, WriteRows, Flush) hold mu() exclusively for the whole call, ops that read rows (lookup, ReadRows)
// hold it shared; Prefetch takes no table lock (it only moves unpinned rows, under the cache's own mutex), so it
// runs beside an update's row walk.  Ops over several tables lock them in address order (TieredTableLocks).
#ifndef TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_RESOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_RESOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cc/lib/tiered_row_cache.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tsl/platform/mutex.h"
#include "tsl/platform/thread_annotations.h"

namespace tf_embed_ops {

class TieredTableResource : public tensorflow::ResourceBase {
 public:
  // `attrs`: the handle op's attrs as text, compared by CheckSameAttrs.
  TieredTableResource(std::unique_ptr<TieredRowCache> cache, std::string attrs);
  // Writes dirty rows back (a failure is logged: a destructor cannot return it).
  ~TieredTableResource() override;

  std::string DebugString() const override;
  int64_t MemoryUsed() const override;

  const std::string& name() const { return cache_->table(); }
  int64_t num_rows() const { return cache_->num_rows(); }
  int64_t dim() const { return cache_->layout().widths[0]; }
  int64_t num_slots() const { return cache_->layout().num_buffers() - 1; }
  int64_t slot_width(int64_t k) const { return cache_->layout().widths[1 + k]; }
  const TieredRowLayout& layout() const { return cache_->layout(); }
  TieredRowCache* cache() const { return cache_.get(); }

  // OK when `attrs` are the ones this table was made with; else InvalidArgument showing both.
  absl::Status CheckSameAttrs(const std::string& attrs) const;

  tsl::mutex* mu() const TF_LOCK_RETURNED(mu_) { return &mu_; }

 private:
  const std::unique_ptr<TieredRowCache> cache_;
  const std::string attrs_;
  mutable tsl::mutex mu_;
};

using TieredTableRef = tensorflow::core::RefCountPtr<TieredTableResource>;

// The tiered table behind resource input `input`; `what` names it in errors.
absl::Status LookupTieredTable(tensorflow::OpKernelContext* ctx, int input, const std::string& what,
                               TieredTableRef* out);

// Holds the mu() of several tables (each once, in address order), exclusively or shared.
class TieredTableLocks {
 public:
  TieredTableLocks(const std::vector<TieredTableRef>& tables, bool exclusive);
  ~TieredTableLocks();
  TieredTableLocks(const TieredTableLocks&) = delete;
  TieredTableLocks& operator=(const TieredTableLocks&) = delete;

 private:
  std::vector<tsl::mutex*> held_;
  bool exclusive_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_RESOURCE_H_
