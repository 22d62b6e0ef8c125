// Registration of a dynamic table's lifecycle ops (docs/dynamic_tables_internals.md, "Ops"): checkpoint export and
// import of the rows and of the policies' state, explicit eviction (by policy, by key, by a user score), the
// eviction log and the per-row statistics a score reads.
#include <vector>

#include "cc/ops/resource_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// The content tensors: keys [n], weights [n, d], S slots [n, w_k] (w_k = d, or 1 for a per-row slot), counts
// [n], last_steps [n], pending_keys [p], pending_counts [p], pending_last_steps [p].  Shapes are per input index:
// the slots list takes S inputs.
absl::Status ContentInputShapes(InferenceContext* c, int first, std::vector<ShapeHandle>* shapes) {
  int num_slots = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
  ShapeHandle keys, weights, counts, last_steps, pending_keys, pending_counts, pending_last_steps;
  TF_RETURN_IF_ERROR(VectorInput(c, first, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 1), 2, &weights));
  std::vector<ShapeHandle> slots(num_slots);
  for (int k = 0; k < num_slots; ++k) TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 2 + k), 2, &slots[k]));
  const int rest = first + 2 + num_slots;
  TF_RETURN_IF_ERROR(VectorInput(c, rest, &counts));
  TF_RETURN_IF_ERROR(VectorInput(c, rest + 1, &last_steps));
  TF_RETURN_IF_ERROR(VectorInput(c, rest + 2, &pending_keys));
  TF_RETURN_IF_ERROR(VectorInput(c, rest + 3, &pending_counts));
  TF_RETURN_IF_ERROR(VectorInput(c, rest + 4, &pending_last_steps));
  // Rows agree in number (the slots' too; their widths are the table's to check), pending entries too.
  DimensionHandle n = c->Dim(keys, 0), p = c->Dim(pending_keys, 0);
  TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(weights, 0), &n));
  TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(counts, 0), &n));
  TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(last_steps, 0), &n));
  for (const ShapeHandle& s : slots) TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(s, 0), &n));
  TF_RETURN_IF_ERROR(c->Merge(p, c->Dim(pending_counts, 0), &p));
  TF_RETURN_IF_ERROR(c->Merge(p, c->Dim(pending_last_steps, 0), &p));
  *shapes = {keys, weights};
  shapes->insert(shapes->end(), slots.begin(), slots.end());
  shapes->insert(shapes->end(), {counts, last_steps, pending_keys, pending_counts, pending_last_steps});
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("TfEmbed>DynamicTableExport")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("weights: float32")
    .Output("slots: num_slots * float32")
    .Output("counts: int64")
    .Output("last_steps: int64")
    .Output("pending_keys: int64")
    .Output("pending_counts: int64")
    .Output("pending_last_steps: int64")
    .Attr("num_slots: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      return ContentOutputShapes(c, 0);
    })
    .Doc(R"doc(
The table's whole content, sorted by key (deterministic checkpoints; shared access).

keys: [n] (for string tables, the fingerprints).  weights: [n, dim].  slots: one [n, w_k] tensor per optimizer
  slot, Load/Retrieve order (w_k = dim, or 1 for a per-row slot).  num_slots must be the table's slot count.
counts: [n] frequency counts.  last_steps: [n] last step each key was seen.
pending_keys, pending_counts, pending_last_steps: [p] the admission counts of keys without a row yet, by key.
)doc");

REGISTER_OP("TfEmbed>DynamicTableImport")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("weights: float32")
    .Input("slots: num_slots * float32")
    .Input("counts: int64")
    .Input("last_steps: int64")
    .Input("pending_keys: int64")
    .Input("pending_counts: int64")
    .Input("pending_last_steps: int64")
    .Attr("num_slots: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      std::vector<ShapeHandle> unused;
      return ContentInputShapes(c, 1, &unused);
    })
    .Doc(R"doc(
Replaces the table's content with the given one (DynamicTableExport's eight tensors; held exclusively).

The content may have any number of rows up to max_rows (the table grows to fit).  dim, the slot count and widths, every
size, unique keys, counts and steps are validated first: a rejected import changes nothing.  The counters
restart from zero.
)doc");

