"""The checks of a delta's table arrays against the model, before anything is restored: a `CheckpointError` naming
the file, the table, the array and what is wrong."""

from __future__ import annotations

from typing import Any

import numpy as np

from tf_embed_ops.checkpoint._format import CheckpointError
from tf_embed_ops.checkpoint.table_states import DYNAMIC, PENDING, bloom_bytes, policy_names, stored_dtype
from tf_embed_ops.dynamic import tiered_checkpoint

__all__ = ["check_dynamic", "check_static"]


def check_static(path: str, name: str, state: Any, info: dict, arrays: dict) -> None:
    rows = arrays.get(f"static/{name}/rows")
    if rows is None or rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise CheckpointError(f"{path}: table {name!r}: rows must be an integer vector")
    num_rows = state.describe()["rows"]
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise CheckpointError(f"{path}: table {name!r} has rows outside [0, {num_rows})")
    desc = state.describe()["variables"]
    dtypes = info.get("dtypes")
    if not isinstance(dtypes, dict) or set(dtypes) != set(desc):
        raise CheckpointError(f"{path}: table {name!r} holds variables {dtypes}, the model's are {sorted(desc)}")
    for var_name, (width, dtype_name) in desc.items():
        value = arrays.get(f"static/{name}/{var_name}")
        if value is None or value.shape != (rows.size, width):
            raise CheckpointError(f"{path}: table {name!r} variable {var_name!r} has the wrong shape")
        if dtypes[var_name] != dtype_name or value.dtype != stored_dtype(dtype_name):
            raise CheckpointError(
                f"{path}: table {name!r} variable {var_name!r} is {dtypes[var_name]} ({value.dtype} stored), the "
                f"model's is {dtype_name}"
            )


def check_dynamic(path: str, name: str, state: Any, arrays: dict) -> None:
    shard = state.shards[0]
    dim, width = int(shard.dim), int(sum(shard.slot_widths))
    where = f"{path}: table {name!r}:"
    d = {k: arrays.get(f"dynamic/{name}/{k}") for k in (*DYNAMIC, *PENDING, "evicted", "step")}
    missing = [k for k, v in d.items() if v is None]
    if missing:
        raise CheckpointError(f"{where} lacks {missing}")
    m = d["keys"].shape[0] if d["keys"].ndim == 1 else -1
    p = d["pending_keys"].shape[0] if d["pending_keys"].ndim == 1 else -1
    want = {
        "keys": (m,),
        "weights": (m, dim),
        "slots": (m, width),
        "counts": (m,),
        "last_steps": (m,),
        **{k: (p,) for k in PENDING},
    }
    for k, shape in want.items():
        if m < 0 or p < 0 or d[k].shape != shape:
            raise CheckpointError(
                f"{where} {k} has shape {list(d[k].shape)}, expected {list(shape)}: the arrays do not fit the "
                f"table's dim {dim} and slot width {width} (keys [n], rows [n, {dim}], slots [n, {width}], "
                "admission counters [p])"
            )
    for k in (*DYNAMIC, *PENDING, "evicted", "step"):
        want_dtype = np.float32 if k in ("weights", "slots") else np.int64
        if d[k].dtype != want_dtype:
            raise CheckpointError(f"{where} {k} is {d[k].dtype}, must be {np.dtype(want_dtype).name}")
    if d["evicted"].ndim != 1 or d["step"].ndim != 1 or d["step"].size < 1 or d["step"].min() < 0:
        raise CheckpointError(
            f"{where} evicted keys {list(d['evicted'].shape)} and steps {list(d['step'].shape)} must be vectors "
            "(the steps >= 0, one per shard)"
        )
    names = policy_names(state.table)
    policy_prefix = f"dynamic/{name}/policy/"
    policy = {k[len(policy_prefix) :]: v for k, v in arrays.items() if k.startswith(policy_prefix)}
    if set(policy) != set(names):
        raise CheckpointError(f"{where} holds lifecycle-policy state {sorted(policy)}, the table's is {list(names)}")
    if names:
        try:
            tiered_checkpoint.check_policy_state(policy, names, bloom_bytes(state.table), where)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
