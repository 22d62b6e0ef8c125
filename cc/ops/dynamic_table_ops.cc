// Registration of the dynamic-vocabulary table ops (docs/dynamic_tables_internals.md, "Ops").
//
// A dynamic table is a resource (TfEmbed>DynamicTableHandle) keyed by int64 ids or strings; the fused pair
// DynamicEmbeddingActivations / DynamicSendTPUEmbeddingGradients takes the same per-feature inputs as the static
// EmbeddingActivations / SendTPUEmbeddingGradients (one list entry per feature: splits or sparse indices, keys,
// weights, sample shape), with the keys in place of row ids and the table handles in place of the variables.
// String keys are fingerprinted inside the kernels with TensorFlow's Fingerprint64 (farmhash64), so
// tf.bitcast(tf.fingerprint(s, "farmhash64"), tf.int64) gives a string's int64 key with plain TensorFlow ops.
//
// The lifecycle ops (export, import, eviction, the log, the policies' state) are in dynamic_table_lifecycle_ops.cc,
// those of a tiered dynamic table in dynamic_table_tiered_ops.cc.
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/ops/embedding_shape_fns.h"
#include "cc/ops/resource_shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_embed_ops {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Find: the rows of the keys, [n].
absl::Status KeysToVectorShapeFn(InferenceContext* c) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(HandleAndKeys(c, &keys));
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
    .SetShapeFn(KeyedRowsShapeFn)
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
}  // namespace tf_embed_ops
