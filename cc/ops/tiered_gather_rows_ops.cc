// Registration of TfEmbed>TieredTableGatherRows: given rows of a tiered table, read through its cache without
// filling it (touched-row deltas, docs/tracking.md).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfEmbed>TieredTableGatherRows")
    .Input("table: resource")
    .Input("rows: int64")
    .Output("values: float32")
    .Output("slots: S * float32")
    .Attr("S: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused, rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
      const DimensionHandle n = c->Dim(rows, 0);
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Matrix(n, c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Reads the given rows of a tiered table and its slots as float32, in the order given (duplicates allowed).

rows: int64 [n]; every id is checked against [0, num_rows) before anything is read (InvalidArgument naming
  the table, the position and the id).  Runs of consecutive ids are read as one range.
Cached rows (dirty ones included) are read from the cache, the others from the row file, whose CRCs are
checked; the cache is not filled.  S must be the table's slot count.
)doc");

}  // namespace tf_embed_ops
