// What both fused embedding kernels share: reading the config-derived per-feature settings in the
// constructor, viewing the per-feature input lists as cc/lib FeatureBatch structs, checking table/slot
// variables against the config (the sharding function is cc/kernels/intra_op_shard.h).
#ifndef TF_EMBED_OPS_CC_KERNELS_EMBEDDING_KERNEL_UTIL_H_
#define TF_EMBED_OPS_CC_KERNELS_EMBEDDING_KERNEL_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/intra_op_shard.h"
#include "cc/lib/combiner.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/feature_layout.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/table_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tsl/platform/mutex.h"
#include "tsl/platform/thread_annotations.h"

namespace tf_embed_ops {

// The config attr parsed and checked against the op's feature and table counts, and the combiner of each
// feature (the `combiners` attr: T entries = per table, N entries = per feature, none = all "sum").
struct FusedEmbeddingAttrs {
  EmbeddingConfig config;
  std::vector<Combiner> combiners;  // per feature
  int num_features = 0;
  int num_tables = 0;

  absl::Status Init(tensorflow::OpKernelConstruction* ctx);
  // "feature 3 ('watched')" or "feature 3" when the descriptor has no name.
  std::string FeatureLabel(int feature) const;
};

// Scratch of one kernel call: feature layouts and per-table accumulation plans.  Kernels keep these in a pool
// and reuse them, so a steady-state step allocates (and page-faults) nothing for its bookkeeping; what a pool
// holds is bounded by the largest batch seen, plus a static table's dense index where RowGradientPlan chooses
// one (at most 64x that table's ids and 2^24 rows: gradient_accumulation.h).
struct EmbeddingWorkspace {
  std::vector<FeatureLayout> layouts;                // per feature
  std::vector<std::vector<GradientSource>> sources;  // per table
  std::vector<RowGradientPlan> plans;                // per table
};

// Thread-safe free list of workspaces (concurrent Compute calls each take their own).
class WorkspacePool {
 public:
  class Scoped {
   public:
    Scoped(WorkspacePool* pool, std::unique_ptr<EmbeddingWorkspace> ws) : pool_(pool), ws_(std::move(ws)) {}
    ~Scoped() { pool_->Release(std::move(ws_)); }
    Scoped(const Scoped&) = delete;
    Scoped& operator=(const Scoped&) = delete;
    EmbeddingWorkspace* operator->() { return ws_.get(); }
    EmbeddingWorkspace* get() { return ws_.get(); }

   private:
    WorkspacePool* pool_;
    std::unique_ptr<EmbeddingWorkspace> ws_;
  };

  Scoped Acquire() {
    tsl::mutex_lock lock(mu_);
    if (free_.empty()) return Scoped(this, std::make_unique<EmbeddingWorkspace>());
    std::unique_ptr<EmbeddingWorkspace> ws = std::move(free_.back());
    free_.pop_back();
    return Scoped(this, std::move(ws));
  }

 private:
  void Release(std::unique_ptr<EmbeddingWorkspace> ws) {
    tsl::mutex_lock lock(mu_);
    free_.push_back(std::move(ws));
  }

  tsl::mutex mu_;
  std::vector<std::unique_ptr<EmbeddingWorkspace>> free_ TF_GUARDED_BY(mu_);
};

// Views the per-feature inputs of feature `feature` as a FeatureBatch.  Checks ranks only; BuildFeatureLayout checks
// the structure.  Ids that are not int64 (the dynamic ops' string keys) are left null.
absl::Status ReadFeatureBatch(tensorflow::OpKernelContext* ctx, const FusedInputs& inputs, int feature,
                              const std::string& label, FeatureBatch* out);

// `status` with "what: " in front of its message (same code), for errors of TensorFlow helpers that cannot know
// which table or slot they were handling.
absl::Status Named(const absl::Status& status, const std::string& what);

// sample_shape + [dimension of `table`]: the shape of the feature's activation (and of its gradient).  Call it
// on a batch ValidateFeatureBatch accepted; errors (a rank TensorShape cannot hold) name the feature.
absl::Status ActivationShape(const FeatureBatch& batch, const TableSpec& table, const std::string& label,
                             tensorflow::TensorShape* out);

// Looks up the variable behind resource input `input` and checks its dtype (float32, bfloat16 or float16: the
// storage type, docs/low_precision.md) and initialisation without writing anything (must run before the
// training_op_helpers lock, whose copy-on-read switch assumes the dtype).  `what` names the handle in errors
// ("table 'video'", "slot 'momenta' of table ...").
absl::Status CheckVariableDtype(tensorflow::OpKernelContext* ctx, int input, const std::string& what,
                                tensorflow::Var** var, StorageType* storage);

// Switches a 16-bit variable to copy-on-read mode with a copy of its own type (call before the lock helper,
// which is instantiated for float and would otherwise copy a shared 16-bit buffer as float).  No-op for
// float32 and for variables already in that mode.
void EnsureSparseAccess(tensorflow::OpKernelContext* ctx, tensorflow::Var* var, StorageType storage);

// Per dynamic learning-rate tag, the names of the tables that use it (for errors).
std::vector<std::vector<std::string>> TablesPerTag(const EmbeddingConfig& config);

// The learning_rates inputs: one scalar per dynamic tag,
// finite and >= 0 (the rule the config applies to constant rates); errors name the tag and its tables.
absl::Status ReadLearningRates(tensorflow::OpKernelContext* ctx, const FusedInputs& inputs,
                               const std::vector<std::vector<std::string>>& tag_tables, std::vector<float>* out);

// Feature f's gradient (inputs[f]) has the activation's shape `expected` and, with check_numerics, only finite
// values (the error gives the position).
absl::Status CheckFeatureGradient(const tensorflow::Tensor& gradient, int f, const tensorflow::TensorShape& expected,
                                  const std::string& label, const std::string& table_name, bool check_numerics);

// The error of check_numerics when the step's update of `table` would introduce a NaN or +-inf (`bad`, from
// FindNonFiniteUpdate).  `ids[f]` are feature f's ids as the table's plan saw them (row indices for a dynamic
// table), `num_ids[f]` their count; the message names the first feature and position whose id is the row, and
// `row_label` says what the row is ("row 7", "key 42").
absl::Status NonFiniteUpdateError(const FusedEmbeddingAttrs& attrs, int table, const NonFiniteUpdate& bad,
                                  const std::vector<const int64_t*>& ids, const std::vector<int64_t>& num_ids,
                                  const std::string& row_label);

// `tensor` (a locked variable's value) has shape [vocabulary_size, dim] of `table`, or, for one of its slots
// (`slot` not null), [vocabulary_size, SlotWidth(*slot, dim)].
absl::Status CheckTableShape(const tensorflow::Tensor& tensor, const TableSpec& table, const std::string& what,
                             const SlotInfo* slot = nullptr);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_EMBEDDING_KERNEL_UTIL_H_
