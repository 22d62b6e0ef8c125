// OptimizationParameters.parameters (the algorithm oneof) -> the cc/lib optimizer struct, with the
// hyper-parameter ranges TensorFlow's Python optimizers enforce (docs/semantics.md).  Adding an optimizer = one
// case here + its header in cc/lib/optimizers.
#ifndef TF_EMBED_OPS_CC_CONFIG_OPTIMIZER_FROM_PROTO_H_
#define TF_EMBED_OPS_CC_CONFIG_OPTIMIZER_FROM_PROTO_H_

#include <string>

#include "absl/status/status.h"
#include "cc/lib/optimizers/registry.h"
#include "tensorflow/core/protobuf/tpu/optimization_parameters.pb.h"

namespace tf_embed_ops {

// `context` names the table ("table 'x' (table_id 0)") for messages.  Errors: InvalidArgument when no
// algorithm is set or a hyper-parameter is out of range; Unimplemented, naming the proto field (e.g.
// "rms_prop"), for an algorithm the proto knows but tf_embed_ops does not run.
absl::Status OptimizerFromProto(const tensorflow::tpu::OptimizationParameters& params, const std::string& context,
                                OptimizerParams* out);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_CONFIG_OPTIMIZER_FROM_PROTO_H_
