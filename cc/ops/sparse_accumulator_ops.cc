// The sparse conditional accumulator op family: TensorFlow's SparseConditionalAccumulator contract on a
// resource handle, so it runs eagerly and crosses v2 control flow.  Semantics: docs/sparse_accumulator.md.
//
// Shape functions check only what TensorFlow's do (the step and count scalars); every other input check
// happens at run time with TensorFlow's messages, so graph and eager code see the same errors.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status ScalarHandle(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

REGISTER_OP("TfEmbed>SparseAccumulator")
    .Output("handle: resource")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("shape: shape")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("reduction_type: {'MEAN', 'SUM'} = 'MEAN'")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates, or looks up, a sparse conditional accumulator in the resource manager.

The resource is (container, shared_name).  With an empty shared_name it is private to this kernel (created on
the first run, deleted with the kernel), as TensorFlow's ref-typed op does; eager code should use
AnonymousSparseAccumulator instead, because eager kernels are cached by attrs.  Looking up an existing
accumulator whose dtype, shape or reduction_type differ is an InvalidArgument error.

dtype: type of the gradient values.
shape: partial shape: a minimum rank, known dims must match, a known dim 0 bounds the indices.
reduction_type: MEAN divides each row by the number of gradients that touched it; SUM does not.
)doc");

REGISTER_OP("TfEmbed>AnonymousSparseAccumulator")
    .Output("handle: resource")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("shape: shape")
    .Attr("reduction_type: {'MEAN', 'SUM'} = 'MEAN'")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates a new sparse conditional accumulator on every run, owned by the returned handle.

The accumulator lives as long as some tensor holds the handle (a reference-counting handle), so two Python
objects never alias and deleting one never affects another.
)doc");

REGISTER_OP("TfEmbed>SparseAccumulatorApplyGradient")
    .Input("handle: resource")
    .Input("local_step: int64")
    .Input("gradient_indices: int64")
    .Input("gradient_values: dtype")
    .Input("gradient_shape: int64")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("has_known_shape: bool")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle unused;
      return c->WithRank(c->input(1), 0, &unused);
    })
    .Doc(R"doc(
Adds a sparse gradient to the accumulator unless it is stale (local_step < the accumulator's global step).

The gradient is validated first, stale or not.  Its indices are canonicalised: sorted, with duplicates summed;
a row's MEAN count grows by one per gradient that touches it.  Negative indices are rejected.

dtype: must equal the accumulator's dtype.
has_known_shape: whether gradient_shape is the gradient's dense shape (checked against the accumulator
  shape) or ignored.
)doc");

REGISTER_OP("TfEmbed>SparseAccumulatorTakeGradient")
    .Input("handle: resource")
    .Input("num_required: int32")
    .Input("timeout_seconds: float")
    .Output("indices: int64")
    .Output("values: dtype")
    .Output("shape: int64")
    .Attr("dtype: {half, bfloat16, float, double}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->UnknownShape());
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Waits until at least num_required gradients are held, then returns the aggregate of all of them.

Takes are served first come, first served (a waiting head blocks later takes).  Completing one increments the
global step and empties the accumulator.  The wait holds no thread; it ends with Cancelled when the step is
cancelled, or DeadlineExceeded after timeout_seconds (< 0: no timeout); either leaves the state untouched.

indices: sorted, unique row indices.
values: the rows, divided by their per-row counts for MEAN.
shape: the dense shape: accumulator dim 0 (or -1), then the held values' dims 1...
)doc");

REGISTER_OP("TfEmbed>SparseAccumulatorNumAccumulated")
    .Input("handle: resource")
    .Output("num_accumulated: int32")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      return tensorflow::shape_inference::ScalarShape(c);
    })
    .Doc("The number of gradients accepted since the last take.");

REGISTER_OP("TfEmbed>SparseAccumulatorSetGlobalStep")
    .Input("handle: resource")
    .Input("new_global_step: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle unused;
      return c->WithRank(c->input(1), 0, &unused);
    })
    .Doc("Sets the global step, unconditionally (lowering it logs a warning). Held gradients stay.");

}  // namespace
}  // namespace tf_embed_ops
