"""A table of numbered rows (the in-memory kind; the tiered kind builds on it) as a part of an incremental checkpoint
chain (`protocol.ChainState`, `tf_embed_ops.checkpoint`).

A delta holds the rows the tracker reports changed, every variable of the table (its parameters and each slot) as
`static/<table>/<variable>` beside `static/<table>/rows`, 16-bit values as their bits (`formats.delta_arrays`); at
restore the deltas' rows are merged (a later delta's row wins) and written over the full checkpoint's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.formats import delta_arrays

__all__ = ["RowChain"]


class RowChain:
    """One in-memory table (all its shards) in a chain: its parameters and slots as global-row arrays.

    Args:
      name: the table's name.
      view: the tracker's view of it (`tracking.Tracker.table`): `parameters` and `slots` (shard variables),
        `offsets`, `num_rows`, `read(rows)`.
    """

    delta_kind = "static"
    streamed = False
    table = None  # the rows are the embedding's variables, no table object of their own

    def __init__(self, name: str, view: Any):
        self.name = name
        self.view = view

    def variables(self) -> list:
        """The variables a delta holds as rows (a chain saves every other variable whole)."""
        return [v for shards in [self.view.parameters, *self.view.slots.values()] for v in shards]

    def dense_variables(self) -> dict:
        """`{path: variable}` saved whole with each delta beside the rows (none here)."""
        return {}

    def describe(self) -> dict:
        """The table's layout in the chain's model fingerprint."""
        view = self.view
        variables = {"parameters": view.parameters, **view.slots}
        return {
            "kind": "static",
            "rows": view.num_rows,
            "variables": {k: [int(v[0].shape[1]), v[0].dtype.name] for k, v in variables.items()},
        }

    def whole(self, changes: Any) -> bool:
        """The table changed whole: `full`, or every row listed (a delta of them would be the table)."""
        return bool(changes.full) or changes.rows.size >= self.view.num_rows

    def delta(self, changes: Any) -> tuple[dict, dict]:
        """`(arrays, header entry)` of the rows `changes` lists."""
        values = self.view.read(changes.rows)
        arrays = {f"static/{self.name}/rows": changes.rows}
        dtypes = {}
        for var_name, value in values.items():
            arrays[f"static/{self.name}/{var_name}"], dtypes[var_name] = delta_arrays.storage(value)
        info = {"kind": "static", "full": bool(changes.full), "dtypes": dtypes, "rows": int(changes.rows.size)}
        return arrays, info

    def check_delta(self, path: str, info: dict, arrays: dict) -> None:
        """Raises ValueError (naming `path`, the table and the array) unless the delta's rows fit the table."""
        name = self.name
        rows = arrays.get(f"static/{name}/rows")
        if rows is None or rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(f"{path}: table {name!r}: rows must be an integer vector")
        num_rows = self.describe()["rows"]
        if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
            raise ValueError(f"{path}: table {name!r} has rows outside [0, {num_rows})")
        desc = self.describe()["variables"]
        dtypes = info.get("dtypes")
        if not isinstance(dtypes, dict) or set(dtypes) != set(desc):
            raise ValueError(f"{path}: table {name!r} holds variables {dtypes}, the model's are {sorted(desc)}")
        for var_name, (width, dtype_name) in desc.items():
            value = arrays.get(f"static/{name}/{var_name}")
            if value is None or value.shape != (rows.size, width):
                raise ValueError(f"{path}: table {name!r} variable {var_name!r} has the wrong shape")
            if dtypes[var_name] != dtype_name or value.dtype != delta_arrays.stored_dtype(dtype_name):
                raise ValueError(
                    f"{path}: table {name!r} variable {var_name!r} is {dtypes[var_name]} ({value.dtype} stored), "
                    f"the model's is {dtype_name}"
                )

    def plan_restore(self, deltas: list, prefix: str, reader: Any, object_name: str | None) -> Any:
        """The deltas' rows merged (a later delta's row wins); returns what writes them after the full checkpoint's
        read (`apply()`). Checks nothing more: `check_delta` checked every delta."""
        del prefix, reader, object_name  # the full checkpoint is read by TensorFlow
        name, rows, values = self.name, None, {}
        for header, arrays in deltas:
            info = header["tables"][name]
            r = arrays[f"static/{name}/rows"]
            v = {k: delta_arrays.from_storage(arrays[f"static/{name}/{k}"], d) for k, d in info["dtypes"].items()}
            if rows is None:
                rows, values = r, v
            else:
                keep = ~np.isin(rows, r)
                rows = np.concatenate([rows[keep], r])
                values = {k: np.concatenate([values[k][keep], v[k]]) for k in values}
        return _RowsWrite(self, rows, values)

    def restore_rows(self, rows: np.ndarray, values: dict) -> None:
        """Writes `values` (`{variable: [n, width]}`) at global `rows`, each into its shard."""
        view = self.view
        for var_name, shards in {"parameters": view.parameters, **view.slots}.items():
            value = values[var_name]
            shard = np.searchsorted(view.offsets, rows, side="right") - 1
            for p, v in enumerate(shards):
                mine = np.nonzero(shard == p)[0]
                if mine.size:
                    with tf.device(v.device):
                        local = tf.constant(rows[mine] - view.offsets[p])
                        v.scatter_update(tf.IndexedSlices(tf.constant(value[mine], v.dtype), local))


class _RowsWrite:
    """`RowChain.plan_restore`'s answer: the merged rows, written by `apply`."""

    def __init__(self, chain: RowChain, rows: np.ndarray | None, values: dict):
        self._chain, self._rows, self._values = chain, rows, values

    def apply(self) -> None:
        if self._rows is not None and self._rows.size:
            self._chain.restore_rows(self._rows, self._values)
