// OptimizationParameters.parameters (the algorithm oneof) -> the cc/lib optimizer struct, validated against the
// optimizer schema (cc/lib/optimizers/schema.h): every field of the optimizer's message is checked against its
// range there, so C++ and Python (which checks the same schema) accept exactly the same values.
#ifndef TF_EMBED_OPS_CC_CONFIG_OPTIMIZER_FROM_PROTO_H_
#define TF_EMBED_OPS_CC_CONFIG_OPTIMIZER_FROM_PROTO_H_

#include <string>

#include "absl/status/status.h"
#include "cc/lib/optimizers/registry.h"
#include "tensorflow/core/protobuf/tpu/optimization_parameters.pb.h"

namespace tf_embed_ops {

// `context` names the table ("table 'x' (table_id 0)") for messages.  Errors: InvalidArgument when no
// algorithm is set, a hyper-parameter is out of range, or the optimizer needs a dynamic learning rate and has a
// constant one; Unimplemented, naming the proto field (e.g. "mdl_adagrad_light"), for an algorithm the proto
// knows but tf_embed_ops does not run.
absl::Status OptimizerFromProto(const tensorflow::tpu::OptimizationParameters& params, const std::string& context,
                                OptimizerParams* out);

// InvalidArgument when `optimizer` needs gradient accumulation (its schema's AccumulationRule) and
// `gradient_accumulation` is false.
absl::Status CheckOptimizerAccumulation(const OptimizerParams& optimizer, bool gradient_accumulation,
                                        const std::string& context);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_CONFIG_OPTIMIZER_FROM_PROTO_H_
