// Shape functions the static and the dynamic-table fused ops share: both take the per-feature lists in the same
// order (splits[N], ids or keys[N], weights[N], sample_shapes[N]), so one definition serves both families.
#ifndef TF_EMBED_OPS_CC_OPS_EMBEDDING_SHAPE_FNS_H_
#define TF_EMBED_OPS_CC_OPS_EMBEDDING_SHAPE_FNS_H_

#include "absl/status/status.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {

// Activations: output i = sample_shapes[i] (as far as known statically) + [dim of feature i's table].
// Inputs: splits[N], ids[N], weights[N], sample_shapes[N], then anything.
absl::Status ActivationsShapeFn(tensorflow::shape_inference::InferenceContext* c);

// Gradients: inputs[i] must merge with activation i's shape; learning rates are scalars.
// Inputs: gradients[N], learning_rates[NN], splits[N], ids[N], weights[N], sample_shapes[N], then anything.
absl::Status SendGradientsShapeFn(tensorflow::shape_inference::InferenceContext* c);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_OPS_EMBEDDING_SHAPE_FNS_H_
