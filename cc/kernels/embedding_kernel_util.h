// What both fused embedding kernels share: reading the config-derived per-feature settings in the
// constructor, viewing the per-feature input lists as cc/lib FeatureBatch structs, checking table/slot
// variables against the config, and handing cc/lib a sharding function over TensorFlow's intra-op pool.
#ifndef TF_EMBED_OPS_CC_KERNELS_EMBEDDING_KERNEL_UTIL_H_
#define TF_EMBED_OPS_CC_KERNELS_EMBEDDING_KERNEL_UTIL_H_

#include <string>
#include <vector>

#include "cc/lib/combiner.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/feature_layout.h"
#include "cc/lib/table_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"

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

// Views the per-feature inputs of feature `feature` (the four lists start at `first_list_input`, each N long)
// as a FeatureBatch.  Checks ranks only; BuildFeatureLayout checks the structure.
absl::Status ReadFeatureBatch(tensorflow::OpKernelContext* ctx, int first_list_input, int num_features, int feature,
                              const std::string& label, FeatureBatch* out);

// Looks up the float32 variable behind resource input `input` and checks its dtype and initialisation
// without writing anything (must run before the training_op_helpers lock, whose copy-on-read switch
// assumes the dtype).  `what` names the handle in errors ("table 'video'", "slot 'momenta' of table ...").
absl::Status CheckVariableDtype(tensorflow::OpKernelContext* ctx, int input, const std::string& what,
                                tensorflow::Var** var);

// `tensor` (a locked variable's value) has shape [vocabulary_size, dim] of `table`.
absl::Status CheckTableShape(const tensorflow::Tensor& tensor, const TableSpec& table, const std::string& what);

// Shards over the kernel's intra-op thread pool (Eigen's cost model picks the block size).
ShardFn IntraOpShardFn(tensorflow::OpKernelContext* ctx);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_EMBEDDING_KERNEL_UTIL_H_
