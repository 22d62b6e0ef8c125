// Registration of the touched-row tracking ops (docs/tracking.md): which rows of a table changed since a
// version, for consumers that each keep their own version (serving deltas, incremental checkpoints).
#include "cc/ops/resource_shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {
using ::tensorflow::shape_inference::InferenceContext;

REGISTER_OP("TfEmbed>TouchedRowsTrack")
    .Input("table: resource")
    .Output("tracker: resource")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, 0, 1));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Starts tracking the touched rows of a static table; returns its tracker.

table: a table variable ([rows, dim], initialised) or a tiered table (TieredTableHandle).
Tracking the same table again returns the same tracker: every consumer shares its stamps and keeps its own
version.  From now on, every SendTPUEmbeddingGradients(V2) that updates the variable (TieredSendTPUEmbedding-
Gradients and TieredTableWriteRows for a tiered table) marks the rows it wrote.  The tracker lives as long as a
handle to it does (it holds a reference to the table).
)doc");

REGISTER_OP("TfEmbed>TouchedRowsSince")
    .Input("tracker: resource")
    .Input("tracker_id: int64")
    .Input("since: int64")
    .Output("id: int64")
    .Output("version: int64")
    .Output("full: bool")
    .Output("rows: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, 0, 3));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      c->set_output(2, c->Scalar());
      c->set_output(3, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The rows changed after version `since` of tracker `tracker_id` (ascending), and the version to ask from next.

id: this tracker's id (a consumer keeps it beside the version).
full: every row must be taken as changed (rows is then empty): `since` is from before tracking started, from
  another tracker (tracker_id differs), or a restore or an every-row update (non-lazy Adam) happened since.
)doc");

REGISTER_OP("TfEmbed>TouchedRowsMarkAll")
    .Input("tracker: resource")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputs(c, 0, 1); })
    .Doc(R"doc(
Marks every row of the tracked table changed (after a restore): each consumer's next query reads full.
)doc");

REGISTER_OP("TfEmbed>DynamicTableChangedSince")
    .Input("table: resource")
    .Input("tracker_id: int64")
    .Input("since: int64")
    .Output("id: int64")
    .Output("version: int64")
    .Output("full: bool")
    .Output("evicted_keys: int64")
    .Output("keys: int64")
    .Output("weights: float32")
    .Output("slots: num_slots * float32")
    .Output("counts: int64")
    .Output("last_steps: int64")
    .Output("pending_keys: int64")
    .Output("pending_counts: int64")
    .Output("pending_last_steps: int64")
    .Attr("num_slots: int >= 0")
    .Attr("mark_all: bool = false")
    .Attr("version_only: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, 0, 3));
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Scalar());
      c->set_output(3, c->Vector(c->UnknownDim()));
      return ContentOutputShapes(c, 4);
    })
    .Doc(R"doc(
A dynamic table's changes after version `since` of its tracker `tracker_id`, with their content.

The table is held exclusively; the first call enables tracking (4 bytes per row from then on).

keys, weights, slots, counts, last_steps: the rows inserted or changed since (all live rows when full), in key
  order, as DynamicTableExport gives them; pending_*: the whole admission table.  A tiered table's rows are read
  through its cache (not filled); its full answer has weights and slots of 0 rows (read them by key with
  DynamicTableTieredReadRows, a chunk at a time).
evicted_keys: keys evicted since and not live now, ascending (empty when full).
full: the consumer must replace its whole copy of the table (tracking started after `since`, another tracker,
  an import, a non-lazy update of every row, or the bounded eviction log dropped entries it needed).
mark_all: first mark every row changed (a restore done outside the import op), then answer.
version_only: answer id and version only (every other output empty): what a consumer starting now records.
)doc");

}  // namespace tf_embed_ops
