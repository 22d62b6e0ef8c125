"""The table backend protocol: what a front end asks of a group of tables of one kind.

A front end (`te.TPUEmbedding` and the classes built on it: `te.TPUEmbeddingV2`, the Keras layers, the sharded
classes) splits its features by the kind of their tables into groups, each an object of this protocol, normalises
each feature's input through its group (`normalize_input`), and runs one lookup and one update across them
(`tf_embed_ops.backends.walk`) without asking which kind a group is; it prefetches only where a group says it
can (`prefetches`). The lifecycle modules ask the group, never its kind: the tracker each table's view of its
changed rows (`tracking_view`), an incremental checkpoint chain each table's `ChainState` (`chain_state`), a
restore the checks of its checkpoint children (`restore_checks`), the exporter each table's serving form
(`check_prune`, `export_form`), a serving trace the group's plain-TensorFlow lookup (`serving_group`), and the Keras
layer's `model.save` / `load_model` / `save_weights` the entries its tables store beside the layer's variables
(`save_keras_weights`, `check_keras_weights`; every group's checks before any write), under the store-key prefix
the kind owns (`keras_weights_prefix`, a class attribute: a load filters every kind's, the layer's kinds or not,
out of what Keras loads itself). `kind` is a name for messages only.

The kinds, one module each: `tf_embed_ops.backends.static.StaticGroup` (tables and slots in `tf.Variable`s),
`tf_embed_ops.dynamic.engine.DynamicGroup` (hash-table tables keyed by int64 or string, in memory or tiered),
`tf_embed_ops.tiered.engine.TieredGroup` (static tables behind a DRAM row cache). Adding a kind is one module with a
class of this protocol (and the modules of its parts: its tracking view, chain state, serving form, Keras weights),
and a line where the front end lists the kinds (`TPUEmbedding._BACKENDS`; `TPUEmbedding.table_kinds()` gives them
with the in-memory group's class). The parameter-server sharded class lists its own
(`tf_embed_ops.distribute.sharded_groups`). A front end's accessors of one kind's tables (`dynamic_tables`,
`tiered_tables`) find its group by class (`engine.groups.of_class`).

Order of one update (`walk.send`): every group's `check_trainable`, then its learning rates (in group order), then
`validate_send` of every group but the first (checks that write nothing), then the groups' `send_gradients` in
order, each after all the checks. The first group's update validates its own inputs before it writes, so a step any
group rejects changes no table of any group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["ChainState", "ExportForm", "TableGroup", "claimed_positions"]


class ExportForm(NamedTuple):
    """How an export serves one table (`TableGroup.export_form`); every field may be left out.

    Attributes:
      served: the object the serving trace reads in place of the table (`ExportContext.served`: an object with
        `gather_rows(ids)`), or None (the table itself, or frozen by `freeze`).
      streamed: `served` has no value yet: the export writes its rows into the SavedModel after saving it
        (`tf_embed_ops.serving.streamed`).
      metadata: the table's entry in the export's metadata, or None when the frozen copy gives it after the trace.
      freeze: `(quantization mode, Prune or None)`: how the trace freezes the table (`ExportContext.dynamic`), or
        None.
    """

    served: Any = None
    streamed: bool = False
    metadata: dict | None = None
    freeze: tuple | None = None


@runtime_checkable
class TableGroup(Protocol):
    """A group of tables of one kind, and the features of an embedding that look them up.

    Attributes:
      kind: the kind's name in messages ("in-memory", "dynamic", "tiered"); nothing branches on it.
      prefetches: whether `prefetch` can have work to do (rows not resident): `TPUEmbedding.prefetch` normalises a
        batch only when a group does.
      keras_weights_prefix: the prefix of the Keras weights store keys the kind's tables own (`save_keras_weights`),
        or None when its tables are the layer's `keras.Variable`s, which Keras stores itself. A class attribute: the
        Keras layer filters every kind's prefix out of what it hands Keras, kinds it has no group of included.
      positions: the group's features' positions among the embedding's flattened features, in group order.
      features: the group's `FeatureConfig`s, in group order.
      table_configs: the group's tables, in the order its ops take them.
    """

    kind: str
    prefetches: bool
    keras_weights_prefix: str | None
    positions: list[int]
    features: list
    table_configs: list

    def build(self, owner: Any) -> None:
        """Creates the group's tables as checkpoint children of `owner` (idempotent; under `tf.init_scope`)."""

    @property
    def tables(self) -> dict:
        """`{TableConfig: table object}`: what tracking, checkpoints, the exporter and Keras' weights walk."""

    def normalize_input(self, feature: Any, x: Any, weights: Any, max_sequence_length: int, name: str) -> Any:
        """The `FeatureInput` of one of the group's features (`feature`: its `FeatureConfig`) from its ids `x`
        (dense, sparse or ragged) and `weights`, as `embedding_ops.normalize_feature` lays them out; a key dtype the
        table does not take is a ValueError naming the table (`engine.inputs` prefixes the feature, `name`)."""

    def xla_refusal(self) -> str | None:
        """Why the group cannot be looked up under XLA (`jit_compile=True`), or None when it can."""

    def lookup(self, inputs: list, training: bool) -> list:
        """The activations of the group's features (`inputs`: their normalised inputs, group order)."""

    def check_trainable(self) -> None:
        """Raises if a table of the group cannot be trained (no optimizer)."""

    def evaluate_learning_rates(self) -> list:
        """The group's learning rates, one float32 scalar per tag (its callables called once)."""

    def validate_send(self, gradients: list, inputs: list, learning_rates: list) -> list:
        """The checks of the group's update that write nothing (ops; [] eagerly, where they ran and passed)."""

    def send_gradients(self, gradients: list, inputs: list, learning_rates: list) -> Any:
        """The fused update of the group's tables; returns what `probe` takes (its ops, or its new step)."""

    def probe(self, sent: Any) -> Any:
        """A scalar read after the update `send_gradients` returned `sent` (a data dependency on it, for the Keras
        layers' trigger), or None when there is nothing to read."""

    def prefetch(self, inputs: list) -> list:
        """Makes the rows of `inputs` (group order) resident before the next lookup; returns its ops ([] when every
        row is resident)."""

    def lookup_and_update(self, inputs: list, trigger: Any) -> list:
        """A training lookup whose backward pass runs `send_gradients` (the Keras layers' form, `update_trigger`)."""

    def serving_group(self, context: Any) -> Any:
        """The group as a serving graph reads it: an object with `positions` and `lookup(inputs, training)` built
        of stock TensorFlow ops over the tables' serving forms (`context`: the export's `ExportContext`)."""

    def check_prune(self, name: str, prune: Any) -> None:
        """Raises ValueError naming table `name` unless its kind can be exported pruned by `prune` (a
        `te.serving.Prune`: the criteria the kind tracks). Called for every pruned table before any is encoded."""

    def export_form(self, config: Any, table: Any, mode: Any, prune: Any) -> ExportForm:
        """How `te.keras.export_for_serving` serves table `config` (`table`: its object in `tables`), stored in
        quantization `mode` (None: as trained) and pruned by `prune` (None, or checked by `check_prune`); encoder
        errors (ValueError naming the table) are raised here, before anything is written."""

    def tracking_view(self, config: Any, table: Any) -> Any:
        """The tracker's view of table `config` (`table`: its object in `tables`), tracking enabled on it: what
        `tracking.Tracker.table` gives (`kind`, `tiered`, `versions()`, `changed_since(since)`, `read(rows)`,
        `mark_all()`; `backends.touched_rows`)."""

    def chain_state(self, config: Any, view: Any) -> ChainState:
        """Table `config`'s part of an incremental checkpoint chain (`tf_embed_ops.checkpoint`), over the tracker's
        view of it (`view`: `tracking.Tracker.table`)."""

    def save_keras_weights(self, store: Any) -> None:
        """Writes the group's tables into a Keras weights `store` (the layer's `save_own_variables`), every key under
        `keras_weights_prefix`."""

    def check_keras_weights(self, store: Any) -> list:
        """Checks the group's tables' entries in a Keras weights `store` (the layer's `load_own_variables`), writing
        nothing (ValueError naming the table); returns the writes to run (callables) once every group passed."""

    def restore_checks(self) -> dict:
        """`{checkpoint child name: check}` of the group's tables (built or not): what a restore of the embedding
        checks before any table is written (`engine.checkpoint`). A check's `check(name, node, restore)` reads
        the child's checkpoint node (`restore`: `engine.checkpoint.Restore`), raises ValueError naming the table
        if it does not fit, and returns what must run once every table passed (or None)."""


