// Registration of the tiered-table ops (docs/tiered_tables.md): a static table larger than memory, whose rows
// (with their optimizer slots) live in a row file on disk with a DRAM cache of the hot rows in front.
//
// A tiered table is a resource (TfEmbed>TieredTableHandle), not a variable.  The fused pair
// TieredEmbeddingActivations / TieredSendTPUEmbeddingGradients takes the same per-feature inputs as the dynamic
// tables' pair, with int64 row ids in [0, num_rows); the rows a call needs are made resident before they are read
// or updated, and the update is the in-memory tables' row walk, so results are bitwise those of the in-memory
// table.
#include "cc/ops/embedding_shape_fns.h"
#include "cc/ops/resource_shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// WriteRows: table, first_row, values [n, dim], S slots [n, w_k]: rows agree in number.
absl::Status WriteRowsShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarInput(c, 0));
  TF_RETURN_IF_ERROR(ScalarInput(c, 1));
  ShapeHandle values;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &values));
  DimensionHandle n = c->Dim(values, 0);
  for (int i = 3; i < c->num_inputs(); ++i) {
    ShapeHandle slot;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &slot));
    TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(slot, 0), &n));
  }
  return absl::OkStatus();
}

// ReadRows: values [num_rows, ?] and S slots [num_rows, ?] (widths are creation attrs of the handle).
absl::Status ReadRowsShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarInput(c, 0));
  TF_RETURN_IF_ERROR(ScalarInput(c, 1));
  TF_RETURN_IF_ERROR(ScalarInput(c, 2));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &n));
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Matrix(n, c->UnknownDim()));
  return absl::OkStatus();
}

absl::Status TieredSendGradientsShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(SendGradientsShapeFn(c));
  return ScalarInput(c, c->num_inputs() - 1);  // step
}

}  // namespace

REGISTER_OP("TfEmbed>TieredTableHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("table_name: string")
    .Attr("path: string")
    .Attr("num_rows: int")
    .Attr("dim: int")
    .Attr("slot_widths: list(int) = []")
    .Attr("storage_types: list(string)")
    .Attr("cache_bytes: int")
    .Attr("mode: {'create', 'open'}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (on its first run) or looks up a tiered table: a row file on disk and a DRAM cache of its hot rows.

The table is the resource (container, shared_name); an empty shared_name uses the node name and makes the table
private to this kernel.  A table that already exists under that name must have been made with the same attrs.
Every attr is validated (InvalidArgument naming the table and the value) before the file is touched.  Destroying
the resource writes its dirty rows back (a failure is logged); call TieredTableFlush to see errors.

table_name: names the table in every error message.
path: the row file: one record per row id holding the row and its slots, each with a CRC32C, after a header
  that records the geometry.
num_rows: the vocabulary size, >= 1.
dim: the embedding dimension, in [1, 2^20].
slot_widths: the floats per row of each optimizer slot (dim, or 1 for a per-row slot), in Load/Retrieve order;
  [] means every slot is dim wide.
storage_types: one per buffer (the table, then each slot): 'float32', 'bfloat16' or 'float16'; its length is
  1 + the number of slots.
cache_bytes: the DRAM budget of the cache; it holds cache_bytes // (record bytes + 34) rows (at most num_rows),
  and at least one row must fit.
mode: 'create' makes a new file (an existing one is refused: AlreadyExists) with space for every row reserved;
  its rows must then be written (TieredTableWriteRows) before they are read.  'open' opens an existing file
  whose header must match num_rows, the buffers' types and widths (else InvalidArgument naming the field).
)doc");

REGISTER_OP("TfEmbed>TieredTableWriteRows")
    .Input("table: resource")
    .Input("first_row: int64")
    .Input("values: float32")
    .Input("slots: S * float32")
    .Attr("S: int >= 0")
    .SetIsStateful()
    .SetShapeFn(WriteRowsShapeFn)
    .Doc(R"doc(
Writes rows [first_row, first_row + n) of a tiered table and its slots (initialisation, restore).

values: [n, dim]; slots: one [n, width_k] tensor per slot (S must be the table's slot count).  16-bit buffers are
rounded to nearest.  The rows go to the row file and replace cached copies.  Every shape and the row range are
validated before anything is written.
)doc");

REGISTER_OP("TfEmbed>TieredTableMarkAllTouched")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInput(c, 0); })
    .Doc(R"doc(
Marks every row of a tiered table changed for its touched-row trackers (docs/tracking.md): each consumer's next
query reads full.  A streamed restore runs it after its last chunk (TieredTableWriteRows marks only the rows of
each chunk).  A no-op when the table is not tracked; it changes no row.
)doc");

REGISTER_OP("TfEmbed>TieredTableReadRows")
    .Input("table: resource")
    .Input("first_row: int64")
    .Input("num_rows: int64")
    .Output("values: float32")
    .Output("slots: S * float32")
    .Attr("S: int >= 0")
    .SetIsStateful()
    .SetShapeFn(ReadRowsShapeFn)
    .Doc(R"doc(
Reads rows [first_row, first_row + num_rows) of a tiered table and its slots as float32 (export, checkpoint).

Cached rows (dirty ones included) are read from the cache, the others from the row file, whose CRCs are
checked; the cache is not filled.  S must be the table's slot count.
)doc");

