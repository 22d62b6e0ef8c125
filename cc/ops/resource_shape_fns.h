// Shape-function pieces the resource ops share (dynamic tables, tiered tables, touched-row trackers): scalar and
// vector inputs, the table handle, and the output shapes of a dynamic table's content.
#ifndef TF_EMBED_OPS_CC_OPS_RESOURCE_SHAPE_FNS_H_
#define TF_EMBED_OPS_CC_OPS_RESOURCE_SHAPE_FNS_H_

#include "absl/status/status.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {

// Input `input` is a scalar.
absl::Status ScalarInput(tensorflow::shape_inference::InferenceContext* c, int input);

// Inputs [first, first + count) are scalars.
absl::Status ScalarInputs(tensorflow::shape_inference::InferenceContext* c, int first, int count);

// Input `input` is a vector; *out is its shape.
absl::Status VectorInput(tensorflow::shape_inference::InferenceContext* c, int input,
                         tensorflow::shape_inference::ShapeHandle* out);

// The table handle (input 0) is a scalar resource.
absl::Status HandleInput(tensorflow::shape_inference::InferenceContext* c);

// The table handle (input 0) and a vector of keys (input 1), whose shape is *keys.
absl::Status HandleAndKeys(tensorflow::shape_inference::InferenceContext* c,
                           tensorflow::shape_inference::ShapeHandle* keys);

// The table handle and a vector of keys [n] in, every output a matrix [n, ?] (a row per key; the row's width is
// the table's, known at run time).
absl::Status KeyedRowsShapeFn(tensorflow::shape_inference::InferenceContext* c);

// A dynamic table's content as outputs from `first` on (DynamicTableExport, DynamicTableChangedSince): keys [n],
// weights [n, ?], num_slots (attr) slots [n, ?], counts [n], last_steps [n], then pending_keys, pending_counts,
// pending_last_steps [p].  The dimension is a creation attr of the handle op, so it is only known at run time.
absl::Status ContentOutputShapes(tensorflow::shape_inference::InferenceContext* c, int first);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_OPS_RESOURCE_SHAPE_FNS_H_
