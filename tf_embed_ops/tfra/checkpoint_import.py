"""`python -m tf_embed_ops import-tfra SRC DST`: a TFRA 0.8 checkpoint as one `tf_embed_ops.tfra` model restores.

A `tf.train.Checkpoint(model=..., optimizer=...)` written by TFRA holds each `de.Variable` as hash-table shards
(`<path>/tables_of_<name>/<shard>/.ATTRIBUTES/table-keys|table-values`), the `DynamicEmbeddingOptimizer`'s slots as
more such tables under the optimizer (`<name>/<scope>/<slot>`), the trainable wrappers' shadow variables, and the
dense weights and their Keras 2 optimizer slots. The converter writes, for the same object paths:

- each `de.Variable` at `<path>` as the `DynamicTable` `<path>/table` of `tf_embed_ops.tfra.Variable`: its keys
  (int64; int32 widened; strings as their fingerprints, `te.dynamic.string_keys`) sorted, its rows and its slots
  side by side in the table optimizer's order (Adam `m, v`; Adagrad `accumulator`; Ftrl `accumulator, linear`),
  every float copied bit for bit; count 1, last step 0, step 0. A key without a slot row (upserted, never
  trained) gets the slot's start (0; Adagrad's accumulator `initial_accumulator_value`, by default Keras' epsilon
  1e-7, where `tf_embed_ops.tfra` starts it: TFRA starts it at 0 and adds epsilon in the update);
- every other variable unchanged, with two Keras 2 -> Keras 3 differences bridged: a `kernel` / `embeddings`
  weight is also written as `_kernel` / `_embeddings` (Keras 3's Dense, EinsumDense and Embedding attribute names),
  and a Keras optimizer's `_variables/<k>` becomes `_variables/<k + 1>` (Keras 3 keeps the learning rate at 1), with
  the slots of TFRA's shadow variables (shape `[0, dim]`) replaced by the scalar slots of the layers' triggers;
- nothing of the shadow variables; the triggers of `tf_embed_ops.tfra` (`<path>/trigger`, the layer's `trigger`)
  as 0.

Everything is read and checked before anything is written, and the checkpoint is written under a temporary prefix
and renamed into place. `convert(src, dst)` returns what was converted.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.dynamic import table as table_lib

__all__ = ["ConvertedTable", "convert", "main"]

_TABLE = re.compile(
    r"^(?P<owner>.+)/tables_of_(?P<name>[^/]+)/(?P<shard>\d+)/\.ATTRIBUTES/table-(?P<part>keys|values)$"
)
_VARIABLE = re.compile(r"^(?P<path>.+)/\.ATTRIBUTES/VARIABLE_VALUE$")
# Slot names of the Keras optimizers, in the table optimizer's slot order; the families' fused optimizers.
_FAMILIES = {
    (): ("SGD", tf.tpu.experimental.embedding.SGD),
    ("m", "v"): ("Adam", tf.tpu.experimental.embedding.Adam),
    ("accumulator",): ("Adagrad", tf.tpu.experimental.embedding.Adagrad),
    ("accumulator", "linear"): ("Ftrl", tf.tpu.experimental.embedding.FTRL),
}
_KERAS3_NAMES = {"kernel": "_kernel", "embeddings": "_embeddings"}


@dataclasses.dataclass
class ConvertedTable:
    """One de.Variable: where it was, its name, rows, slot names and the keys dropped from its slot tables."""

    path: str
    name: str
    rows: int
    dim: int
    key_dtype: str
    slots: tuple[str, ...]
    optimizer: str
    slot_rows_without_key: int


def _unescape(component: str) -> str:
    out, i = [], 0
    while i < len(component):
        if component[i] == "." and i + 1 < len(component):
            out.append("/" if component[i + 1] == "S" else component[i + 1])
            i += 2
        else:
            out.append(component[i])
            i += 1
    return "".join(out)


def _read_tables(reader: Any, names: list[str]) -> dict[tuple[str, str], dict[str, list]]:
    """{(owner path, table name): {"keys": [per shard], "values": [per shard]}} of every TFRA table."""
    tables: dict[tuple[str, str], dict[str, dict[int, np.ndarray]]] = {}
    for key in names:
        match = _TABLE.match(key)
        if match is None:
            continue
        entry = tables.setdefault((match["owner"], _unescape(match["name"])), {"keys": {}, "values": {}})
        entry[match["part"]][int(match["shard"])] = reader.get_tensor(key)
    out = {}
    for ident, parts in tables.items():
        if sorted(parts["keys"]) != sorted(parts["values"]):
            raise ValueError(f"import-tfra: table {ident[1]!r} at {ident[0]!r}: shards with keys but no values")
        shards = sorted(parts["keys"])
        out[ident] = {"keys": [parts["keys"][s] for s in shards], "values": [parts["values"][s] for s in shards]}
    return out


def _int64_keys(keys: np.ndarray, where: str) -> np.ndarray:
    if keys.dtype.kind in ("S", "O", "U"):
        fingerprints = dynamic_ops.string_keys_to_int64(tf.constant(keys.astype(bytes))).numpy()
        if len(np.unique(fingerprints)) != len(fingerprints):
            raise ValueError(f"import-tfra: {where}: two string keys share a 64-bit fingerprint")
        return fingerprints
    if keys.dtype.kind not in ("i", "u"):
        raise ValueError(f"import-tfra: {where}: keys of dtype {keys.dtype} (int32, int64 or string expected)")
    return keys.astype(np.int64)


def _slot_table_of(slot_name: str, params: list[str]) -> tuple[str, str] | None:
    """(params name, slot) of a slot table's name `<params>/<scope...>/<slot>`, or None."""
    owners = [p for p in params if slot_name.startswith(p + "/")]
    if not owners:
        return None
    return max(owners, key=len), slot_name.rsplit("/", 1)[-1]


