"""The static in-memory tables of an embedding as a table group (`protocol.TableGroup`).

Their tables and slots are the embedding's `tf.Variable`s (or `keras.Variable`s, or a sharded class's
`ShardedVariable`s): the embedding creates and places them, and its `lookup` / `send_gradients` run the fused ops
over them (the sharded classes override those two). This group hands the walk those calls.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, _xla, embedding_ops, table_config, update_trigger
from tf_embed_ops.backends import protocol, row_chain, served, touched_rows
from tf_embed_ops.engine import variable_restore
from tf_embed_ops.serving import prune as prune_lib
from tf_embed_ops.serving.tables import ServedTable, table_metadata

__all__ = ["StaticGroup"]


def _backing(variable: Any) -> Any:
    # A keras.Variable's backing tf.Variable; a tf.Variable (or a ShardedVariable) as it is.
    inner = getattr(variable, "value", None)
    return inner if not isinstance(variable, tf.Variable) and isinstance(inner, tf.Variable) else variable


class StaticGroup:
    """The features of `embedding` at `positions` (flattened feature order), whose tables are its variables.

    Args:
      embedding: the `tf_embed_ops.TPUEmbedding` (or subclass) that owns the variables.
      positions: the features' positions among the embedding's flattened features.
      features: the `FeatureConfig`s at those positions.
    """

    kind = "in-memory"
    prefetches = False  # every row is resident
    keras_weights_prefix = None  # its tables are the embedding's variables: a Keras layer's own weights

    def __init__(self, embedding: Any, positions: list[int], features: list):
        self._embedding = embedding
        self.positions = list(positions)
        self.features = list(features)

    @property
    def table_configs(self) -> list:
        return self._embedding.table_configs

    def build(self, owner: Any) -> None:
        """Nothing: the embedding creates the variables (its subclasses place them; `TPUEmbedding.build`)."""
        del owner

    @property
    def tables(self) -> dict:
        """`{TableConfig: the tf.Variable of its rows}` (a `keras.Variable`'s backing variable)."""
        variables = self._embedding.variables
        return {t: _backing(variables[t.name]["parameters"]) for t in self._embedding.table_configs}

    def xla_refusal(self) -> str | None:
        return None  # under XLA `TPUEmbedding.lookup` runs `_xla.lookup`

    def lookup(self, inputs: list, training: bool) -> list:
        del training  # the fused update is `send_gradients`; a lookup never writes a static table
        return list(self._embedding.lookup(inputs))

    def prefetch(self, inputs: list) -> list:
        del inputs  # every row is resident
        return []

    def normalize_input(self, feature: Any, x: Any, weights: Any, max_sequence_length: int, name: str) -> Any:
        del feature  # numbered rows: every table takes the one normalisation
        return embedding_ops.normalize_feature(x, weights, max_sequence_length, name)

    def check_trainable(self) -> None:
        table_config.check_trainable(self._embedding.table_configs)

    def evaluate_learning_rates(self) -> list:
        return [tf.cast(fn(), tf.float32) for fn in self._embedding.dynamic_learning_rates]

    def validate_send(self, gradients: list, inputs: list, learning_rates: list) -> list:
        # The fused send op validates everything before its first write but has no form that writes nothing; the
        # front ends therefore list this group first (`walk.send` checks every group but the first).
        raise NotImplementedError("the in-memory tables' update must run first (walk.send checks the others)")

    def send_gradients(self, gradients: list, inputs: list, learning_rates: list) -> list:
        """Runs `embedding.send_gradients`; returns its update ops (none eagerly; the sharded class runs several)."""
        update = self._embedding.send_gradients(gradients, learning_rates, inputs)
        return [u for u in (update if isinstance(update, (list, tuple)) else [update]) if u is not None]

    def probe(self, sent: list) -> Any:
        """A table element read after the update ops `sent` (None without a table)."""
        tables, _ = self._embedding.tables_and_slots()
        return update_trigger.probe_after(sent, tables[0]) if tables else None

    def lookup_and_update(self, inputs: list, trigger: Any) -> list:
        """The Keras layers' training lookup: the fused update hangs on `trigger`'s gradient."""
        embedding = self._embedding
        tables, slots = embedding.tables_and_slots()
        return embedding_ops.embedding_lookup_and_update(
            inputs,
            tables,
            slots,
            embedding.serialized_config,
            combiners=embedding.combiners,
            learning_rates=list(embedding.dynamic_learning_rates),
            trigger=trigger,
            check_numerics=embedding.check_numerics,
            rounding_arguments=embedding.rounding_arguments,
            after_update=embedding.advance_rounding_step,
        )

    def serving_group(self, context: Any) -> ServedStaticGroup:
        return ServedStaticGroup(self, context)

    def tracking_view(self, config: Any, table: Any) -> touched_rows.StaticRowsView:
        """The tracker's view of `config`'s table: its variable and its slots' (every shard), each tracked."""
        del table  # the view reads the table's and its slots' variables
        slots = _tf_compat.slot_names(config.optimizer) if config.optimizer is not None else []
        return touched_rows.StaticRowsView(config.name, self._embedding.variables[config.name], slots)

    def check_prune(self, name: str, prune: Any) -> None:
        prune_lib.check_applicable(prune, name, dynamic=False)

    def export_form(self, config: Any, table: Any, mode: Any, prune: Any) -> protocol.ExportForm:
        """Read as trained (its metadata only), or from an encoded / pruned copy of its rows (`ServedTable`; the
        training variable `table` is only read)."""
        dtype = tf.as_dtype(table.dtype)
        if mode is None and prune is None:
            rows, dim = (int(d) for d in table.shape)
            metadata = table_metadata("static", dim, rows, rows, None, None, rows * dim * dtype.size, dtype.name)
            return protocol.ExportForm(metadata=metadata)
        with tf.init_scope():
            form = ServedTable(config.name, table.numpy(), mode, prune, dtype.name)
        return protocol.ExportForm(served=form, metadata=form.metadata)

    def save_keras_weights(self, store: Any) -> None:
        """Nothing: Keras saves the layer's `keras.Variable`s (these tables and slots) itself."""
        del store

    def check_keras_weights(self, store: Any) -> list:
        """Nothing to check or write: Keras loads the layer's `keras.Variable`s itself."""
        del store
        return []

    def chain_state(self, config: Any, view: Any) -> row_chain.RowChain:
        return row_chain.RowChain(config.name, view)

    def restore_checks(self) -> dict:
        """The checks of every variable child of the embedding (its tables, slots and `rounding_step`)."""
        return variable_restore.variable_checks(self._embedding)


class ServedStaticGroup(served.ServedGroup):
    """The in-memory tables while serving (or under XLA without a context): each read from the serving form the
    context gives it (the variable itself when none)."""

    def _lookup(self, feature: Any, inp: Any, table: Any) -> Any:
        form = self._context.served_form(table) if self._context is not None else table
        config = feature.table
        return _xla.lookup(
            inp, served.is_dense_input(inp), form, config.dim, config.combiner, config.quantization_config
        )
