"""Table and slot variables, created and tracked exactly as TensorFlow's CPU classes create them.

`TPUEmbedding`/`TPUEmbeddingForServing` create each table as a checkpoint child named after the table
(`_add_variable_with_custom_getter`) and each slot as `<table>/<slot>` through the optimizer's own slot factory;
so does `create_variables_and_slots`, so `tf.train.Checkpoint(embedding=emb)` writes TensorFlow's keys and a
checkpoint moves both ways. How one variable is made is the caller's (`make_variable`: a `tf.Variable` for the
mid-level class, a `keras.Variable` for the Keras layer). A restore that ran before the variables existed hands
its pending value to the getter as the initializer; a shape mismatch then names the table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, low_precision, table_config
from tf_embed_ops import config as config_lib

__all__ = [
    "MakeVariable",
    "create_rounding_step",
    "create_variables_and_slots",
    "make_tf_variable",
    "slot_variables",
    "tables_and_slots",
]

# make_variable(name, shape, initializer, trainable, dtype) -> variable; `initializer(shape, dtype)` yields dtype.
MakeVariable = Callable[[str, tuple, Callable, bool, tf.DType], Any]


def make_tf_variable(name: str, shape: tuple, initializer: Callable, trainable: bool, dtype: tf.DType = tf.float32):
    """A plain `tf.Variable` of the storage `dtype` (`te.TableConfig`), initialised by `initializer(shape, dtype)`."""
    return tf.Variable(
        name=name,
        initial_value=functools.partial(initializer, shape, dtype=dtype),
        shape=shape,
        dtype=dtype,
        trainable=trainable,
    )


def create_variables_and_slots(owner: Any, tables: Sequence[Any], make_variable: MakeVariable) -> dict:
    """Creates `{table name: {"parameters": var, <slot>: var}}`, each variable a checkpoint child of `owner`.

    Args:
      owner: the trackable the variables are children of (TensorFlow's `_add_variable_with_custom_getter`).
      tables: the `TableConfig`s, in table order, with their optimizers resolved.
      make_variable: creates one variable (see `MakeVariable`).

    Returns:
      The variables by table name.

    Raises:
      ValueError: a pending restored value does not fit a table or slot; a `slot_variable_creation_fn` left out
        a slot.
    """
    variables = {}
    for table in tables:
        shape = (table.vocabulary_size, table.dim)

        def make_getter(_shape, _table=table.name):
            def getter(name, shape, dtype, initializer, trainable):
                # _add_variable_with_custom_getter may drop the shape; take it from outside, as TF does.
                del shape
                try:
                    return make_variable(
                        name, _shape, low_precision.storage_initializer(initializer, dtype), trainable, dtype
                    )
                except ValueError as e:
                    # The initializer is a pending checkpoint value when a restore ran before `build`;
                    # TensorFlow's shape error then names neither the table nor the variable.
                    raise ValueError(
                        f"Table {_table!r}: cannot create variable {name!r} with shape {tuple(_shape)}: {e}"
                    ) from e

            return getter

        def variable_creator(name, initializer, trainable=True, _shape=shape, dtype=tf.float32):
            # _add_variable_with_custom_getter makes each variable a checkpoint child named `name` and
            # restores a pending checkpoint value at creation (no double initialisation).
            return _tf_compat.add_tracked_variable(
                owner,
                name=name,
                initializer=initializer,
                shape=_shape,
                dtype=dtype,
                getter=make_getter(_shape),
                trainable=trainable,
            )

        # Not trainable: the tables are changed only by the fused send op, never by a generic optimizer
        # (the activations op has no gradient to them). The checkpoint keys do not depend on it.
        # 16-bit storage (te.TableConfig): the variables have the storage dtype (docs/low_precision.md).
        parameters = variable_creator(
            table.name, table.initializer, trainable=False, dtype=table_config.storage_dtype(table)
        )
        # Each slot's shape comes from the optimizer schema: the table's, or [vocabulary_size, 1] for a
        # per-row slot (row-wise Adagrad).
        slot_shapes = config_lib.slot_shapes(table.optimizer, table.vocabulary_size, table.dim)

        def slot_creator(name, initializer, _table=table, _creator=variable_creator, _shapes=slot_shapes, _shape=shape):
            return _creator(
                _table.name + "/" + name,
                initializer,
                False,
                _shapes.get(name, _shape),
                table_config.slot_storage_dtype(_table),
            )

        if table.optimizer is not None:
            # TF's own slot factory: honours slot_variable_creation_fn and the slot initializers.
            slots = _tf_compat.create_slots(table.optimizer, parameters, slot_creator)
            expected = _tf_compat.slot_names(table.optimizer)
            missing = [s for s in expected if s not in slots]
            if missing:
                raise ValueError(
                    f"slot_variable_creation_fn for table {table.name!r} returned slots {sorted(slots)}; "
                    f"missing {missing} (expected {expected})."
                )
        else:
            slots = {}
        slots["parameters"] = parameters
        variables[table.name] = slots
    return variables


def create_rounding_step(owner: Any, make_variable: MakeVariable) -> Any:
    """The int64 step that keys stochastic rounding's random bits, a checkpoint child `rounding_step` of `owner`
    (so a resumed run draws the bits it would have drawn without the interruption)."""
    return _tf_compat.add_tracked_variable(
        owner,
        name="rounding_step",
        initializer=tf.zeros_initializer(),
        shape=(),
        dtype=tf.int64,
        getter=lambda name, shape, dtype, initializer, trainable: make_variable(name, (), initializer, False, tf.int64),
        trainable=False,
    )


def tables_and_slots(variables: dict, tables: Sequence[Any]) -> tuple[list, list]:
    """`([table variable], [[slot variable]])` in table order, slots in Load/Retrieve order: the kernels' inputs."""
    table_vars = [variables[t.name]["parameters"] for t in tables]
    return table_vars, [list(per_table.values()) for per_table in slot_variables(variables, tables).values()]


def slot_variables(variables: dict, tables: Sequence[Any]) -> dict:
    """`{TableConfig: {slot name: variable}}`, slots in Load/Retrieve order (none without an optimizer)."""
    out = {}
    for table in tables:
        names = _tf_compat.slot_names(table.optimizer) if table.optimizer is not None else []
        out[table] = {name: variables[table.name][name] for name in names}
    return out