@runtime_checkable
class ChainState(Protocol):
    """One table's part of an incremental checkpoint chain: what a delta holds of it, and how it is restored.

    The manager (`tf_embed_ops.checkpoint.IncrementalCheckpointManager`) saves a full checkpoint with
    `tf.train.Checkpoint.write`, then deltas; each table's kind writes, checks and restores its part of a delta.

    Attributes:
      name: the table's name (its arrays in a delta are `<delta_kind>/<name>/...`).
      delta_kind: the table's kind in a delta's header and the model fingerprint ("static": numbered rows;
        "dynamic": keyed rows). A chain moves between kinds of one `delta_kind` through its full checkpoint.
      streamed: the full checkpoint streams the table (its own saver; rows never whole in memory), so a save
        after it changed whole is a full checkpoint, and it must be tracked (a delta would lack its changes).
      table: the table object a checkpoint tracks (whose object path locates it there), or None when its rows
        are the embedding's variables.
    """

    name: str
    delta_kind: str
    streamed: bool
    table: Any

    def variables(self) -> list:
        """The variables a delta holds as rows (the chain saves every other variable whole)."""

    def dense_variables(self) -> dict:
        """`{path: variable}` a delta also holds whole for the table (a tiered table's rounding step)."""

    def describe(self) -> dict:
        """The table's layout (json) in the model fingerprint: deltas of another layout are refused."""

    def whole(self, changes: Any) -> bool:
        """Whether `changes` (the tracker's `TableChanges`) cover the whole table."""

    def delta(self, changes: Any) -> tuple[dict, dict]:
        """`(arrays, header entry)` of the delta of `changes` (the header entry's "kind" is `delta_kind`)."""

    def check_delta(self, path: str, info: dict, arrays: dict) -> None:
        """Raises ValueError (naming `path`, the table and the array) unless the delta's part fits the table."""

    def plan_restore(self, deltas: list, prefix: str, reader: Any, object_name: str | None) -> Any:
        """Checks the restore of the full checkpoint at `prefix` and `deltas` ([(header, arrays)], chain order),
        writing nothing (ValueError naming the table); returns what writes the deltas once TensorFlow has read the
        full checkpoint (`apply()`). `reader`: `tf.train.load_checkpoint(prefix)`; `object_name`: `table`'s
        object path in it (None: not found, or no table object)."""


def claimed_positions(groups: Sequence[Any]) -> set[int]:
    """The feature positions some group of `groups` looks up."""
    return {i for group in groups for i in group.positions}
