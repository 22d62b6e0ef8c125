"""Serving without the plugin: the embedding lookup as plain TensorFlow ops, and a SavedModel exporter.

`plain_lookup` computes exactly what our `EmbeddingActivations` op computes (same normalisation, combiners,
sequence layout, simulated quantization) from gathers and segment sums only, so a model exported with
`export_for_serving` loads in TF Serving or any TensorFlow without `tf_embed_ops`. Dynamic tables are frozen at
export into a `tf.lookup.StaticHashTable` (key -> row) and a dense variable with a default row of zeros
(`tf_embed_ops.dynamic.serving`), saved with the model.

Example:
    >>> export_for_serving(model, "/tmp/ctr", input_signature=[{"user": tf.TensorSpec([None], tf.int64)}])
    >>> # elsewhere, without tf_embed_ops:
    >>> tf.saved_model.load("/tmp/ctr").signatures["serving_default"](user=tf.constant([3, 7], tf.int64))
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat

__all__ = [
    "FrozenDynamicGroup",
    "export_for_serving",
    "frozen_dynamic_group",
    "plain_lookup",
    "trace_serving_function",
]


def _quantize(rows: tf.Tensor, quantization: Any) -> tf.Tensor:
    """Simulated quantization of gathered rows (docs/semantics.md): clip, then round to one of num_buckets levels."""
    lo, hi, n = float(quantization.lower), float(quantization.upper), int(quantization.num_buckets)
    step = (hi - lo) / (n - 1)
    x = tf.clip_by_value(rows, lo, hi)
    return tf.floor((x - lo) / step + 0.5) * step + lo


def plain_lookup(feature_input: Any, dense: bool, table: Any, dim: int, combiner: str, quantization: Any = None):
    """One feature's activation from a normalised `FeatureInput`, with plain TensorFlow ops only.

    Args:
      feature_input: `embedding_ops.FeatureInput` (what `normalize_feature` returns).
      dense: True when the feature came from a dense Tensor (its splits input is then empty).
      table: the [vocabulary_size, dim] table (variable or tensor).
      dim: the table's dimension.
      combiner: "sum", "mean" or "sqrtn".
      quantization: the table's `QuantizationConfig`, or None.

    Returns:
      A float32 tensor of shape sample_shape + [dim].
    """
    splits, ids, weights, sample_shape = feature_input
    ids = tf.cast(ids, tf.int64)
    sample_shape = tf.cast(sample_shape, tf.int64)
    num_samples = tf.reduce_prod(sample_shape)
    if splits.shape.rank == 2:
        # Sparse: the sample is the row-major position of indices[:, :-1] inside sample_shape.
        coords = tf.cast(splits[:, :-1], tf.int64)
        strides = tf.math.cumprod(sample_shape, exclusive=True, reverse=True)
        sample = tf.reduce_sum(coords * strides[tf.newaxis, :], axis=1)
    elif dense:
        sample = tf.range(tf.size(ids, out_type=tf.int64), dtype=tf.int64)
    else:
        sample = tf.ragged.row_splits_to_segment_ids(tf.cast(splits, tf.int64), out_type=tf.int64)
    weights = tf.cast(weights, tf.float32)
    if weights.shape.rank == 1 and weights.shape[0] == 0:
        weights = tf.ones(tf.shape(ids), tf.float32)
    elif weights.shape[0] is None:
        weights = tf.cond(tf.size(weights) > 0, lambda: weights, lambda: tf.ones(tf.shape(ids), tf.float32))
    if combiner == "sum":
        scale = weights
    else:
        per_id = weights if combiner == "mean" else tf.square(weights)
        norm = tf.math.unsorted_segment_sum(per_id, sample, num_samples)
        if combiner == "sqrtn":
            norm = tf.sqrt(norm)
        scale = tf.math.divide_no_nan(weights, tf.gather(norm, sample))
    # A 16-bit table (te.TableConfig) is exported as stored; its rows are widened as the op widens them.
    rows = tf.cast(tf.gather(table, ids), tf.float32)
    if quantization is not None:
        rows = _quantize(rows, quantization)
    acts = tf.math.unsorted_segment_sum(rows * scale[:, tf.newaxis], sample, num_samples)
    return tf.reshape(acts, tf.concat([sample_shape, [dim]], axis=0))


# "frozen": {id(dynamic table object): (the object, its FrozenDynamicTable)}, the dynamic tables frozen while
# serving functions were traced in this context (export_for_serving saves them with the model).
# "freeze": the function that makes a dynamic table's serving copy (None: `tf_embed_ops.dynamic.serving.freeze`;
# `tf_embed_ops.serving` passes one that makes updatable copies).
_SERVING_MODE: dict[str, Any] = {"on": False, "frozen": {}, "freeze": None}


@contextlib.contextmanager
def serving_mode(freeze: Any = None):
    """Inside this context, `tf_embed_ops.keras.TPUEmbedding` layers trace plain-TF lookups (no custom op); dynamic
    tables are frozen (`freeze`, by default `tf_embed_ops.dynamic.serving.freeze`) on first use, once per context.

    Args:
      freeze: optional callable DynamicTable -> an object with `rows(ids)`, `values` and `dim` (as
        `FrozenDynamicTable`), called eagerly once per table.
    """
    saved = dict(_SERVING_MODE)
    _SERVING_MODE.update(on=True, frozen={}, freeze=freeze)
    try:
        yield
    finally:
        _SERVING_MODE.update(saved)


def frozen_tables() -> list:
    """The `FrozenDynamicTable`s made so far in the current `serving_mode` context."""
    return [frozen for _, frozen in _SERVING_MODE["frozen"].values()]


def _frozen(table: Any) -> Any:
    from tf_embed_ops.dynamic import serving as dynamic_serving  # pylint: disable=import-outside-toplevel

    entry = _SERVING_MODE["frozen"].get(id(table))
    if entry is None:
        freeze = _SERVING_MODE["freeze"] or dynamic_serving.freeze
        entry = (table, freeze(table))  # the object is kept so that its id stays unique
        _SERVING_MODE["frozen"][id(table)] = entry
    return entry[1]


class FrozenDynamicGroup:
    """Stands in for a layer's `DynamicGroup` while serving: the same features, looked up in frozen copies of
    the tables with plain TensorFlow (a StaticHashTable key -> row, then `plain_lookup` over the dense rows, whose
    extra default row of zeros is what the training side reads for a key without a row)."""

    def __init__(self, group: Any):
        self._group = group
        self.positions = group.positions
        self.static_positions = group.static_positions

    def lookup(self, inputs: list, training: bool = False) -> list:
        del training  # serving never inserts
        tables = self._group.tables
        out = []
        for feature, inp in zip(self._group.features, inputs, strict=True):
            frozen = _frozen(tables[feature.table])
            dense = inp.sample_indices_or_row_splits.shape.as_list() == [0]
            rows = inp._replace(ids=frozen.rows(inp.ids))
            out.append(plain_lookup(rows, dense, frozen.values, frozen.dim, feature.table.combiner))
        return out


def frozen_dynamic_group(group: Any) -> FrozenDynamicGroup:
    """The serving stand-in of a `DynamicGroup` (see `FrozenDynamicGroup`)."""
    return FrozenDynamicGroup(group)


def in_serving_mode() -> bool:
    return _SERVING_MODE["on"]


def _custom_ops_in(graph_def: Any) -> list:
    ops = {n.op for n in graph_def.node}
    for f in graph_def.library.function:
        ops.update(n.op for n in f.node_def)
    return sorted(op for op in ops if op.startswith("TfEmbed"))


def _arg_name(path: str, used: set) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", path).strip("_") or "input"
    if not name[0].isalpha():
        name = "x_" + name
    base, i = name, 1
    while name in used:
        name = f"{base}_{i}"
        i += 1
    used.add(name)
    return name


def trace_serving_function(model: Any, input_signature: Any, freeze: Any = None) -> tuple:
    """Traces `model` in serving mode into a concrete function of plain tensors (no `tf_embed_ops` op).

    Args:
      model: as `export_for_serving`.
      input_signature: as `export_for_serving`.
      freeze: as `serving_mode`.

    Returns:
      (concrete function, {signature argument name: component spec}, the frozen dynamic tables it reads).

    Raises:
      RuntimeError: if a `TfEmbed>` op would end up in the serving graph.
    """
    specs = tf.nest.flatten(input_signature, expand_composites=True)
    used: set = set()
    names = [_arg_name(path, used) for path, _ in _component_paths(input_signature)]
    signature = [tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(specs, names, strict=False)]

    def serve(*components):
        inputs = tf.nest.pack_sequence_as(input_signature, list(components), expand_composites=True)
        outputs = model(inputs, training=False)
        if isinstance(outputs, dict):
            return outputs
        return (
            {"output_0": outputs}
            if not isinstance(outputs, (list, tuple))
            else {f"output_{i}": o for i, o in enumerate(outputs)}
        )

    with serving_mode(freeze):  # one context for the trace: each dynamic table is frozen once, and kept below
        concrete = tf.function(serve, input_signature=signature, autograph=False).get_concrete_function()
        frozen = frozen_tables()
    custom = _custom_ops_in(concrete.graph.as_graph_def())
    if custom:
        raise RuntimeError(f"The serving graph still contains custom ops {custom}; a layer ignored serving_mode.")
    return concrete, dict(zip(names, specs, strict=False)), frozen


def export_for_serving(model: Any, filepath: str, input_signature: Any) -> dict:
    """Writes a SavedModel whose `serving_default` signature runs `model` without any `tf_embed_ops` op.

    Composite inputs (RaggedTensorSpec, SparseTensorSpec) become their component tensors in the signature,
    named after their path (e.g. `genres_values`, `genres_row_splits`), since signatures take plain tensors.

    Args:
      model: a Keras model (or any callable Trackable) that uses `tf_embed_ops.keras.TPUEmbedding` layers.
      filepath: the SavedModel directory.
      input_signature: the nest of specs of `model`'s single positional input.

    Returns:
      {signature argument name: component spec}, the signature's inputs.

    Raises:
      RuntimeError: if a `TfEmbed>` op would end up in the serving graph.
    """
    concrete, inputs, frozen = trace_serving_function(model, input_signature)
    # Track the backing tf.Variables, not the Keras model: saving a Keras model object makes Keras add its own
    # default signature, traced from the model's Input specs (which breaks on ragged/sparse inputs).
    root = tf.Module()
    root.serving_variables = [getattr(v, "value", v) for v in model.variables]
    root.dynamic_tables = frozen  # frozen dynamic tables: StaticHashTable + dense rows, plain TensorFlow state
    tf.saved_model.save(root, filepath, signatures={"serving_default": concrete})
    return inputs


def _component_paths(structure: Any) -> list:
    """(path, component spec) for every tensor component, in flatten(expand_composites=True) order."""
    out = []
    paths = list(_tf_compat.yield_flat_paths(structure))
    for path, spec in zip(paths, tf.nest.flatten(structure), strict=False):
        base = "_".join(str(k) for k in path)
        components = tf.nest.flatten(spec, expand_composites=True)
        if len(components) == 1 and isinstance(spec, tf.TensorSpec):
            out.append((base, components[0]))
        elif isinstance(spec, tf.RaggedTensorSpec):
            suffixes = ["values"] + [f"row_splits_{i}" if i else "row_splits" for i in range(len(components) - 1)]
            out.extend((f"{base}_{s}", c) for s, c in zip(suffixes, components, strict=False))
        elif isinstance(spec, tf.SparseTensorSpec):
            names = ["indices", "values", "dense_shape"]
            out.extend((f"{base}_{s}", c) for s, c in zip(names, components, strict=False))
        else:
            out.extend((f"{base}_{i}", c) for i, c in enumerate(components))
    return out
