// The one signature of the fused lookup and update ops, whatever holds their tables (TensorFlow variables, tiered
// tables, dynamic tables): their inputs by name, and the attrs every update op shares, parsed and checked once.
// The config and the combiners are FusedEmbeddingAttrs (embedding_kernel_util.h).
#ifndef TF_EMBED_OPS_CC_KERNELS_FUSED_OP_SIGNATURE_H_
#define TF_EMBED_OPS_CC_KERNELS_FUSED_OP_SIGNATURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/storage_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tf_embed_ops {

// The inputs of a fused op by name.  A lookup op takes
//   sample_indices_or_row_splits[N], ids[N], aggregation_weights[N], sample_shapes[N], tables[T] (, step)
// and an update op
//   inputs[N] (the gradients), learning_rates[NN], the four lists, tables[T], slots[S] (, step)
// where slots are the static op's (S = 0 for the others) and the step is a dynamic or tiered op's, or the
// rounding_step of SendTPUEmbeddingGradientsV2.
class FusedInputs {
 public:
  static FusedInputs Lookup(int num_features, int num_tables) {
    return FusedInputs(num_features, /*num_gradients=*/0, 0, num_tables, 0);
  }
  static FusedInputs Update(int num_features, int num_learning_rates, int num_tables, int num_slots) {
    return FusedInputs(num_features, num_features, num_learning_rates, num_tables, num_slots);
  }

  int gradient(int f) const { return f; }
  int learning_rate(int k) const { return first_rate_ + k; }
  int first_learning_rate() const { return first_rate_; }
  int splits(int f) const { return first_list_ + f; }
  int ids(int f) const { return first_list_ + n_ + f; }
  int weights(int f) const { return first_list_ + 2 * n_ + f; }
  int sample_shape(int f) const { return first_list_ + 3 * n_ + f; }
  int table(int t) const { return first_table_ + t; }
  int slot(int s) const { return first_table_ + num_tables_ + s; }
  // The input after the slots: the step of a dynamic or tiered op, the rounding_step of the static V2 op.
  int step() const { return slot(num_slots_); }

 private:
  FusedInputs(int n, int num_gradients, int num_rates, int num_tables, int num_slots)
      : n_(n),
        num_tables_(num_tables),
        num_slots_(num_slots),
        first_rate_(num_gradients),
        first_list_(num_gradients + num_rates),
        first_table_(first_list_ + 4 * n) {}

  int n_, num_tables_, num_slots_;
  int first_rate_, first_list_, first_table_;
};

// The storage type of a variable's dtype (float32, bfloat16, float16), or InvalidArgument naming `what`.
absl::StatusOr<StorageType> StorageTypeOfDtype(tensorflow::DataType dtype, const std::string& what);
// The storage type of its name ("float32", "bfloat16", "float16"); the error says what is expected.
absl::StatusOr<StorageType> StorageTypeOfName(const std::string& name);

// The rounding attrs of an update op (rounding, rounding_seed, rounding_table_ids) as one RoundingSpec per table,
// its step left 0 (the call's): none = every table "stochastic" keyed by its position in the config.
absl::Status ReadRoundingAttrs(tensorflow::OpKernelConstruction* ctx, const EmbeddingConfig& config,
                               std::vector<RoundingSpec>* out);

// The NN attr gives one learning rate per dynamic learning-rate tag of the config.
absl::Status CheckLearningRateCount(int num_learning_rates, const EmbeddingConfig& config);

// Each table's features hold at most RowGradientPlan::kMaxIds ids in all (the plan's unique-row indices are
// int32); `noun` names them in the error ("ids", or "keys" for dynamic tables).
absl::Status CheckIdsPerTable(const std::vector<int64_t>& ids_per_table, const EmbeddingConfig& config,
                              const char* noun);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_FUSED_OP_SIGNATURE_H_
