// The table source (table_source.h) of the tiered ops: tiered tables (docs/tiered_tables.md), rows in a row file
// behind a DRAM cache (cc/lib/tiered_row_cache.h), ids in [0, num_rows).
//   Lookup: each table's distinct ids (TieredRowCache::DistinctRows, usually found by the batch's prefetch)
//           against its cache's capacity, then under the tables' shared locks pinned; each id's record is found
//           by its position among the distinct rows (TieredRowStorage::ByPosition), and released clean.
//   Update: a lazy table's plan is over the ids' positions among its distinct rows, checked against its cache's
//           capacity before any row is made resident, evicted or written; under the exclusive locks (shared with
//           validate_only) the rows of all lazy tables are pinned before anything is checked or written (an I/O
//           error or CRC mismatch then changes no row), walked, and released dirty.  Tables whose optimizer
//           updates every row are walked window by window after them.  Each table's tracker marks the rows.
#ifndef TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_SOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/table_source.h"
#include "cc/kernels/tiered_table_resource.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/tiered_row_storage.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_embed_ops {

class TieredTableSource : public TableSourceBase {
 public:
  static constexpr const char* kIdNoun = "ids";

  struct Attrs {
    std::vector<RoundingSpec> rounding;  // per table (update ops); the step is the call's
  };
  static absl::Status ReadAttrs(tensorflow::OpKernelConstruction* ctx, const FusedEmbeddingAttrs& attrs,
                                const FusedInputs& inputs, bool update, Attrs* out);

  TieredTableSource(tensorflow::OpKernelContext* ctx, const FusedEmbeddingAttrs& attrs, const FusedInputs& inputs,
                    const Attrs& source_attrs)
      : TableSourceBase(ctx, attrs, inputs), source_attrs_(source_attrs), pins_(attrs.num_tables) {}
  // Pins still held (a refused or validate-only call) are released clean, before the locks.
  ~TieredTableSource();
  TieredTableSource(const TieredTableSource&) = delete;
  TieredTableSource& operator=(const TieredTableSource&) = delete;

  absl::Status Open(bool update);

  // The lookup.
  absl::Status PrepareLookup(const FusedFeatures& features);
  absl::Status ReadRows(const FusedFeatures& features);
  template <typename Fn>
  void WithRows(int t, int f, const FusedFeatures&, const Fn& fn) const {
    const TieredRowStorage* storage = storages_[t].get();
    const int64_t* positions = distinct_[t]->positions.data() + first_id_[f];
    fn(storage->type(0), [storage, positions](int64_t i) -> const void* { return storage->Row(0, positions[i]); });
  }

  // The update.
  absl::Status Plan(const FusedFeatures& features, bool validate_only, EmbeddingWorkspace* ws);
  absl::Status Pin(bool validate_only);
  absl::StatusOr<NonFiniteUpdate> FindNonFinite(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard);
  const int64_t* RowIds(int f, const FusedFeatures& features) const { return features.batches[f].ids; }
  std::vector<int> UpdateOrder() const;
  absl::Status Update(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard);

 private:
  bool Lazy(int t) const { return distinct_[t] != nullptr; }
  std::string What(int t) const;
  RoundingSpec Rounding(int t) const;
  // Table t's distinct ids (in feature order), refused when they exceed its cache; `what` names the call.
  absl::Status FindDistinct(const FusedFeatures& features, int t, const std::string& what);
  absl::Status PinDistinct();

  const Attrs& source_attrs_;
  int64_t step_ = 0;
  std::vector<TieredTableRef> tables_;
  std::vector<int64_t> first_id_;                               // per feature, among its table's ids
  std::vector<std::shared_ptr<const DistinctBatch>> distinct_;  // per table (an update: lazy tables only)
  std::optional<TieredTableLocks> locks_;
  std::vector<TieredPin> pins_;                              // per table; after locks_, so released before them
  std::vector<std::unique_ptr<TieredRowStorage>> storages_;  // the lookup's, over pins_
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_SOURCE_H_