def _plan(reader: Any, names: list[str], initial_accumulator_value: float) -> tuple[list, list, set]:
    """Reads and checks everything: (tables to write, variables to write, keys consumed)."""
    tables = _read_tables(reader, names)
    params = {ident[1]: ident for ident in tables if "/" not in ident[1]}
    slot_tables: dict[str, dict[str, Any]] = {name: {} for name in params}
    for ident, parts in tables.items():
        if ident[1] in params:
            continue
        owner = _slot_table_of(ident[1], list(params))
        if owner is None:
            raise ValueError(f"import-tfra: table {ident[1]!r} at {ident[0]!r} is neither a de.Variable nor its slot")
        slot_tables[owner[0]][owner[1]] = parts
    planned, converted = [], []
    for name, ident in sorted(params.items()):
        parts = tables[ident]
        where = f"de.Variable {name!r} ({ident[0]})"
        raw_keys = np.concatenate(parts["keys"])
        values = np.concatenate(parts["values"]).astype(np.float32, copy=False)
        if values.ndim != 2 or values.shape[0] != raw_keys.shape[0]:
            raise ValueError(f"import-tfra: {where}: {raw_keys.shape[0]} keys but values of shape {values.shape}")
        keys = _int64_keys(raw_keys, where)
        if len(np.unique(keys)) != len(keys):
            raise ValueError(f"import-tfra: {where}: a key appears twice")
        order = np.argsort(keys, kind="stable")
        keys, values, raw_sorted = keys[order], values[order], raw_keys[order]
        dim = values.shape[1]
        slot_names = tuple(s for s in ("m", "v", "accumulator", "linear") if s in slot_tables[name])
        unknown = sorted(set(slot_tables[name]) - set(slot_names))
        if unknown or slot_names not in _FAMILIES:
            raise ValueError(
                f"import-tfra: {where}: optimizer slots {sorted(slot_tables[name])} are not those of SGD, Adagrad, "
                "Adam or Ftrl (the optimizers tf_embed_ops.tfra trains tables with)"
            )
        family, tpu_class = _FAMILIES[slot_names]
        slot_columns, dropped = [], 0
        index = {k: i for i, k in enumerate(keys.tolist())}
        for slot in slot_names:
            slot_parts = slot_tables[name][slot]
            s_keys = _int64_keys(np.concatenate(slot_parts["keys"]), f"{where} slot {slot!r}")
            s_values = np.concatenate(slot_parts["values"]).astype(np.float32, copy=False)
            if s_values.shape != (s_keys.shape[0], dim):
                raise ValueError(f"import-tfra: {where}: slot {slot!r} of shape {s_values.shape}, rows of dim {dim}")
            default = initial_accumulator_value if slot == "accumulator" and family == "Adagrad" else 0.0
            column = np.full([keys.shape[0], dim], default, np.float32)
            for k, row in zip(s_keys.tolist(), s_values, strict=True):
                i = index.get(k)
                if i is None:
                    dropped += 1
                else:
                    column[i] = row
            slot_columns.append(column)
        slots = np.concatenate(slot_columns, 1) if slot_columns else np.zeros([keys.shape[0], 0], np.float32)
        key_dtype = tf.string if raw_sorted.dtype.kind in ("S", "O", "U") else tf.int64
        planned.append((f"{ident[0]}/table", name, dim, key_dtype, tpu_class, keys, values, slots))
        converted.append(
            ConvertedTable(ident[0], name, int(keys.shape[0]), dim, key_dtype.name, slot_names, family, dropped)
        )
    consumed = {k for k in names if _TABLE.match(k)}
    return planned, converted, consumed


def _variables(reader: Any, names: list[str], consumed: set, shapes: dict, layers: set) -> list[tuple[str, np.ndarray]]:
    """(object path, value) of every variable to write, Keras 2 -> Keras 3 differences bridged; `layers`: the
    paths of the Keras layers that hold a de.Variable as `params`."""
    optimizers = {k.rsplit("/_iterations/", 1)[0] for k in names if "/_iterations/.ATTRIBUTES/" in k}
    out = []
    for key in names:
        match = _VARIABLE.match(key)
        if key in consumed or match is None:
            continue
        path = match["path"]
        parts = path.split("/")
        if any(path.startswith(f"{layer}/shadow") for layer in layers):
            continue  # TFRA's trainable wrappers (a layer's `shadow`, `shadow_impl`): the rows are in the table
        value = reader.get_tensor(key)
        if len(parts) >= 3 and parts[-2] == "_variables" and "/".join(parts[:-2]) in optimizers:
            index = int(parts[-1])
            shape = shapes[key]
            if len(shape) == 2 and shape[0] == 0:
                value = np.zeros([], value.dtype)  # a shadow variable's slot -> the trigger's scalar slot
            out.append(("/".join([*parts[:-1], str(index + 1)]), value))
            continue
        out.append((path, value))
        if parts[-1] in _KERAS3_NAMES:
            out.append(("/".join([*parts[:-1], _KERAS3_NAMES[parts[-1]]]), value))
    return out


