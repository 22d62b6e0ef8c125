"""How an incremental checkpoint holds each table: its description and delta-row restore (`StaticState`, and
`TieredState` for a static tiered table; a dynamic table is merged by key, `merge_dynamic`), the lifecycle-policy
state saved whole, and the storage of 16-bit values in .npz files."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

__all__ = [
    "DYNAMIC",
    "PENDING",
    "StaticState",
    "TieredState",
    "bloom_bytes",
    "from_storage",
    "is_tiered_dynamic",
    "merge_dynamic",
    "policy_names",
    "policy_state",
    "storage",
    "stored_dtype",
]


def storage(array: np.ndarray) -> tuple[np.ndarray, str]:
    """numpy cannot store bfloat16 in .npz portably: 16-bit floats are written as their uint16 bits."""
    dtype = tf.as_dtype(array.dtype)
    if dtype in (tf.bfloat16, tf.float16):
        return array.view(np.uint16), dtype.name
    return array, dtype.name


def stored_dtype(dtype_name: str) -> np.dtype:
    """The numpy dtype a delta stores a variable of `dtype_name` in (`storage`)."""
    if dtype_name in ("bfloat16", "float16"):
        return np.dtype(np.uint16)
    return np.dtype(tf.as_dtype(dtype_name).as_numpy_dtype)


def from_storage(array: np.ndarray, dtype_name: str) -> np.ndarray:
    if dtype_name in ("bfloat16", "float16"):
        return array.view(tf.as_dtype(dtype_name).as_numpy_dtype)
    return array


DYNAMIC = ("keys", "weights", "slots", "counts", "last_steps")
PENDING = ("pending_keys", "pending_counts", "pending_last_steps")


def policy_names(table: Any) -> tuple:
    from tf_embed_ops.dynamic import table as table_lib  # pylint: disable=import-outside-toplevel

    return tuple(table_lib.policy_tensor_names(table.config))


def bloom_bytes(table: Any) -> int:
    shards = getattr(table, "shards", None) or [table]
    return int(shards[0].bloom_bytes)


def merge_dynamic(name: str, content: dict | None, deltas: list, table: Any = None) -> dict:
    """A dynamic table's checkpoint tensors after `deltas` (later deltas win key by key, evicted keys go), starting
    from `content` (the full checkpoint's, sorted by key) or, without it, from `table`'s export."""
    if content is None:
        content = {k: v.numpy() for k, v in table.export().items()}
    content = dict(content)
    step = None
    for header, arrays in deltas:
        d = {k: arrays[f"dynamic/{name}/{k}"] for k in DYNAMIC + PENDING}
        if header["tables"][name]["full"]:
            content = dict(d)
        else:
            drop = np.isin(content["keys"], np.concatenate([arrays[f"dynamic/{name}/evicted"], d["keys"]]))
            for k in DYNAMIC:
                content[k] = np.concatenate([content[k][~drop], d[k]])
            order = np.argsort(content["keys"], kind="stable")
            for k in DYNAMIC:
                content[k] = content[k][order]
            for k in PENDING:
                content[k] = d[k]
        step = int(arrays[f"dynamic/{name}/step"].max())
    content["step"] = np.int64(step)
    _, arrays = deltas[-1]
    prefix = f"dynamic/{name}/policy/"
    content.update({k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)})
    return content


def policy_state(table: Any) -> dict:
    """A dynamic table's lifecycle-policy state (Bloom counters, decayed counts), saved whole in each delta:
    the policies change it on every lookup, not per row.  Read through the table's checkpoint tensors, so only
    tables with such a policy pay for it."""
    from tf_embed_ops.dynamic import table as table_lib

    names = table_lib.policy_tensor_names(table.config)
    if not names:
        return {}
    if getattr(table, "tiered", None) is not None:  # its checkpoint tensors would hold every row: the policies' only
        return {k: v.numpy() for k, v in table.export_policy_state().items()}
    tensors = table.checkpoint_tensors()
    return {k: tensors[k].numpy() for k in names}


def is_tiered_dynamic(obj: Any) -> bool:
    from tf_embed_ops.dynamic import table as table_lib  # pylint: disable=import-outside-toplevel

    return isinstance(obj, table_lib.DynamicTable) and obj.tiered is not None


class StaticState:
    """One static table (all its shards): its parameters and slots as global-row arrays."""

    def __init__(self, name: str, table: Any):
        self.name = name
        self.table = table  # tracking._StaticTable

    def describe(self) -> dict:
        t = self.table
        variables = {"parameters": t.parameters, **t.slots}
        return {
            "kind": "static",
            "rows": t.num_rows,
            "variables": {k: [int(v[0].shape[1]), v[0].dtype.name] for k, v in variables.items()},
        }

    def restore_rows(self, rows: np.ndarray, values: dict) -> None:
        t = self.table
        for var_name, shards in {"parameters": t.parameters, **t.slots}.items():
            value = values[var_name]
            shard = np.searchsorted(t.offsets, rows, side="right") - 1
            for p, v in enumerate(shards):
                mine = np.nonzero(shard == p)[0]
                if mine.size:
                    with tf.device(v.device):
                        v.scatter_update(
                            tf.IndexedSlices(tf.constant(value[mine], v.dtype), tf.constant(rows[mine] - t.offsets[p]))
                        )


class TieredState(StaticState):
    """A static tiered table: described like the same table in memory (a chain moves between the two kinds through
    its full checkpoint), its delta rows written into the tier one run of consecutive rows at a time."""

    def describe(self) -> dict:
        table = self.table.table  # te.tiered.TieredTable
        widths = [table.dim, *table.slot_widths]
        names = ["parameters", *table.slot_names]
        return {
            "kind": "static",
            "rows": table.num_rows,
            "variables": {n: [int(w), d.name] for n, w, d in zip(names, widths, table.dtypes, strict=True)},
        }

    def restore_rows(self, rows: np.ndarray, values: dict) -> None:
        table = self.table.table
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        values = {k: np.asarray(v)[order].astype(np.float32) for k, v in values.items()}  # 16-bit: exact
        starts = np.concatenate([[0], np.nonzero(np.diff(rows) != 1)[0] + 1, [rows.size]])
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            table.write_rows(int(rows[a]), values["parameters"][a:b], [values[slot][a:b] for slot in table.slot_names])
