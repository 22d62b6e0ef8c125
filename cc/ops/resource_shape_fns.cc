#include "cc/ops/resource_shape_fns.h"

namespace tf_embed_ops {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status ScalarInput(InferenceContext* c, int input) {
  ShapeHandle unused;
  return c->WithRank(c->input(input), 0, &unused);
}

absl::Status ScalarInputs(InferenceContext* c, int first, int count) {
  for (int i = first; i < first + count; ++i) TF_RETURN_IF_ERROR(ScalarInput(c, i));
  return absl::OkStatus();
}

absl::Status VectorInput(InferenceContext* c, int input, ShapeHandle* out) {
  return c->WithRank(c->input(input), 1, out);
}

absl::Status HandleInput(InferenceContext* c) { return ScalarInput(c, 0); }

absl::Status HandleAndKeys(InferenceContext* c, ShapeHandle* keys) {
  TF_RETURN_IF_ERROR(HandleInput(c));
  return VectorInput(c, 1, keys);
}

absl::Status KeyedRowsShapeFn(InferenceContext* c) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(HandleAndKeys(c, &keys));
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Matrix(c->Dim(keys, 0), c->UnknownDim()));
  return absl::OkStatus();
}

absl::Status ContentOutputShapes(InferenceContext* c, int first) {
  int num_slots = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
  const DimensionHandle n = c->UnknownDim(), p = c->UnknownDim();
  c->set_output(first, c->Vector(n));
  c->set_output(first + 1, c->Matrix(n, c->UnknownDim()));
  for (int k = 0; k < num_slots; ++k) c->set_output(first + 2 + k, c->Matrix(n, c->UnknownDim()));
  const int rest = first + 2 + num_slots;
  c->set_output(rest, c->Vector(n));
  c->set_output(rest + 1, c->Vector(n));
  for (int i = rest + 2; i < rest + 5; ++i) c->set_output(i, c->Vector(p));
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
