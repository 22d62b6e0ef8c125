// A dynamic-vocabulary table as a TensorFlow resource (docs/dynamic_tables_internals.md, "Ops"): one cc/lib
// DynamicTable, the dtype its keys arrive in, the options it was created with (a second handle op under the same name
// must ask for the same), a reader/writer lock, and the counts of the latest step for observability.
//
// Locking: ops that change the table (training lookup, fused update with its end-of-step eviction, evict,
// import) hold mu() exclusively for the whole call; ops that only read (serving lookup, find, export, stats)
// hold it shared.  Ops over several tables lock them in address order (DynamicTableLocks), so two multi-table
// ops never deadlock.  name(), key_dtype(), dim() and num_slots() never change and need no lock.
#ifndef TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_RESOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_RESOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cc/lib/dynamic_lookup_memo.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/tiered_dynamic_table.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/types.h"
#include "tsl/platform/mutex.h"
#include "tsl/platform/thread_annotations.h"

namespace tf_embed_ops {

// The creation options as (name, value) text pairs, in a fixed order: what "the same options" means.
using DynamicTableOptionList = std::vector<std::pair<std::string, std::string>>;

// What the latest step did: the step number is the latest one a training lookup, a fused update's end-of-step
// eviction or an explicit eviction named; the counts are summed over every such call at that step.
struct DynamicTableStepStats {
  int64_t step = -1;
  int64_t inserts = 0;
  int64_t refused = 0;
  int64_t evictions = 0;
};

class DynamicTableResource : public tensorflow::ResourceBase {
 public:
  DynamicTableResource(std::unique_ptr<DynamicTable> table, tensorflow::DataType key_dtype,
                       DynamicTableOptionList options);
  // A tiered dynamic table (docs/tiered_tables.md): the keys and metadata in DRAM, the rows in a row file behind
  // a DRAM cache.  table() / reader() are its DynamicTable (external rows); the ops that read or write row values
  // go through tiered().
  DynamicTableResource(std::unique_ptr<TieredDynamicTable> tiered, tensorflow::DataType key_dtype,
                       DynamicTableOptionList options);

  std::string DebugString() const override;
  int64_t MemoryUsed() const override;

  const std::string& name() const { return name_; }
  tensorflow::DataType key_dtype() const { return key_dtype_; }
  int64_t dim() const { return dim_; }
  int64_t num_slots() const { return num_slots_; }
  int64_t slot_width(int64_t slot) const { return slot_widths_[slot]; }

  // OK when `requested` equals the options this table was created with; else InvalidArgument naming the table
  // and the first option that differs.
  absl::Status CheckSameOptions(const DynamicTableOptionList& requested) const;

  tsl::mutex* mu() const TF_LOCK_RETURNED(mu_) { return &mu_; }
  DynamicTable* table() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return table_; }
  const DynamicTable& reader() const TF_SHARED_LOCKS_REQUIRED(mu_) { return *table_; }
  // The tiered table, or null for an in-memory one (never changes).  Its row reads (PinRows, ReadRows, Export,
  // RowStats) may run under the shared lock (the cache has its own mutex); everything else needs mu() exclusively.
  TieredDynamicTable* tiered() const { return tiered_.get(); }
  // Bytes of DRAM the table holds (its rows or its cache, metadata, index, policies).
  int64_t memory_bytes() const TF_SHARED_LOCKS_REQUIRED(mu_);

  // Observability (DynamicTableStats): the calls that change the table record what they did.
  void RecordLookup(int64_t step, const BatchStats& stats) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordEvictions(int64_t step, int64_t evicted) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetStepStats() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) { step_stats_ = DynamicTableStepStats{}; }
  DynamicTableStepStats step_stats() const TF_SHARED_LOCKS_REQUIRED(mu_) { return step_stats_; }

  // The latest training lookup's keys and rows, for the fused update of the same step (dynamic_lookup_memo.h).
  const LookupMemo& lookup_memo() const TF_SHARED_LOCKS_REQUIRED(mu_) { return lookup_memo_; }
  LookupMemo* mutable_lookup_memo() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return &lookup_memo_; }

 private:
  // Moves the per-step record to `step` when it names a later step than the one recorded.
  void AdvanceTo(int64_t step) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const tensorflow::DataType key_dtype_;
  const int64_t dim_;
  const int64_t num_slots_;
  const std::vector<int64_t> slot_widths_;
  const DynamicTableOptionList options_;
  mutable tsl::mutex mu_;
  const std::unique_ptr<DynamicTable> owned_;         // an in-memory table, or null
  const std::unique_ptr<TieredDynamicTable> tiered_;  // a tiered table, or null
  DynamicTable* const table_ TF_PT_GUARDED_BY(mu_);   // the one of the two
  DynamicTableStepStats step_stats_ TF_GUARDED_BY(mu_);
  LookupMemo lookup_memo_ TF_GUARDED_BY(mu_);
};

// Locks tables in address order (each once), exclusively or shared, for the lifetime of the object.
class DynamicTableLocks {
 public:
  DynamicTableLocks(std::vector<DynamicTableResource*> tables, bool exclusive);
  ~DynamicTableLocks();
  DynamicTableLocks(const DynamicTableLocks&) = delete;
  DynamicTableLocks& operator=(const DynamicTableLocks&) = delete;

 private:
  std::vector<DynamicTableResource*> tables_;
  bool exclusive_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_RESOURCE_H_
