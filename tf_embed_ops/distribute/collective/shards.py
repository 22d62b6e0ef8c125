"""One Keras `TPUEmbedding` layer's tables, mod-sharded over the workers of a collective job.

Each worker holds, per table, its rows `w, w + N, ...` (`layout.shard_rows`) and their optimizer slots in a
mid-level `tf_embed_ops.TPUEmbedding` of its own (plain variables of this process, one feature per table,
combiner "sum"): its fused update is the one the single-process kernels run, on the shard's local rows. A dynamic
table's shard is a dynamic table of its own holding the keys `shard_of_keys` gives this worker.

While `fit` trains, the layer holds its shards only (`attach`): each table and slot `keras.Variable` of the layer
is backed by this worker's shard variable (so `layer.embedding_tables[t].shape` is the shard's), the full
variables are released, and the layer's dynamic tables are emptied. A checkpoint still holds the single-process
tensors under the single-process keys: the layer's checkpoint children are replaced, under the same names, by
stand-ins whose tensors are produced when the checkpoint writes them (an all-gather of every worker's shard:
every worker saves, as MultiWorkerMirroredStrategy requires) and whose restore keeps this worker's rows of the
full tensor (no collective: a restore asks for the tensors' dtypes only). `detach` gathers the full tables back
into the layer (after training: the model one process would hold).

Example:
    >>> shards = LayerShards(layer, exchange, worker=0)
    >>> shards.attach()        # shards <- layer; the layer now holds its shards
    >>> ...                    # training steps; tf.train.Checkpoint(model=model).save(...) on every worker
    >>> shards.detach()        # layer <- all shards (every worker calls it)
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops import tpu_embedding as mid_level
from tf_embed_ops.distribute.collective import layout
from tf_embed_ops.distribute.collective.exchange import Exchange
from tf_embed_ops.dynamic import table as table_lib
from tf_embed_ops.dynamic import table_state

__all__ = ["LayerShards", "attached"]

# The layers whose tables are attached to their shards now, and those shards (`attached`).
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attached(layer: Any) -> LayerShards | None:
    """The `LayerShards` holding `layer`'s tables while `fit` trains it (None outside training)."""
    return _ATTACHED.get(layer)


