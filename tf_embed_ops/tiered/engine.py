"""The tiered-table group of a `TPUEmbedding`: lookup, prefetch and fused update of its tiered features.

`te.TPUEmbedding` splits its features by table kind: features over tables with `storage=te.Tiered` are handed to a
`TieredGroup`, which owns their `TieredTable`s and runs `TfEmbed>TieredEmbeddingActivations` /
`TfEmbed>TieredSendTPUEmbeddingGradients` over them; the other features (in-memory static and dynamic tables) run
as before. The group is a table backend (`tf_embed_ops.backends.protocol.TableGroup`): the front ends run it with the
other kinds' groups through `tf_embed_ops.backends.walk`.

Every table's rounding step (the in-memory table's `rounding_step`: it keys stochastic rounding of 16-bit rows) is
read before the step's update and advanced after it, so a tiered table's 16-bit rows round exactly as the same
table's in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, _xla, embedding_ops, table_config, update_trigger
from tf_embed_ops import config as te_config
from tf_embed_ops.backends import protocol, served
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.serving import streamed as streamed_lib
from tf_embed_ops.tiered import chain, keras_weights, touched_rows
from tf_embed_ops.tiered import config as tiered_config
from tf_embed_ops.tiered import ops as tiered_ops

__all__ = ["ServedTieredGroup", "TieredGroup", "is_static_tiered", "rounding_table_ids"]


def is_static_tiered(table: Any) -> bool:
    """Whether `table` is a static tiered table (this group's kind). A tiered dynamic table is the dynamic group's:
    its keys and metadata are a dynamic table's, only its rows live in a row file (docs/tiered_tables.md)."""
    return tiered_config.is_tiered(table) and not dynamic_config.is_dynamic(table)


def rounding_table_ids(every_table: Sequence[Any], tables: Sequence[Any]) -> list[int]:
    """The index that keys each of `tables`' stochastic rounding: its position among the embedding's static
    (non-dynamic) tables, in-memory and tiered alike (docs/low_precision.md, "The random bits").

    The update ops key a 16-bit table's random bits by a table index. An embedding splits its static tables over
    two ops (in-memory tables: the fused send op; tiered tables: the tiered one), and each op's own positions skip
    the other's tables; passing these ids to both makes every table draw the bits it draws when all the tables
    are in memory, so a mixed embedding trains bit for bit like the all-in-memory one. Dynamic tables are not
    numbered here: their op (in-memory and tiered dynamic tables alike) keys them by their position among the
    embedding's dynamic tables, with their own seed.

    Args:
      every_table: all the embedding's resolved `TableConfig`s, in table order (names given).
      tables: the static tables one update op trains, in its order (a subset of `every_table`, by name).

    Returns:
      One non-negative id per table of `tables`.

    Raises:
      ValueError: a table of `tables` that is not a static table of `every_table`.
    """
    numbering = {}
    for t in every_table:
        if not dynamic_config.is_dynamic(t):
            numbering.setdefault(t.name, len(numbering))
    missing = [t.name for t in tables if t.name not in numbering or dynamic_config.is_dynamic(t)]
    if missing:
        raise ValueError(f"rounding_table_ids: table(s) {missing} are not static tables of the embedding")
    return [numbering[t.name] for t in tables]


class TieredGroup:
    """The features of a `TPUEmbedding` whose tables are tiered, and everything that runs them: a table backend
    (`tf_embed_ops.backends.protocol.TableGroup`).

    Args:
      flat_features: all the `FeatureConfig`s of the embedding, flattened (their tables already named and given
        their optimizers by the `TPUEmbedding`).
      check_numerics: reject a step whose gradients hold NaN or +-inf.

    Attributes:
      positions: the group's features' positions in `flat_features`; `static_positions`: the others'.
    """

    kind = "tiered"
    prefetches = True  # rows behind a cache: `prefetch` reads the next batch's misses
    keras_weights_prefix = keras_weights.PREFIX

    def __init__(self, flat_features: Sequence[Any], check_numerics: bool = False):
        self.positions = [i for i, f in enumerate(flat_features) if is_static_tiered(f.table)]
        self.static_positions = [i for i, f in enumerate(flat_features) if not is_static_tiered(f.table)]
        self.features = [flat_features[i] for i in self.positions]
        resolved = te_config.resolve_tables(self.features)
        self.table_configs = list(resolved.tables)
        self.learning_rates = list(resolved.learning_rates)
        # A tiered table draws the rounding bits it draws in memory: its index among the embedding's static tables.
        self._rounding_table_ids = rounding_table_ids(
            te_config.resolve_tables(list(flat_features)).tables, self.table_configs
        )
        self._check_numerics = bool(check_numerics)
        self._tables: list[Any] | None = None
        self._serialized = None

    @classmethod
    def of(cls, flat_features: Sequence[Any], check_numerics: bool = False) -> TieredGroup | None:
        """The group of `flat_features`' tiered features, or None when there is none."""
        if not any(is_static_tiered(f.table) for f in flat_features):
            return None
        return cls(flat_features, check_numerics)

    @property
    def check_numerics(self) -> bool:
        return self._check_numerics

    def build(self, owner: Any) -> None:
        """Creates the tables (their row files, initialised), tracked as checkpoint children of `owner` under their
        names. Idempotent; call it eagerly (or under `tf.init_scope`)."""
        if self._tables is not None:
            return
        from tf_embed_ops.tiered import table as table_lib  # pylint: disable=import-outside-toplevel

        tables = []
        for config in self.table_configs:
            table = table_lib.TieredTable(config)
            _tf_compat.track_child(owner, table, config.name)
            tables.append(table)
        self._tables = tables

    @property
    def tables(self) -> dict:
        """`{TableConfig: TieredTable}`."""
        return dict(zip(self.table_configs, self._tables or [], strict=False))

    @property
    def step(self) -> tf.Variable:
        """The rounding step of the group: the first table's counter (every table keeps its own, saved in its
        checkpoint; all advance together after each update)."""
        return self._tables[0].step

    @property
    def serialized_config(self) -> bytes:
        """The `TPUEmbeddingConfiguration` of the tiered ops over the group's features, serialized."""
        if self._serialized is None:
            untrained = any(t.optimizer is None for t in self.table_configs)
            sgd = tf.tpu.experimental.embedding.SGD(learning_rate=0.0) if untrained else None
            self._serialized = te_config.from_feature_config(list(self.features), optimizer=sgd).SerializeToString()
        return self._serialized

    @property
    def combiners(self) -> list[str]:
        return [t.combiner for t in self.table_configs]

    def check_trainable(self) -> None:
        table_config.check_trainable(self.table_configs)

    def _handles(self) -> list:
        return [t.handle for t in self._tables]

    def lookup(self, inputs: list, training: bool) -> list:
        """Activations of the group's features (`inputs` in group order); `training` changes nothing here."""
        del training
        return list(
            tiered_ops.tiered_embedding_activations(
                inputs, self._handles(), self.serialized_config, combiners=self.combiners
            )
        )

    def xla_refusal(self) -> str | None:
        return (
            f"tiered tables {sorted(t.name for t in self.table_configs)} cannot be looked up under XLA "
            "(jit_compile=True): their rows live in a cache XLA cannot read"
        )

    def serving_group(self, context: Any) -> ServedTieredGroup:
        return ServedTieredGroup(self, context)

    def tracking_view(self, config: Any, table: Any) -> touched_rows.TieredRowsView:
        return touched_rows.TieredRowsView(config.name, table)

    def check_prune(self, name: str, prune: Any) -> None:
        del prune
        raise ValueError(
            f"prune: table {name!r} is tiered (storage=te.Tiered): pruning at export is not supported for tiered "
            "tables yet (it ranks the whole table's rows); export it unpruned, quantized if it must be smaller"
        )

    def export_form(self, config: Any, table: Any, mode: Any, prune: Any) -> protocol.ExportForm:
        """A `StreamedTable` (never pruned: `check_prune` refuses), whose rows are written into the SavedModel
        chunk by chunk after it is saved: it has no value until then."""
        del config, prune
        form = streamed_lib.StreamedTable(table, mode)
        return protocol.ExportForm(served=form, streamed=True, metadata=form.metadata)

    def save_keras_weights(self, store: Any) -> None:
        """Writes the tables into a Keras weights `store`, chunk by chunk (`tiered.keras_weights`)."""
        keras_weights.save(store, self.tables)

    def check_keras_weights(self, store: Any) -> list:
        """Checks every table's entries in a Keras weights `store`, writing nothing; returns the writes to run."""
        return keras_weights.check(store, self.tables)

    def chain_state(self, config: Any, view: Any) -> chain.TieredChain:
        return chain.TieredChain(config.name, view)

    def restore_checks(self) -> dict:
        """`{table name: tiered.checkpoint.RestoreCheck}` once built ({} before: no table to check against)."""
        from tf_embed_ops.tiered import checkpoint as checkpoint_lib  # pylint: disable=import-outside-toplevel

        return {config.name: checkpoint_lib.RestoreCheck(table) for config, table in self.tables.items()}

    def prefetch(self, inputs: list) -> list:
        """Makes the rows of `inputs` (the group's features, group order) resident in their tables' caches;
        returns the prefetch ops (eagerly: [])."""
        index = {t.name: i for i, t in enumerate(self.table_configs)}
        per_table: list[list[tf.Tensor]] = [[] for _ in self.table_configs]
        for feature, inp in zip(self.features, inputs, strict=True):
            per_table[index[feature.table.name]].append(tf.reshape(inp.ids, [-1]))
        ops = []
        for table, ids in zip(self._tables, per_table, strict=True):
            if ids:
                op = table.prefetch(tf.concat(ids, 0) if len(ids) > 1 else ids[0])
                if op is not None:
                    ops.append(op)
        return ops

    def normalize_input(self, feature: Any, x: Any, weights: Any, max_sequence_length: int, name: str) -> Any:
        del feature  # numbered rows, as an in-memory table's
        return embedding_ops.normalize_feature(x, weights, max_sequence_length, name)

    def evaluate_learning_rates(self) -> list:
        """The group's learning rates, one float32 scalar per tag (its callables, called once)."""
        return [tf.cast(fn(), tf.float32) for fn in self.learning_rates]

    def _rounding(self) -> list[str]:
        if not any(table_config.is_low_precision(t) for t in self.table_configs):
            return []
        return [table_config.rounding(t) for t in self.table_configs]

    def _send(self, gradients: list, inputs: list, learning_rates: list, step: Any, validate_only: bool) -> Any:
        return tiered_ops.tiered_send_tpu_embedding_gradients(
            list(gradients),
            learning_rates,
            inputs,
            self._handles(),
            step,
            self.serialized_config,
            combiners=self.combiners,
            check_numerics=self._check_numerics,
            rounding=self._rounding(),
            rounding_table_ids=self._rounding_table_ids if self._rounding() else None,
            validate_only=validate_only,
        )

    def validate_send(self, gradients: list, inputs: list, learning_rates: list) -> list:
        """The send op's checks without its writes (`validate_only`): everything the update would reject (ids,
        rows beyond the cache's capacity, learning rates; with check_numerics the gradients and the values the
        update would make). Run before another op that writes."""
        check = self._send(gradients, inputs, learning_rates, self.step.read_value(), validate_only=True)
        return [check] if check is not None else []

    def send_gradients(self, gradients: list, inputs: list, learning_rates: list | None = None) -> tf.Tensor:
        """The fused update of the group's tables, then every table's step advances; returns the new step.
        (Before another group writes, run `validate_send`: `tf_embed_ops.backends.walk.send` does.)
        `learning_rates` defaults to `evaluate_learning_rates()`."""
        self.check_trainable()
        if learning_rates is None:
            learning_rates = self.evaluate_learning_rates()
        update = self._send(gradients, inputs, learning_rates, self.step.read_value(), validate_only=False)
        with tf.control_dependencies([update] if update is not None else []):
            steps = [table.step.assign_add(1) for table in self._tables]
        return steps[0]

    def probe(self, sent: tf.Tensor) -> tf.Tensor:
        """A scalar read after the update: `send_gradients`' new step itself."""
        return sent

    def lookup_and_update(self, inputs: list, trigger: tf.Tensor) -> list:
        """Training lookup whose backward pass runs the fused update (the Keras layers' form; see
        `update_trigger`)."""
        return update_trigger.hang_update_on_trigger(
            trigger,
            lambda: self.lookup(inputs, training=True),
            lambda gradients: self.send_gradients(gradients, inputs),
        )


class ServedTieredGroup(served.ServedGroup):
    """A `TieredGroup` while serving: each table read from its serving form (`tf_embed_ops.serving.streamed.
    StreamedTable`, which the export makes)."""

    def _lookup(self, feature: Any, inp: Any, table: Any) -> tf.Tensor:
        form = self._context.served_form(table)
        if form is table:
            raise ValueError(
                f"Tiered table {feature.table.name!r}: its rows live in a row file a serving graph cannot read; "
                "export the model with te.keras.export_for_serving or publish it with te.serving.Publisher, "
                "which write the rows into the SavedModel chunk by chunk"
            )
        config = feature.table
        return _xla.lookup(
            inp, served.is_dense_input(inp), form, config.dim, config.combiner, config.quantization_config
        )
