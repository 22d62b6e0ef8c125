"""Serving without the plugin: the embedding lookup as plain TensorFlow ops, and a SavedModel exporter.

`plain_lookup` computes exactly what our `EmbeddingActivations` op computes (same normalisation, combiners,
sequence layout, simulated quantization) from gathers and segment sums only, so a model exported with
`export_for_serving` loads in TF Serving or any TensorFlow without `tf_embed_ops`. Dynamic tables are frozen at
export into a `tf.lookup.StaticHashTable` (key -> row) and a dense variable with a default row of zeros
(`tf_embed_ops.dynamic.serving`), saved with the model. `export_for_serving(..., quantization=..., prune=...)`
stores tables encoded (int8/int4 row-wise, float16, bfloat16) and/or pruned (`tf_embed_ops.serving`), decoded after
the gather with stock ops.

Example:
    >>> export_for_serving(model, "/tmp/ctr", input_signature=[{"user": tf.TensorSpec([None], tf.int64)}])
    >>> # elsewhere, without tf_embed_ops:
    >>> tf.saved_model.load("/tmp/ctr").signatures["serving_default"](user=tf.constant([3, 7], tf.int64))
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
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


def _served_form(table: Any) -> Any:
    """The table's serving form when the export replaced it (quantized or pruned), else the table."""
    served = _SERVING_MODE["served"].get(id(table))
    return served[1] if served is not None and served[0] is table else table


def _gather_rows(table: Any, ids: tf.Tensor) -> tf.Tensor:
    """Float32 rows of `ids`: decoded from a serving form (ServedTable, FrozenDynamicTable), else gathered from
    the table as stored (a 16-bit te.TableConfig table widened as the op widens it)."""
    if hasattr(table, "gather_rows"):
        return table.gather_rows(ids)
    return tf.cast(tf.gather(table, ids), tf.float32)


def _combine(table: Any, ids: tf.Tensor, scale: tf.Tensor, sample: tf.Tensor, num_samples: Any, quantization: Any):
    """unsorted_segment_sum over samples of each id's row times its combiner `scale`.

    For an int8/int4 serving form, each row is code * s + b (per-row s, b): the sum is taken as
    sum(code * (scale * s)) + sum(scale * b), the scale folded into the weight and the biases added once per
    output, which avoids two passes over the gathered rows (the lookup's latency stays near float32's); it differs
    from combining the decoded rows by float32 rounding only (a few ulps of sum(|scale| * (|code * s| + |b|))).
    """
    parts = table.gather_parts(ids) if quantization is None and hasattr(table, "gather_parts") else None
    if parts is not None:
        codes, row_scale, row_bias = parts
        acts = tf.math.unsorted_segment_sum(codes * (scale * row_scale)[:, tf.newaxis], sample, num_samples)
        return acts + tf.math.unsorted_segment_sum(scale * row_bias, sample, num_samples)[:, tf.newaxis]
    rows = _gather_rows(table, ids)
    if quantization is not None:
        rows = _quantize(rows, quantization)
    return tf.math.unsorted_segment_sum(rows * scale[:, tf.newaxis], sample, num_samples)