class LayerShards:
    """The shards of one layer's tables on this worker, and the layer's feature -> table wiring."""

    def __init__(self, layer: Any, exchange: Exchange, worker: int):
        self.layer = layer
        self.exchange = exchange
        self.worker = int(worker)
        n = exchange.num_workers
        name = getattr(layer, "name", type(layer).__name__)
        if layer.tiered_tables:
            raise ValueError(
                f"Layer {name!r}: tiered tables {sorted(t.name for t in layer.tiered_tables)} cannot be sharded by "
                "the collective mode; keep them in memory (no storage=te.Tiered)."
            )
        self.static_tables = list(layer.embedding_tables)  # TableConfigs in table order, optimizers filled in
        self.dynamic_configs = list(layer.dynamic_tables)
        self.tables = self.static_tables + self.dynamic_configs
        self.features = tf.nest.flatten(layer.feature_config)
        for table in self.dynamic_configs:
            refused = [
                f"{what}={value!r}"
                for what, value in (
                    ("admission", table.admission),
                    ("eviction", table.eviction),
                    ("storage", getattr(table, "storage", None)),
                )
                if value is not None
            ]
            if table.key_dtype != tf.int64:
                refused.append(f"key_dtype={table.key_dtype.name}")
            if refused:
                raise ValueError(
                    f"Layer {name!r}, dynamic table {table.name!r}: {', '.join(refused)} is not supported in the "
                    "collective mode (a shard would count, admit or evict by its own keys, not as one process); "
                    "use an int64-keyed in-memory dynamic table without admission and eviction."
                )
        for table in self.tables:
            if getattr(table, "quantization_config", None) is not None:
                raise ValueError(
                    f"Layer {name!r}, table {table.name!r}: quantization_config is not supported in the collective "
                    "mode (the lookup's straight-through gradient is the kernel's, not an autodiff of the rounding)."
                )
            for attribute in ("storage_dtype", "slot_storage_dtype"):
                dtype = getattr(table, attribute, None)
                if dtype is not None and tf.as_dtype(dtype) != tf.float32:
                    raise ValueError(
                        f"Layer {name!r}, table {table.name!r}: {attribute}={tf.as_dtype(dtype).name} is not supported "
                        "in the collective mode (its rounding would not be the single process's); use float32."
                    )
            if table in self.dynamic_configs:
                continue
            if table.vocabulary_size < n:
                raise ValueError(
                    f"Layer {name!r}, table {table.name!r}: vocabulary_size {table.vocabulary_size} is smaller than "
                    f"the number of workers ({n}): every worker must hold at least one row."
                )
        # Per table, the positions of its features in the layer's flattened feature order (input order).
        self.table_features = [[i for i, f in enumerate(self.features) if f.table is t] for t in self.tables]
        shard_features = {}
        for table in self.static_tables:
            shard = copy.copy(table)
            shard.vocabulary_size = layout.shard_rows(table.vocabulary_size, n, self.worker)
            shard.combiner = "sum"  # the update's inputs are per-id gradient rows, one per sample
            shard.initializer = tf.zeros_initializer()  # `load` writes the rows
            shard_features[table.name] = tf.tpu.experimental.embedding.FeatureConfig(shard, name=table.name)
        self.shard = mid_level.TPUEmbedding(shard_features, None) if shard_features else None
        if self.shard is not None:
            self.shard.build()
        # A dynamic table's shard: a one-table mid-level object of its own (its group, its step counter), holding
        # the keys `shard_of_keys` gives this worker; the keys' rows start as one process's (a function of the key).
        self.dynamic_groups, self._dynamic_embeddings = [], []
        for table in self.dynamic_configs:
            shard = copy.copy(table)
            shard.combiner = "sum"
            embedding = mid_level.TPUEmbedding(
                {table.name: tf.tpu.experimental.embedding.FeatureConfig(shard, name=table.name)}, None
            )
            embedding.build()
            self.dynamic_groups.append(embedding.dynamic_group)
            self._dynamic_embeddings.append(embedding)
        # The padded shard height: every worker's static shard gathers as ceil(V / N) rows.
        self.padded_rows = [-(-t.vocabulary_size // n) for t in self.static_tables]
        # Traced once each, on first use: every trace takes new collective keys.
        self._gather: dict[int, Any] = {}
        self._gather_dynamic: dict[int, Any] = {}
        # While attached: (checkpoint name, the layer's object) per static variable, then per dynamic table.
        self._attached: list | None = None
        self._variables_child: Any = None

    @property
    def trained(self) -> list[bool]:
        """Per table: does it train (frozen tables have no optimizer)."""
        return [t.optimizer is not None for t in self.tables]

    def is_dynamic(self, index: int) -> bool:
        return index >= len(self.static_tables)

    def dynamic_group(self, index: int):
        return self.dynamic_groups[index - len(self.static_tables)]

    def dynamic_shard(self, index: int) -> Any:
        """This worker's shard of dynamic table `index` (an index into `dynamic_configs`): a `DynamicTable`."""
        (table,) = self.dynamic_groups[index].tables.values()
        return table

    def _pairs(self):
        """(layer variable, shard variable, table index) for every static table and slot."""
        layer_slots = self.layer.slot_variables
        shard_vars = self.shard.variables
        for i, table in enumerate(self.static_tables):
            yield self.layer.embedding_tables[table], shard_vars[table.name]["parameters"], i
            for slot, var in layer_slots[table].items():
                yield var, shard_vars[table.name][slot], i

    def load(self) -> None:
        """Shards <- the layer's full tables and slots (rows `w::N`)."""
        rows = layout.shard_slice(self.exchange.num_workers, self.worker)
        for full, shard, _ in self._pairs():
            shard.assign(tf.convert_to_tensor(full)[rows])
        n = self.exchange.num_workers
        for j, config in enumerate(self.dynamic_configs):
            full = self.layer.dynamic_tables[config]
            shard = self.dynamic_shard(j)
            shard.import_contents(table_lib.restrict_to_shard(full.export(), n, self.worker))
            shard.step.assign(full.step)

    @property
    def is_attached(self) -> bool:
        return self._attached is not None

    def attach(self) -> None:
        """The layer onto this worker's shards (see the module docstring); no collective.

        The shards take their rows from the layer's full tables (`load`); then each table and slot variable of the
        layer is backed by its shard variable (the full one is released), each dynamic table of the layer is
        emptied, and the layer's checkpoint children become the stand-ins."""
        if self._attached is not None:
            return
        name = getattr(self.layer, "name", type(self.layer).__name__)
        if attached(self.layer) is not None:
            raise ValueError(
                f"Layer {name!r} still holds the shards of another collective `fit` (one that is running, or one "
                "that lost a worker: restart the job, which resumes from the last checkpoint)."
            )
        self.load()
        store = self.layer.embedding
        by_object = {id(child): key for key, child in store.checkpoint_children().items()}
        saved = []
        # The store also reaches its variables through `_variables` ({table: {"parameters" | slot: variable}}):
        # that path gets the stand-ins too, so the checkpoint's object graph keeps one process's shape.
        variables = _tf_compat.AutoTrackable()
        by_table: dict = {}
        for k, (variable, shard, i) in enumerate(self._pairs()):
            key = by_object[id(variable)]
            stand_in = _FullVariable(self, k, tuple(variable.shape), shard)
            _tf_compat.track_child(store, stand_in, key, overwrite=True)
            table = self.static_tables[i].name
            if table not in by_table:
                by_table[table] = _tf_compat.AutoTrackable()
                _tf_compat.track_child(variables, by_table[table], table)
            slot = "parameters" if key == table else key[len(table) + 1 :]
            _tf_compat.track_child(by_table[table], stand_in, slot)
            _tf_compat.rebind_keras_variable(variable, shard)
            saved.append((key, variable))
        if "_variables" in by_object.values():
            original = store.checkpoint_children()["_variables"]
            _tf_compat.track_child(store, variables, "_variables", overwrite=True)
            self._variables_child = original
        for j, config in enumerate(self.dynamic_configs):
            full = self.layer.dynamic_tables[config]
            key = by_object[id(full)]
            _tf_compat.track_child(store, _FullDynamicTable(self, j, full), key, overwrite=True)
            full.import_contents({field: value[:0] for field, value in full.export().items()})
            saved.append((key, full))
        self._attached = saved
        _ATTACHED[self.layer] = self

    def detach(self) -> None:
        """The layer's full tables and slots <- every worker's shard (an all-gather: every worker must call it);
        its checkpoint children are its own variables and dynamic tables again."""
        if self._attached is None:
            return
        store = self.layer.embedding
        pairs = list(self._pairs())
        for k, (key, variable) in enumerate(self._attached[: len(pairs)]):
            full = tf.Variable(self.full_value(k), trainable=False, name=variable.name)
            _tf_compat.rebind_keras_variable(variable, full)
            _tf_compat.track_child(store, variable, key, overwrite=True)
        for j, (key, full) in enumerate(self._attached[len(pairs) :]):
            contents = self.full_dynamic(j)
            step = contents.pop("step")
            full.import_contents(contents)
            full.step.assign(step)
            _tf_compat.track_child(store, full, key, overwrite=True)
        if self._variables_child is not None:
            _tf_compat.track_child(store, self._variables_child, "_variables", overwrite=True)
            self._variables_child = None
        self._attached = None
        _ATTACHED.pop(self.layer, None)

    def full_value(self, k: int) -> tf.Tensor:
        """Static variable `k` (in `_pairs` order) assembled from every worker's shard (collective)."""
        if k not in self._gather:
            _, shard, i = list(self._pairs())[k]
            self._gather[k] = _gather_function(self, shard, i)
        return self._gather[k]()

    def full_dynamic(self, j: int) -> dict:
        """Dynamic table `j`'s content assembled from every worker's shard, sorted by key, and its step
        (collective): the tensors one process's table checkpoints."""
        if j not in self._gather_dynamic:
            self._gather_dynamic[j] = _dynamic_gather_function(self, j)
        return self._gather_dynamic[j]()


class _FullVariable(_tf_compat.trackable_base.Trackable):
    """The checkpoint child that stands for a layer's table or slot variable while its shard trains: saves the
    full variable (gathered when the checkpoint writes it), restores this worker's rows of it.

    `shape` and `dtype` are the full variable's: what `TPUEmbedding`'s restore check compares a checkpoint with."""

    def __init__(self, shards: LayerShards, index: int, shape: tuple, shard: tf.Variable):
        self._shards = shards
        self._index = index
        self._shard = shard
        self.shape = tf.TensorShape(shape)
        self.dtype = shard.dtype

    def _serialize_to_tensors(self) -> dict:
        key = _tf_compat.trackable_base.VARIABLE_VALUE_KEY
        spec = _tf_compat.SaveSpec(
            lambda: self._shards.full_value(self._index), "", key, dtype=self.dtype, device=self._shard.device
        )
        return {key: spec}

    def _restore_from_tensors(self, restored_tensors: dict) -> Any:
        full = restored_tensors[_tf_compat.trackable_base.VARIABLE_VALUE_KEY]
        if not self.shape.is_compatible_with(full.shape):
            raise ValueError(
                f"Restore of a {self.shape.as_list()} variable of layer {self._shards.layer.name!r}: the checkpoint's "
                f"tensor has shape {full.shape.as_list()}; nothing was changed"
            )
        rows = layout.shard_slice(self._shards.exchange.num_workers, self._shards.worker)
        return self._shard.assign(tf.cast(full, self.dtype)[rows])


_DTYPES = {"weights": tf.float32, "slots": tf.float32}


class _FullDynamicTable(_tf_compat.trackable_base.Trackable):
    """The checkpoint child that stands for a layer's dynamic table while its shards train: saves the full content
    (every worker's keys, gathered and sorted by key, when the checkpoint writes it), restores this worker's keys.

    `spec` and `config` are the full table's: what `TPUEmbedding`'s restore check validates a checkpoint with."""

    def __init__(self, shards: LayerShards, index: int, full: Any):
        self._shards = shards
        self._index = index
        self.spec = full.spec
        self.config = full.config

    def _serialize_to_tensors(self) -> dict:
        shard = self._shards.dynamic_shard(self._index)
        device = shard.step.device
        gathered: dict = {}  # one gather per save, for all the tensors

        def tensor(field: str):
            def value() -> tf.Tensor:
                if not gathered:
                    gathered.update(self._shards.full_dynamic(self._index))
                return gathered[field]

            return value

        return {
            field: _tf_compat.SaveSpec(tensor(field), "", field, dtype=_DTYPES.get(field, tf.int64), device=device)
            for field in (*table_lib.EXPORT_TENSORS, "step")
        }

    def _restore_from_tensors(self, restored_tensors: dict) -> Any:
        shard = self._shards.dynamic_shard(self._index)
        contents = {field: restored_tensors[field] for field in table_lib.EXPORT_TENSORS}
        shard.check_contents(contents, "restore")
        step = table_state.checked_step(restored_tensors["step"], self._shards.dynamic_configs[self._index].name)
        mine = table_lib.restrict_to_shard(contents, self._shards.exchange.num_workers, self._shards.worker)
        shard.check_fits(mine)
        with tf.control_dependencies([step]):
            imported = shard.import_contents(mine)
        with tf.control_dependencies([imported]):
            return shard.step.assign(step)


def _unshard_order(vocabulary_size: int, num_workers: int, padded: int) -> np.ndarray:
    """Row r of the full table is row `(r % N) * padded + r // N` of the gathered, padded shards."""
    r = np.arange(vocabulary_size, dtype=np.int64)
    return (r % num_workers) * padded + r // num_workers


def _gather_function(shards: LayerShards, var: tf.Variable, i: int):
    n = shards.exchange.num_workers
    order = _unshard_order(shards.tables[i].vocabulary_size, n, shards.padded_rows[i])

    @tf.function(autograph=False)
    def gather():
        value = tf.convert_to_tensor(var)
        pad = shards.padded_rows[i] - tf.shape(value)[0]
        gathered = shards.exchange.all_gather(tf.pad(value, [[0, pad], [0, 0]]))
        return tf.gather(gathered, order)

    return gather


_ROW_FIELDS = ("keys", "weights", "slots", "counts", "last_steps")


def _dynamic_gather_function(shards: LayerShards, j: int):
    """Every worker's shard of dynamic table `j`, gathered: the full content (sorted by key) and the step."""
    ex = shards.exchange
    table = shards.dynamic_shard(j)

    @tf.function(autograph=False)
    def gather():
        c = table.export()
        size = tf.shape(c["keys"], out_type=tf.int64)[0]
        # At least one row: TensorFlow's gather of an empty tensor crashes the process.
        most = tf.maximum(ex.all_reduce(tf.reshape(size, [1]), "Max")[0], 1)
        pad = most - size
        valid = ex.all_gather(tf.pad(tf.ones([size], tf.int64), [[0, pad]]), most)
        keep = tf.equal(valid, 1)
        gathered = {}
        kept = tf.reduce_sum(valid)
        for field in _ROW_FIELDS:
            value = c[field]
            if value.shape.rank == 2 and value.shape[1] == 0:  # no slots (SGD): nothing to send (see above)
                gathered[field] = tf.zeros([kept, 0], value.dtype)
                continue
            paddings = [[0, pad]] + [[0, 0]] * (value.shape.rank - 1)
            gathered[field] = tf.boolean_mask(ex.all_gather(tf.pad(value, paddings), most), keep)
        order = tf.argsort(gathered["keys"], stable=True)
        full = {field: tf.gather(value, order) for field, value in gathered.items()}
        for field in ("pending_keys", "pending_counts", "pending_last_steps"):  # no admission in this mode
            full[field] = tf.zeros([0], tf.int64)
        full["step"] = table.step.read_value()
        return full

    return gather
