"""`de.keras.layers.Embedding`, `SquashedEmbedding`, `FieldWiseEmbedding` (and `BasicEmbedding`), Keras 3 layers.

`Embedding(embedding_size, ...)(ids)` returns `ids.shape + [embedding_size]` (no combining), as TFRA's layer;
`SquashedEmbedding` reduces every axis but the batch axis with `combiner`; `FieldWiseEmbedding` reduces the ids of
each sample by field (`slot_map_fn(ids)` in `[0, nslots)`) into `[batch, nslots, embedding_size]`. The table is a
`de.Variable` (`layer.params`). In training the layer's one trainable weight, a scalar *trigger*, carries the
update: its gradient runs the table's fused update with the optimizer given to `de.DynamicEmbeddingOptimizer`, so
`model.fit` and custom loops train the table as they train any weight.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_embed_ops.dynamic import keras_weights
from tf_embed_ops.tfra import optimizer, variable

__all__ = ["BasicEmbedding", "Embedding", "FieldWiseEmbedding", "SquashedEmbedding"]

_REDUCTIONS = {
    "sum": tf.math.reduce_sum,
    "mean": tf.math.reduce_mean,
    "max": tf.math.reduce_max,
    "min": tf.math.reduce_min,
    "prod": tf.math.reduce_prod,
    "std": tf.math.reduce_std,
}
_SEGMENT = {
    "sum": tf.math.unsorted_segment_sum,
    "mean": tf.math.unsorted_segment_mean,
    "max": tf.math.unsorted_segment_max,
    "min": tf.math.unsorted_segment_min,
    "prod": tf.math.unsorted_segment_prod,
    "sqrtn": tf.math.unsorted_segment_sqrt_n,
}


def _check_combiner(name: str, combiner: Any, allowed: dict) -> Any:
    if callable(combiner) or combiner in allowed:
        return combiner
    raise ValueError(f"Layer {name!r}: combiner must be one of {sorted(allowed)} or a callable; got {combiner!r}.")


@keras.saving.register_keras_serializable(package="tf_embed_ops.tfra")
class Embedding(keras.layers.Layer):
    """A dynamic embedding: `ids.shape + [embedding_size]` rows of a `de.Variable` (`self.params`).

    Args:
      embedding_size: the row width.
      key_dtype: tf.int64 (default), tf.int32 or tf.string.
      value_dtype: tf.float32.
      combiner: for the subclasses' reduction ("sum" default).
      initializer: as `de.Variable` (None: `keras.initializers.RandomNormal()`, as TFRA).
      devices: CPU devices (GPU ones are refused).
      name: the layer's name; the table is named `<name>-parameter`.
      with_unique: accepted (the op de-duplicates ids itself).
      **kwargs: `trainable`, `init_capacity`, `restrict_policy`, `max_norm` (clip each row's L2 norm in the
        output), and TFRA's `bp_v2`, `partitioner`, `kv_creator` (refused unless None), `distribute_strategy`,
        `keep_distribution`, `short_file_name` (no effect).

    Raises:
      ValueError / NotImplementedError: as `de.Variable`.
    """

    def __init__(
        self,
        embedding_size: int,
        key_dtype: Any = tf.int64,
        value_dtype: Any = tf.float32,
        combiner: Any = "sum",
        initializer: Any = None,
        devices: Any = None,
        name: str = "DynamicEmbeddingLayer",
        with_unique: bool = True,
        short_file_name: bool = False,
        **kwargs: Any,
    ):
        try:
            embedding_size = int(embedding_size)
        except (TypeError, ValueError):
            raise TypeError(f"embedding_size must be convertible to an integer; got {embedding_size!r}") from None
        trainable = kwargs.pop("trainable", True)
        max_norm = kwargs.pop("max_norm", None)
        options = {
            k: kwargs.pop(k)
            for k in ("init_capacity", "restrict_policy", "kv_creator", "partitioner", "bp_v2")
            if k in kwargs
        }
        for ignored in ("distribute_strategy", "keep_distribution", "checkpoint"):
            kwargs.pop(ignored, None)
        super().__init__(name=name, trainable=trainable, **kwargs)
        self.max_norm = max_norm
        self.embedding_size = embedding_size
        self.combiner = combiner
        self.with_unique = with_unique
        if isinstance(initializer, dict):  # from get_config (keras.models.load_model)
            initializer = keras.initializers.deserialize(initializer)
        self.params = variable.Variable(
            key_dtype=key_dtype,
            value_dtype=value_dtype,
            dim=embedding_size,
            devices=devices,
            name=f"{name}-parameter" if name else "EmbeddingParameter",
            initializer=keras.initializers.RandomNormal() if initializer is None else initializer,
            trainable=trainable,
            init_size=options.get("init_capacity", 0),
            kv_creator=options.get("kv_creator"),
            restrict_policy=options.get("restrict_policy"),
        )
        # Keras collects trainable weights it created itself: the trigger is the layer's own weight.
        self.trigger = self.add_weight(
            name="trigger", shape=(), initializer="zeros", dtype="float32", trainable=trainable, autocast=False
        )
        optimizer.register_trigger(self.trigger, self.params)
        self.supports_jit = False
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.built = True

    def build(self, input_shape: Any = None) -> None:  # the table exists from __init__
        self.built = True

    def lookup(self, ids: Any, training: bool | None = None) -> tf.Tensor:
        rows = self.params.rows(ids, self.trigger if self.trainable else None, training)
        return rows if self.max_norm is None else tf.clip_by_norm(rows, self.max_norm, axes=[-1])

    def call(self, ids: Any, training: bool | None = None) -> tf.Tensor:
        return self.lookup(ids, training)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*tuple(input_shape), self.embedding_size)

    def compute_output_spec(self, ids: Any, training: Any = None) -> Any:
        return keras.KerasTensor(self.compute_output_shape(ids.shape), dtype="float32")

    # `model.save` / `save_weights` / `load_weights` store a layer's keras.Variables; the table is a resource, so
    # its content is stored beside them (`dynamic.keras_weights`: `dynamic.<table>.<tensor>`), checked whole before
    # it is written. The table's slots follow its optimizer: wrap the optimizer before loading.
    def save_own_variables(self, store: Any) -> None:
        super().save_own_variables(store)
        keras_weights.save(store, {self.params.config: self.params.table})

    def load_own_variables(self, store: Any) -> None:
        for write in keras_weights.check(store, {self.params.config: self.params.table}):
            write()
        super().load_own_variables({k: store[k] for k in store.keys() if not str(k).startswith(keras_weights.PREFIX)})

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "embedding_size": self.embedding_size,
                "key_dtype": self.params.key_dtype.name,
                "value_dtype": "float32",
                "combiner": self.combiner if isinstance(self.combiner, str) else None,
                "initializer": keras.initializers.serialize(keras.initializers.get(self.params.initializer))
                if self.params.initializer is not None and not isinstance(self.params.initializer, (int, float))
                else self.params.initializer,
                "with_unique": self.with_unique,
            }
        )
        return config


BasicEmbedding = Embedding


@keras.saving.register_keras_serializable(package="tf_embed_ops.tfra")
class SquashedEmbedding(Embedding):
    """`Embedding` reduced over every axis but the first with `combiner` (TFRA's `reduce_pooling`): ids
    `[batch, ...]` give `[batch, embedding_size]`; 1-D ids give `[embedding_size]`."""

    def __init__(self, embedding_size: int, *args: Any, **kwargs: Any):
        super().__init__(embedding_size, *args, **kwargs)
        _check_combiner(self.name, self.combiner, _REDUCTIONS)

    def call(self, ids: Any, training: bool | None = None) -> tf.Tensor:
        rows = self.lookup(ids, training)
        reduce = self.combiner if callable(self.combiner) else _REDUCTIONS[self.combiner]
        rank = rows.shape.rank
        if rank == 2:
            return reduce(rows, 0)
        for _ in range(rank - 2):
            rows = reduce(rows, 1)
        return rows

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        return (self.embedding_size,) if len(shape) == 1 else (shape[0], self.embedding_size)


@keras.saving.register_keras_serializable(package="tf_embed_ops.tfra")
class FieldWiseEmbedding(Embedding):
    """`Embedding` whose ids are reduced per field: ids `[batch, n]` give `[batch, nslots, embedding_size]`, the
    ids of field `slot_map_fn(id)` combined with `combiner` (empty fields: zeros).

    Raises:
      ValueError: `slot_map_fn` not callable, a combiner without a segment reduction.
    """

    def __init__(self, embedding_size: int, nslots: int, slot_map_fn: Any = None, *args: Any, **kwargs: Any):
        if not callable(slot_map_fn):
            raise ValueError("slot_map_fn is not callable.")
        try:
            nslots = int(nslots)
        except (TypeError, ValueError):
            raise TypeError(f"nslots should be convertible to int, but got {type(nslots)}") from None
        kwargs.setdefault("name", "SlotDynamicEmbeddingLayer")
        super().__init__(embedding_size, *args, **kwargs)
        self.nslots = nslots
        self.slot_map_fn = slot_map_fn
        _check_combiner(self.name, self.combiner, _SEGMENT)

    def call(self, ids: Any, training: bool | None = None) -> tf.Tensor:
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank is not None and ids.shape.rank > 2:
            raise NotImplementedError("Input dimension higher than 2 is not implemented yet.")
        rows = self.lookup(tf.reshape(ids, [-1]), training)
        shape = tf.shape(ids)
        batch, per_sample = shape[0], shape[1]
        slots = tf.cast(self.slot_map_fn(ids), tf.int32)
        segments = slots + tf.range(batch)[:, tf.newaxis] * self.nslots
        segments = tf.reshape(segments, [-1]) + 0 * per_sample
        reduce = self.combiner if callable(self.combiner) else _SEGMENT[self.combiner]
        pooled = reduce(rows, segments, batch * self.nslots)
        if self.combiner in ("max", "min"):
            # An empty field is 0 (TFRA's sparse segment reductions), not the reduction's identity (-inf, +inf).
            present = tf.math.unsorted_segment_sum(tf.ones_like(segments), segments, batch * self.nslots) > 0
            pooled = tf.where(present[:, tf.newaxis], pooled, tf.zeros_like(pooled))
        return tf.reshape(pooled, [batch, self.nslots, self.embedding_size])

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (tuple(input_shape)[0], self.nslots, self.embedding_size)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"nslots": self.nslots})
        return config
