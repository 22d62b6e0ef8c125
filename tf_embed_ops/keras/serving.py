"""Serving without the plugin: the embedding lookup as plain TensorFlow ops, and a SavedModel exporter.

`plain_lookup` (`tf_embed_ops._xla.lookup`) computes bitwise what our `EmbeddingActivations` op computes (same
normalisation, combiners, sequence layout, simulated quantization) from gathers and segment sums only, so a model
exported with `export_for_serving` loads in TF Serving or any TensorFlow without `tf_embed_ops` and answers what the
trained layer answers. What an export changes about the tables is held by its own `ExportContext`
(`export_context.py`), attached to the graph it traces: two exports never share it. Dynamic tables are frozen at
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

import re
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, _xla
from tf_embed_ops.keras import layer as layer_lib
from tf_embed_ops.keras.export_context import ExportContext, serving_mode
from tf_embed_ops.serving import metadata as metadata_lib
from tf_embed_ops.serving import quantization as quantization_lib
from tf_embed_ops.serving import streamed as streamed_lib

__all__ = ["ExportContext", "export_for_serving", "plain_lookup", "serving_mode", "trace_serving_function"]


def plain_lookup(feature_input: Any, dense: bool, table: Any, dim: int, combiner: str, quantization: Any = None):
    """One feature's activation from a normalised `FeatureInput`, with plain TensorFlow ops only: bitwise what the
    `EmbeddingActivations` op computes from a table holding the same float32 rows (`tf_embed_ops._xla.lookup`, the
    one plain-TensorFlow lookup, which XLA and every serving form use too).

    Args:
      feature_input: `embedding_ops.FeatureInput` (what `normalize_feature` returns).
      dense: True when the feature came from a dense Tensor (its splits input is then empty).
      table: the [vocabulary_size, dim] table (variable or tensor), or an object with a `gather_rows(ids)` method
        returning float32 rows (a table's serving form: `tf_embed_ops.serving.tables.ServedTable`, a frozen dynamic
        table).
      dim: the table's dimension.
      combiner: "sum", "mean" or "sqrtn".
      quantization: the table's `QuantizationConfig` (simulated quantization), or None.

    Returns:
      A float32 tensor of shape sample_shape + [dim].
    """
    return _xla.lookup(feature_input, dense, table, dim, combiner, quantization)


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
    """{table name: (its table group, its TableConfig, the group's table object)} of every
    `tf_embed_ops.keras.TPUEmbedding` layer (DistributedEmbedding included) inside `model`: what each layer's table
    groups (`backends.protocol.TableGroup`) hand. Two tables of one name: (None, config, None)."""
    if isinstance(model, layer_lib.TPUEmbedding):
        layers = [model]
    else:
        # Every layer at any depth (layers held by custom layers included), as Keras' own weight tracking walks them.
        flat = _tf_compat.flatten_layers(model) or []
        layers = [x for x in flat if isinstance(x, layer_lib.TPUEmbedding)]
    tables: dict = {}
    for layer in layers:
        found = [(g, c, t) for g in layer.embedding.groups for c, t in g.tables.items()]
        for group, config, obj in found:
            if config.name in tables and tables[config.name][2] is not obj:
                # Per-table options are given by name: two tables of one name could not be told apart.
                tables[config.name] = (None, config, None)
            else:
                tables[config.name] = (group, config, obj)
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
    if tables[name][0] is None:
        raise ValueError(
            f"{argument}: the model has two embedding tables named {name!r} (in different layers); give them "
            "different names to quantize or prune them"
        )


def _plan(tables: dict, quantization: Any, prune: Any) -> dict:
    """{table name: (quantization mode, Prune or None)} for the tables an export changes; validates everything."""
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
        tables[name][0].check_prune(name, criteria)  # the criteria the table's kind tracks
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
      freeze, served, dynamic: as `ExportContext`: the context this trace hands the layers (held by this call
        only; two traces never share one).

    Returns:
      (concrete function, {signature argument name: component spec}, the frozen dynamic tables it reads).

    Raises:
      RuntimeError: if a `TfEmbed>` op would end up in the serving graph.
    """
    specs = tf.nest.flatten(input_signature, expand_composites=True)
    used: set = set()
    names = [_arg_name(path, used) for path, _ in _component_paths(input_signature)]
    signature = [tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(specs, names, strict=False)]

    context = ExportContext(served=served, dynamic=dynamic, freeze=freeze)

    def serve(*components):
        inputs = tf.nest.pack_sequence_as(input_signature, list(components), expand_composites=True)
        with context.tracing():  # the layers traced here serve with this export's context, read from the graph
            outputs = model(inputs, training=False)
        if isinstance(outputs, dict):
            return outputs
        return (
            {"output_0": outputs}
            if not isinstance(outputs, (list, tuple))
            else {f"output_{i}": o for i, o in enumerate(outputs)}
        )

    # One context for the trace: each dynamic table is frozen once (quantized / pruned as planned), and kept below.
    concrete = tf.function(serve, input_signature=signature, autograph=False).get_concrete_function()
    frozen = context.frozen_tables()
    custom = _custom_ops_in(concrete.graph.as_graph_def())
    if custom:
        raise RuntimeError(f"The serving graph still contains custom ops {custom}; a layer ignored the export context.")
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
    tables = _embedding_tables(model)
    plan = _plan(tables, quantization, prune)
    # Each table's serving form, as its group gives it (`TableGroup.export_form`: an encoded / pruned copy, rows
    # streamed after the save, or how the trace freezes it). Every check above and every encoder error happens
    # before anything is written.
    served, metadata, dynamic, streamed = {}, {}, {}, []
    for name, (group, config, obj) in tables.items():
        if group is None:  # no option names it (refused above): exported as trained, not in the metadata
            continue
        form = group.export_form(config, obj, *plan.get(name, (None, None)))
        if form.served is not None:
            served[id(obj)] = (obj, form.served)
        if form.streamed:  # no value yet: its rows are streamed into the SavedModel after it is saved
            streamed.append(form.served)
        if form.metadata is not None:
            metadata[name] = form.metadata
        if form.freeze is not None:
            dynamic[name] = form.freeze

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