REGISTER_OP("TfEmbed>TieredTablePrefetch")
    .Input("table: resource")
    .Input("ids: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInput(c, 0); })
    .Doc(R"doc(
Starts making the rows of `ids` (any shape; duplicates allowed) resident in the table's cache, without pinning
them, as far as unpinned cache slots allow, and returns: a thread of the table's cache reads them while the
caller goes on, so that, issued with the next batch's ids during the current step, the next step's reads overlap
this step.  A lookup or update that has rows to read waits for it first.  An id outside [0, num_rows) is an
InvalidArgument; a prefetch that failed (an I/O error) is reported by the table's next prefetch.
)doc");

REGISTER_OP("TfEmbed>TieredTableFlush")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInput(c, 0); })
    .Doc(R"doc(
Writes every dirty cached row of a tiered table back to its row file, then fsyncs the file.
)doc");

REGISTER_OP("TfEmbed>TieredTableStats")
    .Input("table: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      c->set_output(0, c->Vector(10));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The cache's counters, int64 [10]: hits, misses, rows_read, rows_written, bytes_read, bytes_written, evictions
(cumulative since the table was made), then resident_rows, capacity_rows, pinned_rows (now).  hits and misses
count the rows of lookups and updates found resident or read then; rows a prefetch read count in rows_read only.
)doc");

REGISTER_OP("TfEmbed>TieredEmbeddingActivations")
    .Input("sample_indices_or_row_splits: N * int64")
    .Input("keys: N * int64")
    .Input("aggregation_weights: N * float32")
    .Input("sample_shapes: N * int64")
    .Input("tables: T * resource")
    .Output("activations: N * float32")
    .Attr("config: string")
    .Attr("combiners: list(string) = []")
    .Attr("training: bool = false")
    .Attr("N: int >= 1")
    .Attr("T: int >= 1")
    .SetIsStateful()
    .SetShapeFn(ActivationsShapeFn)
    .Doc(R"doc(
Looks up and combines the embeddings of N features over tiered tables (the forward pass).

The inputs and combiners are those of EmbeddingActivations: feature i reads table
config.feature_descriptor[i].table_id, with ids in [0, vocabulary_size) (an id outside is an InvalidArgument
naming the feature and the table), and its activation has shape sample_shapes[i] + [dim].  Each table's distinct
ids of the call are made resident (read from the row file where not cached) and pinned while they are read; more
distinct ids than the cache holds is an InvalidArgument naming the table and the cache_bytes that would do.
The values are those of the in-memory table.

config: a serialized TPUEmbeddingConfiguration: one table per tiered table (dimension = its dim,
  vocabulary_size = its num_rows) and one feature descriptor per feature.
training: accepted for symmetry with the other lookups; a tiered lookup never changes a row.
tables: the tiered table handles, in table order.
)doc");

REGISTER_OP("TfEmbed>TieredSendTPUEmbeddingGradients")
    .Input("inputs: N * float32")
    .Input("learning_rates: NN * float32")
    .Input("sample_indices_or_row_splits: N * int64")
    .Input("keys: N * int64")
    .Input("aggregation_weights: N * float32")
    .Input("sample_shapes: N * int64")
    .Input("tables: T * resource")
    .Input("step: int64")
    .Attr("config: string")
    .Attr("combiners: list(string) = []")
    .Attr("N: int >= 1")
    .Attr("NN: int >= 0 = 0")
    .Attr("T: int >= 1")
    .Attr("check_numerics: bool = false")
    .Attr("validate_only: bool = false")
    .Attr("rounding: list(string) = []")
    .Attr("rounding_seed: int = 0")
    .Attr("rounding_table_ids: list(int) = []")
    .SetIsStateful()
    .SetShapeFn(TieredSendGradientsShapeFn)
    .Doc(R"doc(
Applies one training step to tiered tables, in their caches.

The inputs are those of SendTPUEmbeddingGradients with tiered table handles instead of the table and slot
variables.  Each table's distinct rows are made resident and pinned before any table is updated (more than the
cache holds is an InvalidArgument naming the table, before anything is evicted or written); the update is the
in-memory tables' row pipeline, so the rows are bitwise those of the in-memory table given the same rounding.
Optimizers that update every row (non-lazy Adam, non-lazy Lion) walk the table in windows of the cache's
capacity; an I/O error in a later window leaves the earlier windows updated (the error says so).  Everything is
validated before the first write: a rejected call changes no row.

learning_rates: one scalar per dynamic learning-rate tag, in tag order; each must be finite and >= 0.
step: the training step (>= 0); it keys stochastic rounding of 16-bit buffers.
check_numerics: also reject a step whose gradients hold NaN or +-inf, or whose update would first make a row's
  value NaN or +-inf.
validate_only: run every check (check_numerics included) and stop before the update.
rounding: per table "stochastic" or "nearest" (none = all "stochastic"), as SendTPUEmbeddingGradients.
rounding_seed: the seed of stochastic rounding, as SendTPUEmbeddingGradients.
rounding_table_ids: per table, the table index that keys its stochastic rounding (none = its index in this
  config): pass the index the table has in the in-memory engine's config to draw that engine's bits.
)doc");

}  // namespace tf_embed_ops
