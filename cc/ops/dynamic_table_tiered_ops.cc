// Registration of the ops of a tiered dynamic table (a dynamic table whose rows live in a row file,
// docs/tiered_tables.md): its cache counters and its streamed checkpoint.
#include <vector>

#include "cc/ops/resource_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfEmbed>DynamicTableTieredStats")
    .Input("table: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      c->set_output(0, c->Vector(10));
      return absl::OkStatus();
    })
    .Doc(R"doc(
A tiered dynamic table's row-cache counters, int64 [10] in the order of TfEmbed>TieredTableStats: hits, misses,
rows_read, rows_written, bytes_read, bytes_written, evictions (totals), resident_rows, capacity_rows, pinned_rows
(now).  InvalidArgument for a table kept in memory.
)doc");
// A tiered table's streamed checkpoint (tf_embed_ops/dynamic/tiered_checkpoint.py): the keys and metadata whole,
// the rows one chunk of keys at a time.
REGISTER_OP("TfEmbed>DynamicTableTieredExportKeys")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("counts: int64")
    .Output("last_steps: int64")
    .Output("pending_keys: int64")
    .Output("pending_counts: int64")
    .Output("pending_last_steps: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      DimensionHandle n = c->UnknownDim(), p = c->UnknownDim();
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(n));
      for (int i = 3; i < 6; ++i) c->set_output(i, c->Vector(p));
      return absl::OkStatus();
    })
    .Doc(R"doc(
A tiered table's DynamicTableExport without the rows (shared access): keys [n] sorted, counts, last_steps [n], and
the pending admission counters [p].  The rows of the keys are read with DynamicTableTieredReadRows.
InvalidArgument for a table kept in memory.
)doc");

REGISTER_OP("TfEmbed>DynamicTableTieredImportKeys")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("counts: int64")
    .Input("last_steps: int64")
    .Input("pending_keys: int64")
    .Input("pending_counts: int64")
    .Input("pending_last_steps: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle v;
      for (int i = 1; i < 7; ++i) TF_RETURN_IF_ERROR(VectorInput(c, i, &v));
      return absl::OkStatus();
    })
    .Doc(R"doc(
A tiered table's DynamicTableImport of the keys alone (held exclusively): validated as DynamicTableImport validates
them (a refused import changes nothing), the file grown first; key i gets a row whose values are then written with
DynamicTableTieredWriteRows (until then they are undefined).  InvalidArgument for a table kept in memory.
)doc");

REGISTER_OP("TfEmbed>DynamicTableTieredReadRows")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("weights: float32")
    .Output("slots: num_slots * float32")
    .Attr("num_slots: int >= 0")
    .SetIsStateful()
    .SetShapeFn(KeyedRowsShapeFn)
    .Doc(R"doc(
The rows of `keys` of a tiered table (shared access), float32: weights [n, dim] and one [n, w_k] tensor per slot,
read through the cache (dirty rows included) without filling it.  keys: as the table stores them (a string
table's fingerprints, as DynamicTableExport gives them); every key must have a row.
)doc");

REGISTER_OP("TfEmbed>DynamicTableTieredWriteRows")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("weights: float32")
    .Input("slots: num_slots * float32")
    .Attr("num_slots: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, m;
      TF_RETURN_IF_ERROR(HandleAndKeys(c, &keys));
      for (int i = 2; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &m));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Writes the rows of `keys` of a tiered table (held exclusively) from float32 weights [n, dim] and slots [n, w_k]
(16-bit storage rounds to nearest).  Every key must have a row and appear once; everything is checked before the
first row is written.
)doc");

}  // namespace tf_embed_ops