def plain_lookup(feature_input: Any, dense: bool, table: Any, dim: int, combiner: str, quantization: Any = None):
    """One feature's activation from a normalised `FeatureInput`, with plain TensorFlow ops only.

    Args:
      feature_input: `embedding_ops.FeatureInput` (what `normalize_feature` returns).
      dense: True when the feature came from a dense Tensor (its splits input is then empty).
      table: the [vocabulary_size, dim] table (variable or tensor), or an object with a `gather_rows(ids)` method
        returning float32 rows (a table's serving form: `tf_embed_ops.serving.ServedTable`, a frozen dynamic table).
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
    acts = _combine(_served_form(table), ids, scale, sample, num_samples, quantization)
    return tf.reshape(acts, tf.concat([sample_shape, [dim]], axis=0))


# "frozen": {id(dynamic table object): (the object, its FrozenDynamicTable)}, the dynamic tables frozen while
# serving functions were traced in this context (export_for_serving saves them with the model).
# "served": {id(static table variable): (the variable, its ServedTable)}, the static tables an export replaces.
# "dynamic": {dynamic table name: (quantization mode, Prune or None)}, how the export freezes dynamic tables.
# "freeze": the function that makes a dynamic table's serving copy (None: `tf_embed_ops.dynamic.serving.freeze` with
# the table's "dynamic" entry; `tf_embed_ops.serving`'s publisher passes one that makes updatable copies).
_SERVING_MODE: dict[str, Any] = {"on": False, "frozen": {}, "served": {}, "dynamic": {}, "freeze": None}


@contextlib.contextmanager
def serving_mode(served: dict | None = None, dynamic: dict | None = None, freeze: Any = None):
    """Inside this context, `tf_embed_ops.keras.TPUEmbedding` layers trace plain-TF lookups (no custom op); dynamic
    tables are frozen on first use, once per context.

    Args:
      served: {id(static table variable): (variable, replacement with `gather_rows`)}: tables read from their
        serving form (export_for_serving's quantized or pruned tables).
      dynamic: {dynamic table name: (quantization mode, Prune or None)}: how dynamic tables are frozen.
      freeze: optional callable DynamicTable -> an object with `rows(ids)`, `values` and `dim` (as
        `FrozenDynamicTable`), called eagerly once per table, in place of `tf_embed_ops.dynamic.serving.freeze`.
    """
    previous = dict(_SERVING_MODE)
    _SERVING_MODE.update(on=True, frozen={}, served=dict(served or {}), dynamic=dict(dynamic or {}), freeze=freeze)
    try:
        yield
    finally:
        _SERVING_MODE.update(previous)


def frozen_tables() -> list:
    """The `FrozenDynamicTable`s made so far in the current `serving_mode` context."""
    return [frozen for _, frozen in _SERVING_MODE["frozen"].values()]


def _frozen(table: Any) -> Any:
    from tf_embed_ops.dynamic import serving as dynamic_serving  # pylint: disable=import-outside-toplevel

    entry = _SERVING_MODE["frozen"].get(id(table))
    if entry is None:
        if _SERVING_MODE["freeze"] is not None:
            copy = _SERVING_MODE["freeze"](table)
        else:
            mode, prune = _SERVING_MODE["dynamic"].get(table.table_name, (None, None))
            # A tiered table's rows are not read here: its serving form's rows are streamed into the SavedModel
            # after it is saved (`tf_embed_ops.serving.streamed.write_rows` finds it among the frozen tables).
            tiered = getattr(table, "tiered", None) is not None
            freeze = dynamic_serving.freeze_streamed if tiered else dynamic_serving.freeze
            copy = freeze(table, mode, prune)
        entry = (table, copy)  # the object is kept so that its id stays unique
        _SERVING_MODE["frozen"][id(table)] = entry
    return entry[1]


class ServedTieredGroup:
    """Stands in for a layer's `TieredGroup` while serving: the same features, looked up with plain TensorFlow in
    the tables' serving forms (`tf_embed_ops.serving.streamed.StreamedTable`, which `export_for_serving` makes)."""

    def __init__(self, group: Any):
        self._group = group
        self.positions = group.positions
        self.static_positions = group.static_positions

    def lookup(self, inputs: list, training: bool = False) -> list:
        del training
        tables = self._group.tables
        out = []
        for feature, inp in zip(self._group.features, inputs, strict=True):
            table = tables[feature.table]
            if _served_form(table) is table:
                raise ValueError(
                    f"Tiered table {feature.table.name!r}: its rows live in a row file a serving graph cannot read; "
                    "export the model with te.keras.export_for_serving or publish it with te.serving.Publisher, "
                    "which write the rows into the SavedModel chunk by chunk"
                )
            dense = inp.sample_indices_or_row_splits.shape.as_list() == [0]
            table_config = feature.table
            out.append(
                plain_lookup(
                    inp, dense, table, table_config.dim, table_config.combiner, table_config.quantization_config
                )
            )
        return out


def served_tiered_group(group: Any) -> ServedTieredGroup:
    """The serving stand-in of a `TieredGroup` (see `ServedTieredGroup`)."""
    return ServedTieredGroup(group)


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
            out.append(plain_lookup(rows, dense, frozen, frozen.dim, feature.table.combiner))
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


def _embedding_tables(model: Any) -> dict:
    """{table name: ("static", TableConfig, variable) | ("dynamic", DynamicTableConfig, table) | ("tiered",
    TableConfig, TieredTable)} of every `tf_embed_ops.keras.TPUEmbedding` layer (DistributedEmbedding included)
    inside `model`."""
    from tf_embed_ops.keras import layer as layer_lib  # pylint: disable=import-outside-toplevel  (imports us)

    if isinstance(model, layer_lib.TPUEmbedding):
        layers = [model]
    elif hasattr(model, "_flatten_layers"):
        # Every layer at any depth (layers held by custom layers included), as Keras' own weight tracking walks them.
        flat = model._flatten_layers(include_self=True)  # noqa: SLF001 - Keras has no public recursive walk
        layers = [x for x in flat if isinstance(x, layer_lib.TPUEmbedding)]
    else:
        layers = []
    tables: dict = {}
    for layer in layers:
        found = [("static", c, v) for c, v in layer.embedding_tables.items()]
        found += [("dynamic", c, t) for c, t in layer.dynamic_tables.items()]
        found += [("tiered", c, t) for c, t in layer.tiered_tables.items()]
        for kind, config, obj in found:
            if config.name in tables and tables[config.name][2] is not obj:
                # Per-table options are given by name: two tables of one name could not be told apart.
                tables[config.name] = ("ambiguous", config, None)
            else:
                tables[config.name] = (kind, config, obj)
    return tables


def _per_table(argument: str, value: Any, tables: dict) -> dict:
    """{table name: value} from a {table name: value} mapping, refusing names the model does not have."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{argument}: expected a dict {{table name: ...}}; got {value!r}")
    for name in value:
        if name not in tables:
            raise ValueError(f"{argument}: unknown table {name!r}; the model's embedding tables are {sorted(tables)}")
        _check_unambiguous(argument, name, tables)
    return dict(value)


def _check_unambiguous(argument: str, name: str, tables: dict) -> None:
    if tables[name][0] == "ambiguous":
        raise ValueError(
            f"{argument}: the model has two embedding tables named {name!r} (in different layers); give them "
            "different names to quantize or prune them"
        )


def _plan(tables: dict, quantization: Any, prune: Any) -> dict:
    """{table name: (quantization mode, Prune or None)} for the tables an export changes; validates everything."""
    from tf_embed_ops.serving import prune as prune_lib  # pylint: disable=import-outside-toplevel
    from tf_embed_ops.serving import quantization as quantization_lib  # pylint: disable=import-outside-toplevel

    if quantization is None:
        modes: dict = {}
    elif isinstance(quantization, Mapping):
        modes = _per_table("quantization", quantization, tables)
        for name, mode in modes.items():
            quantization_lib.check_mode(mode, name)
    else:
        quantization_lib.check_mode(quantization, "(every table)")
        if not tables:
            raise ValueError(
                f"quantization={quantization!r}: the model has no tf_embed_ops.keras.TPUEmbedding table to quantize"
            )
        for name in tables:
            _check_unambiguous("quantization", name, tables)
        modes = dict.fromkeys(tables, quantization)
    prunes = {} if prune is None else _per_table("prune", prune, tables)
    for name, criteria in prunes.items():
        if tables[name][0] == "tiered":
            raise ValueError(
                f"prune: table {name!r} is tiered (storage=te.Tiered): pruning at export is not supported for tiered "
                "tables yet (it ranks the whole table's rows); export it unpruned, quantized if it must be smaller"
            )
        prune_lib.check_applicable(criteria, name, dynamic=tables[name][0] == "dynamic")
    plan = {}
    for name in tables:
        mode, criteria = modes.get(name), prunes.get(name)
        if mode is not None or criteria is not None:
            plan[name] = (mode, criteria)
    return plan


def trace_serving_function(
    model: Any, input_signature: Any, freeze: Any = None, served: dict | None = None, dynamic: dict | None = None
) -> tuple:
    """Traces `model` in serving mode into a concrete function of plain tensors (no `tf_embed_ops` op).

    Args:
      model: as `export_for_serving`.
      input_signature: as `export_for_serving`.
      freeze, served, dynamic: as `serving_mode`.

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

    # One context for the trace: each dynamic table is frozen once (quantized / pruned as planned), and kept below.
    with serving_mode(served=served, dynamic=dynamic, freeze=freeze):
        concrete = tf.function(serve, input_signature=signature, autograph=False).get_concrete_function()
        frozen = frozen_tables()
    custom = _custom_ops_in(concrete.graph.as_graph_def())
    if custom:
        raise RuntimeError(f"The serving graph still contains custom ops {custom}; a layer ignored serving_mode.")
    return concrete, dict(zip(names, specs, strict=False)), frozen


def export_for_serving(
    model: Any, filepath: str, input_signature: Any, quantization: Any = None, prune: Any = None
) -> dict:
    """Writes a SavedModel whose `serving_default` signature runs `model` without any `tf_embed_ops` op.

    Composite inputs (RaggedTensorSpec, SparseTensorSpec) become their component tensors in the signature,
    named after their path (e.g. `genres_values`, `genres_row_splits`), since signatures take plain tensors.

    The export holds what the serving function reads (the tables and the dense weights, not optimizer slots),
    and records per-table metadata in `assets.extra/tf_embed_ops_export.json` (``python -m tf_embed_ops
    inspect-export DIR``). It is written under a temporary name and renamed into `filepath`.

    Smaller servables (docs/serving.md, "Quantized and pruned exports"): `quantization` stores tables encoded
    (`tf_embed_ops.serving.quantization`), decoded after the gather with stock TensorFlow ops, so a lookup equals a
    lookup in the decoded table; `prune` drops rows at export (`te.serving.Prune`), and a dropped id reads zeros.
    The training tables are not changed.

    A tiered table (`storage=te.Tiered`, which can be larger than memory) is never held whole in memory: its
    servable variable is saved without a value, then its rows are read from the tier chunk by chunk
    (`te.Tiered(chunk_bytes=...)`), encoded, and written as slices of that variable into the SavedModel's checkpoint
    (`tf_embed_ops.serving.streamed`); the SavedModel stays a plain one. Quantization applies chunk by chunk (it is
    row-wise); `prune` is refused for tiered tables.

    Args:
      model: a Keras model (or any callable Trackable) that uses `tf_embed_ops.keras.TPUEmbedding` layers.
      filepath: the SavedModel directory.
      input_signature: the nest of specs of `model`'s single positional input.
      quantization: None, one mode for every table ("int8", "int4", "float16", "bfloat16"), or
        {table name: mode or None}.
      prune: None or {table name: te.serving.Prune}.

    Returns:
      {signature argument name: component spec}, the signature's inputs.

    Raises:
      ValueError: an unknown mode or table name, a `prune` criterion the table's kind does not track, `prune` of a
        tiered table, rows a mode cannot encode (non-finite, beyond float16's range), naming the table and the
        value; nothing is written (`filepath` is unchanged).
      RuntimeError: if a `TfEmbed>` op would end up in the serving graph.
    """
    from tf_embed_ops.serving import metadata as metadata_lib  # pylint: disable=import-outside-toplevel
    from tf_embed_ops.serving import streamed as streamed_lib  # pylint: disable=import-outside-toplevel
    from tf_embed_ops.serving.tables import ServedTable, table_metadata  # pylint: disable=import-outside-toplevel

    tables = _embedding_tables(model)
    plan = _plan(tables, quantization, prune)
    # Static tables the export replaces by their serving form (encoded / pruned copies: the training variable is
    # only read). Every check above and every encoder error happens before anything is written.
    served, metadata, dynamic, streamed = {}, {}, {}, []
    for name, (kind, _config, obj) in tables.items():
        mode, criteria = plan.get(name, (None, None))
        if kind == "ambiguous":  # no option names it (refused above): exported as trained, not in the metadata
            continue
        if kind == "dynamic":
            dynamic[name] = (mode, criteria)
            continue
        if kind == "tiered":
            # Its serving form has no value yet: the rows are streamed into the SavedModel after it is saved.
            table = streamed_lib.StreamedTable(obj, mode)
            served[id(obj)] = (obj, table)
            streamed.append(table)
            metadata[name] = table.metadata
            continue
        backing = getattr(obj, "value", obj)
        if name in plan:
            with tf.init_scope():
                table = ServedTable(name, backing.numpy(), mode, criteria, tf.as_dtype(backing.dtype).name)
            served[id(backing)] = (backing, table)
            metadata[name] = table.metadata
        else:
            rows, dim = (int(d) for d in backing.shape)
            nbytes = rows * dim * tf.as_dtype(backing.dtype).size
            metadata[name] = table_metadata("static", dim, rows, rows, None, None, nbytes, backing.dtype.name)

    concrete, inputs, frozen = trace_serving_function(model, input_signature, served=served, dynamic=dynamic)
    for table in frozen:
        metadata[table.table_name] = table.metadata
    # Track the variables the serving function reads, not the Keras model: saving a Keras model object makes Keras
    # add its own default signature, traced from the model's Input specs (which breaks on ragged/sparse inputs);
    # and the training-only state (optimizer slots, the replaced float32 tables) has no place in a servable.
    root = tf.Module()
    root.serving_variables = list(concrete.variables)
    streamed_ids = {id(t) for t in streamed}
    root.served_tables = [table for _, table in served.values() if id(table) not in streamed_ids]
    root.dynamic_tables = frozen  # frozen dynamic tables: StaticHashTable + dense rows, plain TensorFlow state
    setattr(root, streamed_lib.ROOT_ATTRIBUTE, streamed)  # tiered: rows streamed below
    streamed_lib.write_atomically(
        filepath,
        lambda tmp: (
            tf.saved_model.save(root, tmp, signatures={"serving_default": concrete}),
            streamed_lib.write_rows(tmp, root),
            metadata_lib.write_export_metadata(tmp, metadata),
        ),
    )
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