def _node(roots: dict, components: list[str]) -> Any:
    parent = roots.setdefault(components[0], _tf_compat.AutoTrackable())
    for component in components[1:]:
        child = getattr(parent, component, None)
        if child is None:
            child = _tf_compat.AutoTrackable()
            setattr(parent, component, child)
        parent = child
    return parent


def convert(src: str, dst: str, initial_accumulator_value: float = 1e-7) -> list[ConvertedTable]:
    """Converts the TFRA checkpoint `src` into the checkpoint `dst` (see the module docstring).

    Args:
      src: the prefix TFRA's `tf.train.Checkpoint.write` / `save` wrote (or a directory with a `checkpoint` file).
      dst: the prefix to write (its directory is created).
      initial_accumulator_value: Adagrad's accumulator of a key that has no slot row (default 1e-7, see above).

    Returns:
      One `ConvertedTable` per de.Variable.

    Raises:
      ValueError: a checkpoint without TFRA tables, an optimizer other than SGD / Adagrad / Adam / Ftrl, keys and
        values that disagree, a repeated key; nothing is written then.
    """
    if os.path.isdir(src):
        src = tf.train.latest_checkpoint(src) or src
    reader = tf.train.load_checkpoint(src)
    shapes = reader.get_variable_to_shape_map()
    names = sorted(k for k in shapes if k != "_CHECKPOINTABLE_OBJECT_GRAPH")
    planned, converted, consumed = _plan(reader, names, float(initial_accumulator_value))
    if not planned:
        raise ValueError(f"import-tfra: {src} holds no TFRA de.Variable (no '.../tables_of_<name>/...' entries)")
    layers = {path.rsplit("/", 2)[0] for path, *_ in planned if path.endswith("/params/table")}
    variables = _variables(reader, names, consumed, shapes, layers)
    for path, *_ in planned:
        # The triggers (`Variable.trigger`, and the Keras layer's `trigger` beside its `params`): always 0.
        owner = path.rsplit("/", 1)[0]
        triggers = [owner, owner.rsplit("/", 1)[0]] if owner.endswith("/params") else [owner]
        variables += [(f"{t}/trigger", np.zeros([], np.float32)) for t in triggers]
    roots: dict[str, Any] = {}
    keep = []  # the objects must live until the write
    for path, value in variables:
        components = [_unescape(c) for c in path.split("/")]
        parent = _node(roots, components[:-1]) if len(components) > 1 else None
        variable = tf.Variable(value, name=components[-1].replace("/", "_"))
        if parent is None:
            roots[components[0]] = variable
        else:
            setattr(parent, components[-1], variable)
        keep.append(variable)
    for path, name, dim, key_dtype, tpu_class, keys, values, slots in planned:
        config = dynamic_config.DynamicTableConfig(name, dim, optimizer=tpu_class(0.1), key_dtype=key_dtype)
        table = table_lib.DynamicTable(config)
        table.import_(keys, values, slots=slots)
        components = [_unescape(c) for c in path.split("/")]
        setattr(_node(roots, components[:-1]), components[-1], table)
        keep.append(table)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".import-tfra-", dir=os.path.dirname(os.path.abspath(dst)))
    try:
        checkpoint = tf.train.Checkpoint(**roots)
        _ = checkpoint.save_counter  # created, so that the checkpoint has one as `Checkpoint.save` writes
        written = checkpoint.write(os.path.join(staging, "ckpt"))
        # The index last: a reader that finds it finds the data too.
        for file in sorted(os.listdir(staging), key=lambda f: f.endswith(".index")):
            os.replace(os.path.join(staging, file), os.path.abspath(dst) + file[len(os.path.basename(written)) :])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return converted


def main(src: str, dst: str, initial_accumulator_value: float = 1e-7) -> int:
    """The `import-tfra` command: converts, prints one line per table; 1 and the reason on stderr on failure."""
    import sys  # pylint: disable=import-outside-toplevel

    try:
        tables = convert(src, dst, initial_accumulator_value)
    except (ValueError, OSError, tf.errors.OpError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for t in tables:
        print(
            f"{t.path}: de.Variable {t.name!r}: {t.rows} rows of dim {t.dim} ({t.key_dtype} keys), "
            f"{t.optimizer} slots {list(t.slots)}"
            + (f", {t.slot_rows_without_key} slot rows without a key dropped" if t.slot_rows_without_key else "")
        )
    print(f"wrote {dst} (restore it with tf.train.Checkpoint(model=..., optimizer=...).restore)")
    return 0
