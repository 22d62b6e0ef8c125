"""The table kinds of the parameter-server sharded classes (`backends.protocol.TableGroup`s).

`ShardedTPUEmbedding` lists these as its kinds (`_BACKENDS`, and `_IN_MEMORY_GROUP` for the in-memory tables), so
the front end's one lookup and one update (`backends.walk`) run its tables without asking which kind a group is:

- `ShardedStaticGroup`: the in-memory tables, row-sharded over the servers. The embedding's `lookup` and
  `send_gradients` run the per-server ops; this group adds the Keras layers' training lookup and the probe, both
  per server (only a scalar per server crosses the network).
- `ShardedDynamicGroup`: the dynamic tables, sharded by key over the same servers (`dynamic.sharding.shard_of_keys`,
  `partition.partition_feature_by_key`), placed when the embedding builds them on its `devices`.
- `UnshardableTiered`: tiered tables (static or dynamic) have no sharded form yet; the kind refuses them by name
  when the embedding is created, before any table exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import update_trigger
from tf_embed_ops.backends import static as static_backend
from tf_embed_ops.distribute import partition
from tf_embed_ops.dynamic import engine as dynamic_engine
from tf_embed_ops.tiered import config as tiered_config
from tf_embed_ops.tiered import keras_weights as tiered_keras_weights

__all__ = ["ShardedDynamicGroup", "ShardedStaticGroup", "UnshardableTiered"]

# The front end named in the refusal of tiered tables (the Keras layer builds one too).
_FRONT_END = "te.distribute.ShardedTPUEmbedding"


class ShardedStaticGroup(static_backend.StaticGroup):
    """The in-memory tables of a `ShardedTPUEmbedding` (its `ShardedVariable`s): `StaticGroup` with the training
    lookup and the probe of the per-server updates."""

    def _probe_servers(self, updates: list) -> tf.Tensor:
        # One element of every server's first shard, read after the updates, summed.
        embedding = self._embedding
        probes = []
        for plan in embedding.server_plans:
            with tf.device(embedding.devices[plan.task]):
                probes.append(update_trigger.probe_after(updates, embedding.shard_variables(plan)[0][0]))
        return tf.add_n(probes)

    def probe(self, sent: list) -> Any:
        """A scalar read after the update ops `sent` on every server (None without a table)."""
        return self._probe_servers(sent) if self._embedding.table_configs else None

    def lookup_and_update(self, inputs: list, trigger: Any) -> list:
        """Activations whose backward pass runs the per-server fused updates (or feeds the attached aggregator) and
        returns a zero for `trigger` that depends on them."""
        embedding = self._embedding
        learning_rate_fns = list(embedding.dynamic_learning_rates)

        def update(gradients: list) -> tf.Tensor:
            rates = [tf.cast(fn(), tf.float32) for fn in learning_rate_fns]
            return self._probe_servers(embedding.send_gradients(gradients, rates, inputs))

        return update_trigger.hang_update_on_trigger(trigger, lambda: embedding.lookup(inputs), update)


class ShardedDynamicGroup(dynamic_engine.DynamicGroup):
    """The dynamic tables of a `ShardedTPUEmbedding`: one `ShardedDynamicTable` per table, a shard per device of
    the embedding (`owner.devices`, given at `build`), each shard holding the keys `shard_of_keys` assigns it; the
    lookup and update of a shard's keys run on its device."""

    def build(self, owner: Any) -> None:
        """Creates the tables with one shard per device of `owner` (a `ShardedTPUEmbedding`). Idempotent."""
        # Placed here: the embedding's devices are known once it is created, its groups before that.
        self._shard_devices = list(owner.devices)
        self._partition_by_key = partition.partition_feature_by_key
        super().build(owner)


class UnshardableTiered:
    """The tiered kind of the sharded classes: there is none yet. `of` refuses every tiered table (static, or
    dynamic with `storage=te.Tiered`), naming them, before any table exists."""

    # The tiered kind's Keras weights store keys, which a load of the class's kinds filters (`table_kinds`).
    keras_weights_prefix = tiered_keras_weights.PREFIX

    @classmethod
    def of(cls, flat_features: Sequence[Any], check_numerics: bool = False) -> None:
        """None when no feature's table is tiered.

        Raises:
          ValueError: naming the tiered tables.
        """
        del check_numerics
        names = sorted({f.table.name for f in flat_features if tiered_config.is_tiered(f.table)})
        if names:
            listed = ", ".join(map(repr, names))
            raise ValueError(
                f"{_FRONT_END} does not train tiered tables yet: table(s) {listed} have storage=te.Tiered(...). "
                "Train them with te.TPUEmbedding or te.keras.TPUEmbedding, or leave storage=None (in memory)."
            )
        return None
