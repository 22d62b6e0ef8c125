// Registration of the dynamic-vocabulary table ops (docs/dynamic_tables_internals.md, "Ops").
//
// A dynamic table is a resource (TfEmbed>DynamicTableHandle) keyed by int64 ids or strings; the fused pair
// DynamicEmbeddingActivations / DynamicSendTPUEmbeddingGradients takes the same per-feature inputs as the static
// EmbeddingActivations / SendTPUEmbeddingGradients (one list entry per feature: splits or sparse indices, keys,
// weights, sample shape), with the keys in place of row ids and the table handles in place of the variables.
// String keys are fingerprinted inside the kernels with TensorFlow's Fingerprint64 (farmhash64), so
// tf.bitcast(tf.fingerprint(s, "farmhash64"), tf.int64) gives a string's int64 key with plain TensorFlow ops.
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/ops/embedding_shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status ScalarInput(InferenceContext* c, int input) {
  ShapeHandle unused;
  return c->WithRank(c->input(input), 0, &unused);
}

absl::Status VectorInput(InferenceContext* c, int input, ShapeHandle* out) {
  return c->WithRank(c->input(input), 1, out);
}

// The table handle (input 0) is a scalar resource.
absl::Status HandleInput(InferenceContext* c) { return ScalarInput(c, 0); }

// The per-table dimension of every value-shaped tensor is only known at run time (it is a creation attr of the
// handle op), so value shapes are [n, ?].
absl::Status KeysToVectorShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(HandleInput(c));
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(VectorInput(c, 1, &keys));
  c->set_output(0, keys);
  return absl::OkStatus();
}

// Keys are a list of types (int64 or string per feature); it must have one entry per feature.
absl::Status CheckKeysPerFeature(InferenceContext* c) {
  int n;
  std::vector<tensorflow::DataType> tkeys;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("Tkeys", &tkeys));
  if (static_cast<int>(tkeys.size()) == n) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("keys has ", tkeys.size(), " tensors but there are ", n,
                                                 " features; give one keys tensor per feature"));
}

absl::Status DynamicActivationsShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckKeysPerFeature(c));
  TF_RETURN_IF_ERROR(ActivationsShapeFn(c));
  return ScalarInput(c, c->num_inputs() - 1);  // step
}

absl::Status DynamicSendGradientsShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckKeysPerFeature(c));
  TF_RETURN_IF_ERROR(SendGradientsShapeFn(c));
  return ScalarInput(c, c->num_inputs() - 1);  // step
}