REGISTER_OP("TfEmbed>DynamicTableEvict")
    .Input("table: resource")
    .Input("step: int64")
    .Output("evicted: int64")
    .Attr("policy: {'lru', 'lfu', 'ttl', 'l2_norm', 'decayed_lfu', 'count_and_age'}")
    .Attr("max_rows: int = 0")
    .Attr("ttl_steps: int = 0")
    .Attr("min_norm: float = 0")
    .Attr("decay: float = 1")
    .Attr("min_count: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Evicts rows now by `policy` (held exclusively); returns the number of rows evicted.

policy: lru / lfu shrink the table to max_rows rows (least recently / least frequently seen first, ties broken
  by key); ttl evicts the rows with step - last step > ttl_steps; l2_norm the rows with norm < min_norm;
  count_and_age the rows with count < min_count and step - last step > ttl_steps; decayed_lfu runs one decay
  round (factor `decay`) and shrinks to max_rows (only on a table whose own policy is decayed_lfu).
step: the current global step (>= 0).
)doc");

REGISTER_OP("TfEmbed>DynamicTableEvictKeys")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Output("evicted: int64")
    .Attr("Tkey: {int64, string}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(HandleAndKeys(c, &unused));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Removes these keys' rows (absent keys are ignored, duplicates count once); returns the number of rows evicted.

keys: rank 1; the dtype must be the table's key_dtype.
)doc");

REGISTER_OP("TfEmbed>DynamicTableReadLog")
    .Input("table: resource")
    .Input("cursor: int64")
    .Output("keys: int64")
    .Output("steps: int64")
    .Output("kinds: int32")
    .Output("next_cursor: int64")
    .Output("resync: bool")
    .Output("dropped: int64")
    .Attr("max_entries: int = -1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      DimensionHandle m = c->UnknownDim();
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(m));
      for (int i = 3; i < 6; ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Reads the table's eviction log from `cursor` (shared access; changes nothing, so readers keep their own cursors).

keys, steps, kinds: the entries with sequence numbers in [max(cursor, first), next): the key, the step, and the
  kind (0: evicted by a policy, 1: removed by key, 2: refused admission).  At most max_entries (-1: all).
next_cursor: the cursor of the next read.
resync: the cursor wanted entries the log no longer holds (it keeps eviction_log_capacity entries; an import or a
  restore restarts it): the reader must rebuild from the table's content.  dropped: how many it missed.
)doc");

REGISTER_OP("TfEmbed>DynamicTableRowStats")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("counts: int64")
    .Output("last_steps: int64")
    .Output("norms: float32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      DimensionHandle n = c->UnknownDim();
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Every row's statistics in row order (shared access): key, count, last step seen, L2 norm of the weights.  The
input of a user score (te.dynamic.Score), computed for all rows at once.
)doc");

REGISTER_OP("TfEmbed>DynamicTableEvictByScore")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("scores: float32")
    .Input("step: int64")
    .Output("evicted: int64")
    .Attr("max_rows: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, scores;
      TF_RETURN_IF_ERROR(HandleAndKeys(c, &keys));
      TF_RETURN_IF_ERROR(VectorInput(c, 2, &scores));
      TF_RETURN_IF_ERROR(c->Merge(keys, scores, &keys));
      TF_RETURN_IF_ERROR(ScalarInput(c, 3));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
A user score's eviction round (held exclusively): the rows of `keys` with the lowest scores are evicted until at
most max_rows rows remain (ties: older last step, then smaller key).  keys without a row are ignored.  Scores must
be finite and a key may appear once: a rejected call evicts nothing.
)doc");

REGISTER_OP("TfEmbed>DynamicTableExportPolicyState")
    .Input("table: resource")
    .Output("bloom_counters: uint8")
    .Output("decayed_keys: int64")
    .Output("decayed_counts: float32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(n));
      c->set_output(2, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The lifecycle policies' state beyond the rows (shared access): the Bloom admission filter's packed counters ([0]
without Bloom admission) and decayed LFU's decayed counts by key, sorted ([0] without decayed LFU).
)doc");

REGISTER_OP("TfEmbed>DynamicTableImportPolicyState")
    .Input("table: resource")
    .Input("bloom_counters: uint8")
    .Input("decayed_keys: int64")
    .Input("decayed_counts: float32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle bloom, keys, counts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &bloom));
      TF_RETURN_IF_ERROR(VectorInput(c, 2, &keys));
      TF_RETURN_IF_ERROR(VectorInput(c, 3, &counts));
      return c->Merge(keys, counts, &keys).ok() ? absl::OkStatus()
                                                : absl::InvalidArgumentError("decayed keys and counts differ in size");
    })
    .Doc(R"doc(
Restores the policies' state after an import (held exclusively).  bloom_counters: [parts, bytes], one filter per
shard the state was saved from; one part is taken as is, several are added (saturating: a key's estimate never
drops).  Decayed counts are set for the keys that have a row (others are ignored).  Validated first.
)doc");

}  // namespace tf_embed_ops
