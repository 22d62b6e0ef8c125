// The table source (table_source.h) of the static ops: TensorFlow resource variables [vocabulary_size, dim] of
// float32, bfloat16 or float16 (docs/low_precision.md), and for an update each table's optimizer slots
// (slots[S], flat in table order).  Locked in address order through training_op_helpers: shared to look up,
// exclusive to update; their dtypes are checked before the lock (whose copy-on-read switch assumes the dtype).
#ifndef TF_EMBED_OPS_CC_KERNELS_DENSE_TABLE_SOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_DENSE_TABLE_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/table_source.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/table_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tf_embed_ops {

class DenseTableSource : public TableSourceBase {
 public:
  static constexpr const char* kIdNoun = "ids";

  struct Attrs {
    std::vector<int> first_slot;         // per table: its first slot in slots[S]
    std::vector<RoundingSpec> rounding;  // per table; the step is the call's
    bool has_rounding_step = false;      // SendTPUEmbeddingGradientsV2
  };
  // An update op's: S against the config's slots, the rounding attrs, and whether a rounding_step follows.
  static absl::Status ReadAttrs(tensorflow::OpKernelConstruction* ctx, const FusedEmbeddingAttrs& attrs,
                                const FusedInputs& inputs, bool update, Attrs* out);

  DenseTableSource(tensorflow::OpKernelContext* ctx, const FusedEmbeddingAttrs& attrs, const FusedInputs& inputs,
                   const Attrs& source_attrs)
      : TableSourceBase(ctx, attrs, inputs), source_attrs_(source_attrs) {}

  absl::Status Open(bool update) {
    update_ = update;
    return absl::OkStatus();
  }

  // The lookup.
  absl::Status PrepareLookup(const FusedFeatures& features);
  absl::Status ReadRows(const FusedFeatures&) { return absl::OkStatus(); }
  template <typename Fn>
  void WithRows(int t, int f, const FusedFeatures& features, const Fn& fn) const {
    const size_t v = table_var_[t];
    const char* base = values_[v].tensor_data().data();
    const int64_t row_bytes = attrs_.config.tables[t].dimension * StorageBytes(var_storage_[v]);
    const int64_t* ids = features.batches[f].ids;
    fn(var_storage_[v], [base, row_bytes, ids](int64_t i) -> const void* { return base + ids[i] * row_bytes; });
  }

  // The update.
  absl::Status Validate(const FusedFeatures& features);
  absl::Status Plan(const FusedFeatures& features, bool validate_only, EmbeddingWorkspace* ws);
  absl::StatusOr<NonFiniteUpdate> FindNonFinite(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard);
  const int64_t* RowIds(int f, const FusedFeatures& features) const { return features.batches[f].ids; }
  absl::Status Update(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard);

 private:
  // Tables (and, for an update, each table's slots after it): their inputs, names, dtypes checked; an update's
  // must be distinct variables.
  absl::Status CheckVariables();
  // Under the locks: the variables' tensors and their shapes.
  absl::Status ReadLockedVariables();
  absl::Status ReadRoundingStep();
  StoredTableBuffers Buffers(int t) const;

  const Attrs& source_attrs_;
  bool update_ = false;
  int64_t rounding_step_ = 0;
  std::vector<size_t> table_var_;  // per table: its variable's index below (its slots follow it)
  std::vector<int> var_inputs_;
  std::vector<std::string> var_names_;  // for errors
  std::vector<const TableSpec*> var_tables_;
  std::vector<const SlotInfo*> var_slots_;  // nullptr for a table (its shape check depends on it)
  std::vector<StorageType> var_storage_;
  std::vector<const tensorflow::Var*> table_vars_;  // per table (compared only: the touched-row hook)
  std::optional<tensorflow::VariableInputLockHolder> locks_;
  std::vector<tensorflow::Tensor> values_;  // the locked variables' tensors
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_DENSE_TABLE_SOURCE_H_
