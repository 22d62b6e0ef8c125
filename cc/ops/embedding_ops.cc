// Registration of the fused embedding training ops (docs/ops.md has the full contract, docs/semantics.md the math).
//
// Per-feature inputs are the TPU enqueue's normalised form, one list entry per feature (feature-descriptor
// order): sample_indices_or_row_splits (empty = dense, rank 1 = row_splits, rank 2 = sparse indices),
// embedding_indices (int64 ids), aggregation_weights (float32, empty = all ones), sample_shapes (int64 1-D: the
// activation's shape without the embedding dimension).
#include "cc/ops/embedding_shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfEmbed>EmbeddingActivations")
    .Input("sample_indices_or_row_splits: N * int64")
    .Input("embedding_indices: N * int64")
    .Input("aggregation_weights: N * float32")
    .Input("sample_shapes: N * int64")
    .Input("tables: T * resource")
    .Output("activations: N * float32")
    .Attr("config: string")
    .Attr("combiners: list(string) = []")
    .Attr("N: int >= 1")
    .Attr("T: int >= 1")
    .SetIsStateful()
    .SetShapeFn(ActivationsShapeFn)
    .Doc(R"doc(
Looks up and combines the embeddings of N features (the TPU engine's forward pass, on CPU).

Feature i uses table config.feature_descriptor[i].table_id; its activation has shape sample_shapes[i] + [dim].
Each sample s gets sum_i w_i * Q(E[id_i]) / norm_s (norm 1 / sum w / sqrt(sum w^2) for sum / mean / sqrtn; 0
where the norm is 0, so empty samples are zero).  Q is the table's simulated quantization when enabled.
No gradient flows through this op: tables change only through SendTPUEmbeddingGradients.

config: a serialized tensorflow.tpu.TPUEmbeddingConfiguration with one feature descriptor per feature.
combiners: "sum", "mean" or "sqrtn"; T entries (per table), or N entries (per feature), or none (all "sum",
  as TF's enqueue ops).  When N == T the list is read per table.
tables: resource variables of shape [vocabulary_size, dim], in table order: float32, bfloat16 or float16 (the
  activations are float32 in every case).
)doc");

// The one send op, under two names: TfEmbed>SendTPUEmbeddingGradients, and ...V2 which adds the rounding_step
// input at the end.  Both take the inputs and attrs below and run the same kernel class, which reads whether a
// rounding_step is present from its input count (cc/kernels/embedding_send_gradients_kernel.cc).  Two names
// rather than one op with an optional list input: a list input has no default in the generated Python
// wrappers, so every raw call and graph written for the first signature would break.  A macro because
// REGISTER_OP's builder chain cannot be passed to a function.
#define TF_EMBED_SEND_GRADIENTS_SIGNATURE               \
  Input("inputs: N * float32")                          \
      .Input("learning_rates: NN * float32")            \
      .Input("sample_indices_or_row_splits: N * int64") \
      .Input("embedding_indices: N * int64")            \
      .Input("aggregation_weights: N * float32")        \
      .Input("sample_shapes: N * int64")                \
      .Input("tables: T * resource")                    \
      .Input("slots: S * resource")                     \
      .Attr("config: string")                           \
      .Attr("combiners: list(string) = []")             \
      .Attr("N: int >= 1")                              \
      .Attr("NN: int >= 0 = 0")                         \
      .Attr("T: int >= 1")                              \
      .Attr("S: int >= 0 = 0")                          \
      .Attr("rounding: list(string) = []")              \
      .Attr("rounding_seed: int = 0")                   \
      .Attr("rounding_table_ids: list(int) = []")       \
      .Attr("check_numerics: bool = false")             \
      .SetIsStateful()

REGISTER_OP("TfEmbed>SendTPUEmbeddingGradients")
    .TF_EMBED_SEND_GRADIENTS_SIGNATURE.SetShapeFn(SendGradientsShapeFn)
    .Doc(R"doc(
Applies one step of the TPU embedding engine's backward pass and optimizer to the tables, in place.

The gradients of the activations (inputs[i] has the shape of activation i) are distributed over the ids by the
combiner, summed per table row across all features sharing the table, and each touched row (every row for
non-lazy Adam) goes through gradient clipping, decoupled weight decay, the table's optimizer and weight
clipping.  Everything is validated before the first write: a rejected call changes no table or slot.

learning_rates: one scalar per dynamic learning-rate tag, in tag order; each must be finite and >= 0.
check_numerics: also reject a step whose gradients hold NaN or +-inf, or whose update would first make a table
  or slot value NaN or +-inf (a per-row gradient sum that overflows, say); by default they are applied, as the
  TPU applies them.
tables: resource variables [vocabulary_size, dim], in table order: float32, or bfloat16 / float16 (16-bit
  storage: the optimizer runs in float32 and the row is rounded back, docs/low_precision.md).
slots: each table's optimizer slots, flat in table order, each table's in Load/Retrieve order (any of the
  three dtypes, independently of the table's).
rounding: how 16-bit tables and slots are rounded, per table: "stochastic" or "nearest" (none = all
  "stochastic").  Ignored for float32 variables.  Stochastic rounding needs a step: use
  SendTPUEmbeddingGradientsV2.
rounding_seed: the seed of stochastic rounding's counter-based generator.
rounding_table_ids: per table, the table index that keys its stochastic rounding (none = its position in the
  config, the numbering before this attr existed).  Each >= 0 and distinct.  A front end whose tables are split
  over several update ops passes each table its index in the whole embedding, so it rounds as it would with
  every table in this op (docs/low_precision.md).
)doc");

REGISTER_OP("TfEmbed>SendTPUEmbeddingGradientsV2")
    .TF_EMBED_SEND_GRADIENTS_SIGNATURE.Input("rounding_step: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(SendGradientsShapeFn(c));
      ShapeHandle unused;
      return c->WithRank(c->input(c->num_inputs() - 1), 0, &unused);
    })
    .Doc(R"doc(
SendTPUEmbeddingGradients with the step that keys stochastic rounding of 16-bit tables and slots.

rounding_step: an int64 scalar, the training step: stochastic rounding's random bits are a function of
  (rounding_seed, rounding_step, table, row, column), so they do not depend on the thread count, and a step
  replayed with the same inputs rounds the same way (docs/low_precision.md).
)doc");

#undef TF_EMBED_SEND_GRADIENTS_SIGNATURE

}  // namespace tf_embed_ops