// The content tensors: keys [n], weights [n, d], S slots [n, w_k] (w_k = d, or 1 for a per-row slot), counts
// [n], last_steps [n], pending_keys [p], pending_counts [p], pending_last_steps [p].  Shapes are per input index:
// the slots list takes S inputs.
absl::Status ContentShapes(InferenceContext* c, int first, std::vector<ShapeHandle>* shapes) {
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

REGISTER_OP("TfEmbed>DynamicTableHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("table_name: string")
    .Attr("dim: int")
    .Attr("key_dtype: {int64, string}")
    .Attr("slot_initial_values: list(float) = []")
    .Attr("slot_widths: list(int) = []")
    .Attr("initial_capacity: int")
    .Attr("max_rows: int")
    .Attr("rows_per_chunk: int = 1024")
    .Attr("initializer: {'zeros', 'constant', 'uniform', 'normal', 'truncated_normal'} = 'zeros'")
    .Attr("initializer_params: list(float) = []")
    .Attr("seed: int = 0")
    .Attr("admission_min_count: int = 1")
    .Attr("max_pending_keys: int = 0")
    .Attr("pending_ttl_steps: int = 0")
    .Attr("eviction: {'none', 'lru', 'lfu', 'ttl', 'l2_norm', 'decayed_lfu', 'count_and_age'} = 'none'")
    .Attr("eviction_max_rows: int = 0")
    .Attr("eviction_ttl_steps: int = 0")
    .Attr("eviction_min_norm: float = 0")
    .Attr("eviction_decay: float = 1")
    .Attr("eviction_min_count: int = 0")
    .Attr("bloom_num_counters: int = 0")
    .Attr("bloom_num_hashes: int = 0")
    .Attr("bloom_counter_bits: int = 8")
    .Attr("log_refused: bool = false")
    .Attr("eviction_log_capacity: int = 1048576")
    .Attr("storage_dtype: {'float32', 'bfloat16', 'float16'} = 'float32'")
    .Attr("slot_storage_dtype: {'float32', 'bfloat16', 'float16'} = 'float32'")
    .Attr("rounding: {'stochastic', 'nearest'} = 'stochastic'")
    // A tiered table (docs/tiered_tables.md): the rows in the row file tiered_path ('' : in memory) behind a DRAM
    // cache of tiered_cache_bytes; 'overwrite' removes an existing file first ('create' refuses it).
    .Attr("tiered_path: string = ''")
    .Attr("tiered_cache_bytes: int = 0")
    .Attr("tiered_mode: {'create', 'overwrite'} = 'create'")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (on its first run) or looks up a dynamic-vocabulary embedding table in the resource manager.

The table is the resource (container, shared_name); an empty shared_name uses the node name and makes the table
private to this kernel (deleted with it).  A table that already exists under that name must have been created
with exactly the same options: any difference is an InvalidArgument error naming the table and the option.
Destroy the table with DestroyResourceOp.  Every option is validated (InvalidArgument naming the table and the
value) before anything is allocated.

table_name: names the table in every error message.
dim: the embedding dimension, in [1, 2^20].
key_dtype: int64 (keys used as given) or string (keys are TensorFlow's Fingerprint64 of the bytes, i.e.
  tf.fingerprint(s, "farmhash64") read as a little-endian int64).
slot_initial_values: the initial value of each optimizer slot of a new row, in Load/Retrieve order (at most 16).
slot_widths: the floats per row of each slot, in the same order: dim, or 1 for a per-row slot (row-wise Adagrad's
  accumulator), as the optimizer schema declares; [] means every slot is dim wide.  The training ops check them
  against the config's optimizer.
initial_capacity: rows allocated up front, in [1, max_rows]; the table grows beyond it.
max_rows: the most rows the table holds, in [1, 2^31 - 1]; admitted keys beyond it are refused (counted).
rows_per_chunk: allocation granularity, a power of two up to 2^20 (rows never move when the table grows).
initializer: how a new row is initialised, as a pure function of (seed, key, column).
initializer_params: [] (zeros), [value] (constant), [minval, maxval] (uniform), [mean, stddev] (normal,
  truncated_normal: redrawn outside 2 stddev).
seed: the initializer's seed.
admission_min_count: a key gets a row once it has been seen this many times (1: at once).
max_pending_keys: the most keys counted towards admission at once (required when admission_min_count > 1).
pending_ttl_steps: a pending count not updated for more than this many steps is dropped (0: never).
eviction: the policy applied at the end of every training step: lru / lfu / decayed_lfu shrink the table to
  eviction_max_rows rows (least recently / least frequently seen first / lowest decayed count), ttl evicts rows not
  seen for more than eviction_ttl_steps steps, l2_norm rows whose weights' L2 norm is < eviction_min_norm,
  count_and_age rows with count < eviction_min_count not seen for more than eviction_ttl_steps steps.
eviction_decay: decayed_lfu's factor in (0, 1]: every end of step multiplies each row's decayed count by it and
  adds the row's sightings since the previous step.
bloom_num_counters: > 0 replaces the exact pending counts by a counting Bloom filter of this many counters of
  bloom_counter_bits bits (4, 8 or 16), bloom_num_hashes counters per key; a key is admitted when the minimum of
  its counters reaches admission_min_count.
log_refused: also append every key a training lookup gives no row to the eviction log.
eviction_log_capacity: entries the eviction log keeps (the oldest are dropped first).
storage_dtype: the element type the rows are stored in (docs/low_precision.md): float32, or bfloat16 / float16
  (half the memory; the optimizer runs in float32 on the widened row, which is then rounded back; lookups,
  exports and serving read float32).
slot_storage_dtype: the same for the optimizer slots.
rounding: how a 16-bit row is rounded back after each update: stochastic (unbiased; the bits are a function of
  (seed, step, buffer, key, column), so independent of threads and of the row a key has) or nearest.  Initial
  values and imports are rounded to nearest.
tiered_path: '' keeps the rows in memory.  Else the rows and their slots live in this row file (created; it is
  removed when the table is destroyed: without the keys, which stay in memory, it means nothing) behind a DRAM
  cache; the keys, the key index and every key's metadata stay in memory (docs/tiered_tables.md).  L2Norm
  eviction (it reads every row) is refused for such a table.
tiered_cache_bytes: the DRAM budget of that cache; a training lookup's distinct keys must fit in it.
tiered_mode: create (an existing file is refused) or overwrite (an existing file is removed first).
)doc");

REGISTER_OP("TfEmbed>DynamicEmbeddingActivations")
    .Input("sample_indices_or_row_splits: N * int64")
    .Input("keys: Tkeys")
    .Input("aggregation_weights: N * float32")
    .Input("sample_shapes: N * int64")
    .Input("tables: T * resource")
    .Input("step: int64")
    .Output("activations: N * float32")
    .Attr("config: string")
    .Attr("combiners: list(string) = []")
    .Attr("training: bool = false")
    .Attr("N: int >= 1")
    .Attr("T: int >= 1")
    .Attr("Tkeys: list({int64, string})")
    .SetIsStateful()
    .SetShapeFn(DynamicActivationsShapeFn)
    .Doc(R"doc(
Looks up and combines the embeddings of N features over dynamic tables (the forward pass).

The inputs and combiners are those of EmbeddingActivations, with keys instead of row ids: feature i reads table
config.feature_descriptor[i].table_id, and its activation has shape sample_shapes[i] + [dim].  A key without a
row reads the default row (zeros), which is combined like any other row.

training=True is the training lookup: each table's keys (all its features, in feature order) are counted, new
keys that reach the admission count get a row initialised from the key (up to max_rows), and every key seen is
stamped with `step`; the table is held exclusively meanwhile.  training=False never changes the table (shared
access).

config: a serialized TPUEmbeddingConfiguration: one table per dynamic table (dimension = the table's dim,
  vocabulary_size = its max_rows, its optimizer) and one feature descriptor per feature.
combiners: as for EmbeddingActivations.
Tkeys: per feature, int64 or string; it must equal the key_dtype of the feature's table.
tables: the dynamic table handles, in table order.
step: the global step (>= 0) the training lookup stamps on the keys it sees.
)doc");

REGISTER_OP("TfEmbed>DynamicSendTPUEmbeddingGradients")
    .Input("inputs: N * float32")
    .Input("learning_rates: NN * float32")
    .Input("sample_indices_or_row_splits: N * int64")
    .Input("keys: Tkeys")
    .Input("aggregation_weights: N * float32")
    .Input("sample_shapes: N * int64")
    .Input("tables: T * resource")
    .Input("step: int64")
    .Attr("config: string")
    .Attr("combiners: list(string) = []")
    .Attr("N: int >= 1")
    .Attr("NN: int >= 0 = 0")
    .Attr("T: int >= 1")
    .Attr("Tkeys: list({int64, string})")
    .Attr("check_numerics: bool = false")
    .Attr("validate_only: bool = false")
    .SetIsStateful()
    .SetShapeFn(DynamicSendGradientsShapeFn)
    .Doc(R"doc(
Applies one training step to dynamic tables in place, then their end-of-step eviction.

The inputs are those of SendTPUEmbeddingGradients with keys instead of row ids and table handles instead of the
table and slot variables.  Keys are mapped to rows without inserting (the rows this step's training lookup
made); keys without a row get no update.  The update is the static tables' row pipeline (gradient clipping,
weight decay, the optimizer, weight clipping) over the touched rows (every row for non-lazy Adam).  Then each
table's eviction policy runs at the boundary after `step`.  Everything is validated before the first write:
a rejected call changes no table.  Each table is held exclusively during its update.

learning_rates: one scalar per dynamic learning-rate tag, in tag order; each must be finite and >= 0.
check_numerics: also reject a step whose gradients hold NaN or +-inf, or whose update would first make a row's
  value NaN or +-inf (a per-row gradient sum that overflows, say).
step: the global step (>= 0) that ends with this update.
validate_only: run every check of the call (with check_numerics, the update computed without writing) and
  write nothing: no row, no eviction (the tables are held shared).  What runs this before another op that
  writes (the static tables' send op of the same step) makes the pair all-or-nothing.
)doc");

REGISTER_OP("TfEmbed>DynamicTableFind")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Output("rows: int64")
    .Attr("Tkey: {int64, string}")
    .SetIsStateful()
    .SetShapeFn(KeysToVectorShapeFn)
    .Doc(R"doc(
The row index of each key, or -1 for a key without a row.  Never inserts (shared access).

keys: rank 1; the dtype must be the table's key_dtype.
)doc");

REGISTER_OP("TfEmbed>DynamicTableLookup")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Output("values: float32")
    .Attr("Tkey: {int64, string}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &keys));
      c->set_output(0, c->Matrix(c->Dim(keys, 0), c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The weights row of each key, [n, dim]; zeros for a key without a row.  Never inserts (shared access).

keys: rank 1; the dtype must be the table's key_dtype.
)doc");

REGISTER_OP("TfEmbed>DynamicTableStats")
    .Input("table: resource")
    .Output("size: int64")
    .Output("capacity: int64")
    .Output("memory_bytes: int64")
    .Output("inserts: int64")
    .Output("below_admission: int64")
    .Output("untracked: int64")
    .Output("refused_full: int64")
    .Output("evictions: int64")
    .Output("last_step_inserts: int64")
    .Output("last_step_refused: int64")
    .Output("last_step_evictions: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
The table's size and counters, as int64 scalars (shared access).

size: rows held.  capacity: rows allocated.  memory_bytes: bytes of rows, slots, metadata and the key index.
inserts, below_admission, untracked, refused_full, evictions: totals since creation or the last import (keys
  counted once per lookup call).
last_step_inserts, last_step_refused, last_step_evictions: the same for the latest step number the table saw (a
  training lookup, a fused update's end-of-step eviction or an explicit eviction at that step).
)doc");

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
      DimensionHandle n = c->UnknownDim(), p = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, c->UnknownDim()));
      int num_slots = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
      for (int k = 0; k < num_slots; ++k) c->set_output(2 + k, c->Matrix(n, c->UnknownDim()));
      const int rest = 2 + num_slots;
      c->set_output(rest, c->Vector(n));
      c->set_output(rest + 1, c->Vector(n));
      for (int i = rest + 2; i < rest + 5; ++i) c->set_output(i, c->Vector(p));
      return absl::OkStatus();
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
      return ContentShapes(c, 1, &unused);
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
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &unused));
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
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle keys, scores;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &keys));
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
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &keys));
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Matrix(c->Dim(keys, 0), c->UnknownDim()));
      return absl::OkStatus();
    })
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
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle keys, m;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &keys));
      for (int i = 2; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &m));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Writes the rows of `keys` of a tiered table (held exclusively) from float32 weights [n, dim] and slots [n, w_k]
(16-bit storage rounds to nearest).  Every key must have a row and appear once; everything is checked before the
first row is written.
)doc");

}  // namespace tf_embed_ops
