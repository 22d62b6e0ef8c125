// The table source (table_source.h) of the dynamic ops: dynamic tables, ids are keys (string keys fingerprinted,
// dynamic_table_kernel_util.h), kept in memory or tiered (rows in a row file behind a DRAM cache, the keys and
// their metadata in memory).  DynamicRows is the one place that asks which; the kernels see one kind of table.
//   Lookup: per table, the keys of all its features (feature order) -> rows: FindOrInsert for a training lookup
//           (admission counted over the whole step; a tiered table's batch checked against its cache and its file
//           grown for every table before any inserts a key; under exclusive locks), Find otherwise (shared).  A
//           key without a row reads a row of zeros; a tiered table's rows are read pinned in its cache.
//   Update: under the exclusive locks (shared with validate_only), keys -> rows, taken from the step's training
//           lookup when its keys and the table's mapping are unchanged (LookupMemo), else with Find (never
//           inserting); the plan is over rows (keys without a row contribute nothing).  A tiered table's lazy
//           step must fit its cache (refused before any table is written).  After the walk, the table's
//           touched-row marks and its end-of-step eviction.
#ifndef TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_SOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/table_source.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/tiered_dynamic_table.h"
#include "cc/lib/tiered_row_storage.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_embed_ops {

// One dynamic table's rows, in memory or tiered.  The caller holds the table's lock (exclusive for the
// mutating calls: FindOrInsert, Update).  Rows pinned by Pin are released clean by the destructor.
class DynamicRows {
 public:
  explicit DynamicRows(DynamicTableResource* resource) : resource_(resource), tiered_(resource->tiered()) {}
  ~DynamicRows();
  DynamicRows(const DynamicRows&) = delete;
  DynamicRows& operator=(const DynamicRows&) = delete;

  const DynamicTable& reader() const { return resource_->reader(); }
  // A training lookup's checks of a tiered table (its batch fits its cache, its file has room), run on every
  // table before the first FindOrInsert; no-op in memory.
  absl::Status Prepare(const int64_t* keys, int64_t n);
  absl::Status FindOrInsert(const int64_t* keys, int64_t n, int64_t step, int64_t* rows, BatchStats* stats);
  // A tiered table's records of `rows` (kNotAdmitted allowed) pinned for Weights; no-op in memory.
  absl::Status Pin(const std::vector<int64_t>& rows);
  // fn(weights_of): weights_of(row) is the address of buffer 0 of a row (an admitted one; pinned when tiered).
  // Compiled once for each way of addressing a row (a tiered table's pinned records, an in-memory table's one
  // array, its chunks), so no loop has another's branch.
  template <typename Fn>
  void WithWeights(const Fn& fn) const {
    if (records_ != nullptr) {
      const TieredRowStorage* records = records_.get();
      fn([records](int64_t row) -> const void* { return records->Row(0, row); });
    } else if (const char* dense = static_cast<const char*>(reader().DenseWeights()); dense != nullptr) {
      // No chunk directory between a row and its address: the gather's prefetches start sooner.
      const int64_t row_bytes = reader().dim() * StorageBytes(reader().buffer_type(0));
      fn([dense, row_bytes](int64_t row) -> const void* { return dense + row * row_bytes; });
    } else {
      const DynamicTable* table = &reader();
      fn([table](int64_t row) -> const void* { return table->BufferRow(0, row); });
    }
  }

  // A lazy step of a tiered table pins its rows at once: refused when they do not fit its cache (a non-lazy
  // step walks in windows that always fit).
  absl::Status CheckCapacity(const TableOptimization& o, const RowGradientPlan& plan) const;
  absl::StatusOr<NonFiniteUpdate> FindNonFinite(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                                const RoundingSpec& rounding, const ShardFn& shard) const;
  // The walk (a tiered table's over its cache: fails only on I/O, and a lazy step then changed no row).
  absl::Status Update(const TableOptimization& o, float lr, const RowGradientPlan& plan, const RoundingSpec& rounding,
                      const ShardFn& shard);

 private:
  DynamicTableResource* resource_;
  TieredDynamicTable* tiered_;  // null in memory
  TieredPin pin_;
  std::unique_ptr<TieredRowStorage> records_;  // over pin_, once pinned
};

class DynamicTableSource : public TableSourceBase {
 public:
  static constexpr const char* kIdNoun = "keys";

  struct Attrs {
    bool training = false;  // a lookup: insert the keys, count them for admission
  };
  static absl::Status ReadAttrs(tensorflow::OpKernelConstruction* ctx, const FusedEmbeddingAttrs& attrs,
                                const FusedInputs& inputs, bool update, Attrs* out);

  DynamicTableSource(tensorflow::OpKernelContext* ctx, const FusedEmbeddingAttrs& attrs, const FusedInputs& inputs,
                     const Attrs& source_attrs)
      : TableSourceBase(ctx, attrs, inputs), source_attrs_(source_attrs), string_keys_(attrs.num_features) {}

  absl::Status Open(bool update);
  absl::Status ReadIds(int f, const std::string& label, FeatureBatch* batch);
  absl::Status CheckIds(int, const std::string&, const FeatureBatch&) const { return absl::OkStatus(); }

  // The lookup.
  absl::Status PrepareLookup(const FusedFeatures&) { return absl::OkStatus(); }
  absl::Status ReadRows(const FusedFeatures& features);
  template <typename Fn>
  void WithRows(int t, int f, const FusedFeatures&, const Fn& fn) const {
    const int64_t* rows = table_rows_[t].data() + first_id_[f];
    const void* zero_row = zeros_.data();  // all-zero bits are +0 in every storage type
    rows_[t]->WithWeights([&](const auto& weights_of) {
      fn(rows_[t]->reader().buffer_type(0), [&weights_of, rows, zero_row](int64_t i) -> const void* {
        return rows[i] == DynamicTable::kNotAdmitted ? zero_row : weights_of(rows[i]);
      });
    });
  }

  // The update.
  absl::Status Plan(const FusedFeatures& features, bool validate_only, EmbeddingWorkspace* ws);
  absl::StatusOr<NonFiniteUpdate> FindNonFinite(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard);
  const int64_t* RowIds(int f, const FusedFeatures&) const { return feature_rows_[f].data(); }
  std::string RowLabel(int t, int64_t row) const;
  absl::Status Update(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard);

 private:
  // The tables' locks, and a DynamicRows per table.
  void Lock(bool exclusive);
  // How a 16-bit table's rows are rounded at this step: the table's own mode and seed (its initializer's, mixed
  // differently by RoundingRowKey), the step, and the table's index in the config.
  RoundingSpec Rounding(int t) const;

  const Attrs& source_attrs_;
  int64_t step_ = 0;
  std::vector<DynamicTableRef> tables_;
  std::vector<std::vector<int64_t>> string_keys_;  // per feature: fingerprints of string keys
  std::optional<DynamicTableLocks> locks_;
  std::vector<std::unique_ptr<DynamicRows>> rows_;  // per table; after locks_, so unpinned before the unlock
  // The lookup: per table its features' keys' rows (feature order); each feature's first among them.
  std::vector<std::vector<int64_t>> table_rows_;
  std::vector<int64_t> first_id_;
  std::vector<float> zeros_;  // the row of a key without a row
  // The update: per feature its keys' rows.
  std::vector<std::vector<int64_t>> feature_rows_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_SOURCE_H_
