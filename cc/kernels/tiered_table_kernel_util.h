// The tiered tables of a fused op resolved and checked against the config (TieredTableSource's Open).
#ifndef TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_KERNEL_UTIL_H_
#define TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_KERNEL_UTIL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "cc/kernels/tiered_table_resource.h"
#include "cc/lib/embedding_config.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_embed_ops {

// The tiered tables of a fused op (inputs first_input .. first_input + T - 1) checked against the config:
// distinct resources, the config's dimension and vocabulary size (= num_rows), and (when `check_slots`) the
// slots of the table's optimizer in number and width.
absl::Status LookupTieredConfigTables(tensorflow::OpKernelContext* ctx, int first_input, const EmbeddingConfig& config,
                                      bool check_slots, std::vector<TieredTableRef>* out);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_TIERED_TABLE_KERNEL_UTIL_H_
