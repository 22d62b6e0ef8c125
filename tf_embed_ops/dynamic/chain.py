"""A dynamic table (in memory or tiered, sharded or not) as a part of an incremental checkpoint chain
(`backends.protocol.ChainState`, `tf_embed_ops.checkpoint`).

A delta holds the changed rows' contents as the tracker reads them (`dynamic/<table>/<tensor>`: keys, rows, slots,
counts, last steps, the whole admission table), the keys evicted since, every shard's step and the lifecycle
policies' state (saved whole: the policies change it on every lookup, not per row). A restore merges the full
checkpoint's content with the deltas' (later deltas win key by key; evicted keys go) and imports the result whole,
checked against the table first; a tiered table's full checkpoint, streamed, is merged a chunk at a time
(`tiered_chain_restore`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic import table_state, tiered_chain_restore, tiered_checkpoint

__all__ = ["DYNAMIC", "PENDING", "DynamicChain", "merge_dynamic"]

DYNAMIC = ("keys", "weights", "slots", "counts", "last_steps")
PENDING = ("pending_keys", "pending_counts", "pending_last_steps")


def _bloom_bytes(table: Any) -> int:
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


class DynamicChain:
    """One dynamic table in a chain.

    Args:
      name: the table's name.
      view: the tracker's view of it (`tracking.Tracker.table`): `table` (the `DynamicTable` or
        `ShardedDynamicTable`), `shards`, `tiered`.
    """

    delta_kind = "dynamic"

    def __init__(self, name: str, view: Any):
        self.name = name
        self.table = view.table
        self.shards = list(view.shards)
        # A tiered table's full checkpoint streams it, and a delta of it changed whole would hold every row.
        self.streamed = bool(view.tiered)

    def variables(self) -> list:
        return []  # the rows live in the table's resource

    def dense_variables(self) -> dict:
        return {}  # the steps are in each delta's table arrays

    def describe(self) -> dict:
        shard = self.shards[0]
        return {"kind": "dynamic", "dim": shard.dim, "slot_widths": list(shard.slot_widths)}

    def whole(self, changes: Any) -> bool:
        return bool(changes.full)

    def policy_state(self) -> dict:
        """The lifecycle policies' state (Bloom counters, decayed counts), saved whole in each delta. Read through
        the table's checkpoint tensors, so only tables with such a policy pay for it."""
        table = self.table
        names = table_state.policy_tensor_names(table.config)
        if not names:
            return {}
        if getattr(table, "tiered", None) is not None:  # its checkpoint tensors would hold every row
            return {k: v.numpy() for k, v in table.export_policy_state().items()}
        tensors = table.checkpoint_tensors()
        return {k: tensors[k].numpy() for k in names}

    def delta(self, changes: Any) -> tuple[dict, dict]:
        """`(arrays, header entry)` of the changed rows' contents, the evicted keys, the steps and policies."""
        name = self.name
        arrays = {f"dynamic/{name}/{k}": v for k, v in changes.contents.items()}
        arrays[f"dynamic/{name}/evicted"] = changes.evicted
        for k, v in self.policy_state().items():
            arrays[f"dynamic/{name}/policy/{k}"] = v
        arrays[f"dynamic/{name}/step"] = np.asarray([int(s.step.numpy()) for s in self.shards], np.int64)
        return arrays, {"kind": "dynamic", "full": bool(changes.full), "rows": int(changes.rows.size)}

    def check_delta(self, path: str, info: dict, arrays: dict) -> None:
        """Raises ValueError (naming `path`, the table and the array) unless the delta's arrays fit the table."""
        del info  # the arrays say everything
        name, shard = self.name, self.shards[0]
        dim, width = int(shard.dim), int(sum(shard.slot_widths))
        where = f"{path}: table {name!r}:"
        d = {k: arrays.get(f"dynamic/{name}/{k}") for k in (*DYNAMIC, *PENDING, "evicted", "step")}
        missing = [k for k, v in d.items() if v is None]
        if missing:
            raise ValueError(f"{where} lacks {missing}")
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
                raise ValueError(
                    f"{where} {k} has shape {list(d[k].shape)}, expected {list(shape)}: the arrays do not fit the "
                    f"table's dim {dim} and slot width {width} (keys [n], rows [n, {dim}], slots [n, {width}], "
                    "admission counters [p])"
                )
        for k in (*DYNAMIC, *PENDING, "evicted", "step"):
            want_dtype = np.float32 if k in ("weights", "slots") else np.int64
            if d[k].dtype != want_dtype:
                raise ValueError(f"{where} {k} is {d[k].dtype}, must be {np.dtype(want_dtype).name}")
        if d["evicted"].ndim != 1 or d["step"].ndim != 1 or d["step"].size < 1 or d["step"].min() < 0:
            raise ValueError(
                f"{where} evicted keys {list(d['evicted'].shape)} and steps {list(d['step'].shape)} must be vectors "
                "(the steps >= 0, one per shard)"
            )
        names = tuple(table_state.policy_tensor_names(self.table.config))
        policy_prefix = f"dynamic/{name}/policy/"
        policy = {k[len(policy_prefix) :]: v for k, v in arrays.items() if k.startswith(policy_prefix)}
        if set(policy) != set(names):
            raise ValueError(f"{where} holds lifecycle-policy state {sorted(policy)}, the table's is {list(names)}")
        if names:
            tiered_checkpoint.check_policy_state(policy, names, _bloom_bytes(self.table), where)

    def plan_restore(self, deltas: list, prefix: str, reader: Any, object_name: str | None) -> Any:
        """Checks the merge of the full checkpoint at `prefix` (`reader`; the table at `object_name` in it) and
        `deltas` against the table, writing nothing; returns what writes it after the full checkpoint's read
        (`apply()`).

        A tiered table whose full checkpoint is streamed is merged a chunk at a time (`tiered_chain_restore`); one
        saved from the table in memory is merged as in memory (it fit). A checkpoint that holds the table in a form
        of its own (another kind's) is merged from the table once the full checkpoint is read.

        Raises:
          ValueError: the merged content does not fit the table (`max_rows`, dims, admission counters, policies'
            state), naming it.
        """
        table = self.table
        if self.streamed and object_name is not None and tiered_chain_restore.is_streamed(reader, object_name):
            return tiered_chain_restore.TieredDynamicRestore(self.name, table, object_name, prefix, reader, deltas)
        keys = [f"{object_name}/.ATTRIBUTES/{k}" for k in (*DYNAMIC, *PENDING, "step")]
        available = reader.get_variable_to_shape_map()
        if object_name is None or not all(k in available for k in keys):
            return _Import(self, None, deltas)
        content = {k: reader.get_tensor(f"{object_name}/.ATTRIBUTES/{k}") for k in (*DYNAMIC, *PENDING)}
        tensors = merge_dynamic(self.name, content, deltas)
        try:
            table.spec.validate(tensors)
        except ValueError as e:
            raise ValueError(f"{prefix} and its deltas: {e}") from None
        return _Import(self, tensors, deltas)


class _Import:
    """`DynamicChain.plan_restore`'s answer for a table merged whole: imported by `apply` (merged then from the
    table's own export when the checkpoint held it in another form)."""

    def __init__(self, chain: DynamicChain, tensors: dict | None, deltas: list):
        self._chain, self._tensors, self._deltas = chain, tensors, deltas

    def apply(self) -> None:
        chain = self._chain
        tensors = self._tensors or merge_dynamic(chain.name, None, self._deltas, chain.table)
        # The full-checkpoint restore path: resharding by key and capacity growth included.
        chain.table.restore_tensors({k: tf.constant(v) for k, v in tensors.items()})
