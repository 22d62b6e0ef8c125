"""JSON-able configs for `tf.tpu.experimental.embedding` objects, for `keras` `get_config`/`from_config`.

`feature_config_to_dict` stores each distinct TableConfig once (shared tables stay shared after a round trip)
with its class (TensorFlow's `TableConfig`, `te.TableConfig`, `te.DynamicTableConfig`) and every constructor
argument of that class: the optimizer's arguments (named by the optimizer schema), the initializer (TensorFlow's
or Keras'), and the other options (`storage_dtype`, `rounding`, `dtype`, `layout`, ...) read from the attribute of
the same name, so a new option is saved or refused by name, never dropped; `feature_config_from_dict` rebuilds the
same nest.

Example:
    >>> d = feature_config_to_dict({"a": tf.tpu.experimental.embedding.FeatureConfig(table=t)})
    >>> fc = feature_config_from_dict(json.loads(json.dumps(d)))
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from google.protobuf import message as _message
from google.protobuf import symbol_database

from tf_embed_ops import _optimizer_schema, _tf_compat
from tf_embed_ops import optimizers as _optimizers
from tf_embed_ops import table_config as _table_config
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.tiered import config as tiered_config

__all__ = [
    "feature_config_from_dict",
    "feature_config_to_dict",
    "optimizer_from_dict",
    "optimizer_to_dict",
    "table_from_dict",
    "tiered_storage",
    "table_options",
    "table_to_dict",
]

_emb = tf.tpu.experimental.embedding
# Class names of tf_embed_ops.optimizers carry this prefix in a saved config (TF's five are bare names).
_CATALOGUE_PREFIX = "tf_embed_ops.optimizers."

# Every optimizer's schema entry by class name: TensorFlow's five and the classes tf_embed_ops.optimizers generates
# from the others. It names the constructor arguments each class adds to the base ones.
_OPTIMIZER_SCHEMAS = {s.python_class: s for s in _optimizer_schema.schemas()}
_TF_OPTIMIZER_SCHEMAS = {k: s for k, s in _OPTIMIZER_SCHEMAS.items() if s.origin == "tensorflow"}
# The base arguments every optimizer takes (TensorFlow's base class); slot_variable_creation_fn (a callable) is
# refused and clipvalue is stored from clip_gradient_min/max, so neither is read as an attribute.
_BASE_OPTIMIZER_ARGS = tuple(
    p
    for p in inspect.signature(_tf_compat.OptimizerBase.__init__).parameters
    if p not in ("self", "slot_variable_creation_fn", "clipvalue")
)


def _schema_arguments(schema: _optimizer_schema.OptimizerSchema) -> tuple[str, ...]:
    """The class-specific constructor arguments of an optimizer: its hyper-parameters and slot initial values."""
    return tuple(h.python_name for h in schema.hyper_parameters) + tuple(
        s.python_name for s in schema.slots if s.python_name is not None
    )


# TensorFlow's own (init_ops_v2) initializers, which TableConfig, the optimizers and `tf.constant_initializer`,
# `tf.random_uniform_initializer`, ... return (`tf.initializers.*` are Keras' classes, saved as Keras objects).
_TF_INITIALIZERS = {
    cls.__name__: cls
    for cls in vars(_tf_compat.init_ops_v2).values()
    if isinstance(cls, type)
    and issubclass(cls, _tf_compat.init_ops_v2.Initializer)
    and cls is not _tf_compat.init_ops_v2.Initializer
}


def _serialize_callable(value: Any, what: str) -> Any:
    # A 0-argument learning-rate callable survives a round trip only as a registered keras-serializable object
    # (a class with get_config); a lambda or closure does not.
    if callable(getattr(value, "get_config", None)) and not isinstance(value, type):
        try:
            return {"keras": keras.saving.serialize_keras_object(value)}
        except Exception as e:  # re-raised with the argument's name
            raise ValueError(f"{what} {value!r} cannot be serialised: {e}") from e
    raise ValueError(
        f"{what} {value!r} cannot be serialised: use a float, or a 0-argument callable class registered with "
        "keras.saving.register_keras_serializable (or rebuild the layer from code instead of from its config)."
    )


def optimizer_to_dict(optimizer: Any) -> dict | None:
    """The constructor arguments of a `tf.tpu.experimental.embedding` optimizer (None stays None).

    Raises:
      ValueError: for an unsupported optimizer class, a `slot_variable_creation_fn`, or a learning-rate
        callable that is not a registered keras-serializable object.
    """
    if optimizer is None:
        return None
    name = type(optimizer).__name__
    catalogue = type(optimizer) in _optimizers.CATALOGUE.values()
    if not catalogue and (name not in _TF_OPTIMIZER_SCHEMAS or not isinstance(optimizer, getattr(_emb, name))):
        raise ValueError(
            f"Cannot serialise optimizer {optimizer!r}: not one of {sorted(_TF_OPTIMIZER_SCHEMAS)} nor a "
            "tf_embed_ops.optimizers class."
        )
    if optimizer.slot_variable_creation_fn is not None:
        raise ValueError(f"Cannot serialise {name} with a slot_variable_creation_fn (a Python callable).")
    schema = _OPTIMIZER_SCHEMAS[name]
    args = {a: getattr(optimizer, a) for a in _BASE_OPTIMIZER_ARGS + _schema_arguments(schema)}
    if catalogue:
        name = _CATALOGUE_PREFIX + name
    lr = args["learning_rate"]
    if callable(lr):
        args["learning_rate"] = _serialize_callable(lr, f"{name}.learning_rate")
    lo, hi = optimizer.clip_gradient_min, optimizer.clip_gradient_max
    args["clipvalue"] = None if lo is None and hi is None else [lo, hi]
    return {"class_name": name, "config": args}


def optimizer_from_dict(d: dict | None) -> Any:
    """Inverse of `optimizer_to_dict`."""
    if d is None:
        return None
    args = dict(d["config"])
    if isinstance(args.get("learning_rate"), dict):
        args["learning_rate"] = keras.saving.deserialize_keras_object(args["learning_rate"]["keras"])
    if args.get("clipvalue") is not None:
        args["clipvalue"] = tuple(args["clipvalue"])
    class_name = d["class_name"]
    if class_name.startswith(_CATALOGUE_PREFIX):
        return getattr(_optimizers, class_name[len(_CATALOGUE_PREFIX) :])(**args)
    return getattr(_emb, class_name)(**args)


def _jsonable(value: Any) -> Any:
    """`value` with numpy scalars/arrays as Python numbers/lists; raises TypeError if JSON cannot hold it."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    json.dumps(value)  # TypeError for anything else JSON cannot hold
    return value


def _initializer_to_dict(init: Any, table: Any) -> dict | None:
    cls = type(init).__name__
    try:
        if _TF_INITIALIZERS.get(cls) is type(init):
            return {"tf": cls, "config": _jsonable(init.get_config())}
        if isinstance(init, keras.initializers.Initializer):
            return {"keras": keras.saving.serialize_keras_object(init)}
        problem = "not a TensorFlow or Keras initializer object"
    except (TypeError, ValueError) as e:
        problem = str(e)
    if dynamic_config.is_dynamic(table):
        # A dynamic table creates rows for new keys after loading too: the initializer must come back.
        raise ValueError(f"DynamicTableConfig {table.name!r}: initializer {init!r} cannot be serialised: {problem}.")
    # The values are saved with the weights; the initializer only matters for a fresh layer built from config.
    logging.warning(
        "Table %s: initializer %r is not serialisable (%s); a layer rebuilt from this config uses the default "
        "TruncatedNormal(0, 1/sqrt(dim)) before its weights are loaded.",
        table.name,
        init,
        problem,
    )
    return None


def _initializer_from_dict(d: dict | None) -> Any:
    if d is None:
        return None
    if "tf" in d:
        return _TF_INITIALIZERS[d["tf"]](**d["config"])
    return keras.saving.deserialize_keras_object(d["keras"])


# The table classes a config can hold, by saved name. Every constructor argument of each is saved: the ones
# below by their own encoders, every other one (storage_dtype, rounding, dtype, layout, ...) by `_option_to_json`
# from the attribute of the same name, so a new option is serialised or refused at `get_config`, never dropped.
_TABLE_CLASSES = {
    "TableConfig": _emb.TableConfig,
    "tf_embed_ops.TableConfig": _table_config.TableConfig,
    "tf_embed_ops.DynamicTableConfig": dynamic_config.DynamicTableConfig,
}
_TABLE_FIELDS = ("vocabulary_size", "dim", "name", "combiner", "initializer", "optimizer", "quantization_config")


def table_options(cls: type) -> tuple[str, ...]:
    """The constructor arguments of table class `cls`, in signature order (what a saved config must keep)."""
    return tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self")


def _generic_options(table: Any) -> tuple[str, ...]:
    """The options of `table` saved by `_option_to_json`: every constructor argument that neither the common
    fields nor (for a dynamic table) `dynamic_config.to_config_dict` save."""
    own = set(_TABLE_FIELDS)
    if dynamic_config.is_dynamic(table):
        own |= set(dynamic_config.to_config_dict(table))
    return tuple(p for p in table_options(type(table)) if p not in own)


def _option_to_json(table: Any, option: str) -> Any:
    value = getattr(table, option)
    if isinstance(value, tf.DType):
        return {"dtype": value.name}
    if isinstance(value, _message.Message):
        return {"proto": value.DESCRIPTOR.full_name, "bytes": base64.b64encode(value.SerializeToString()).decode()}
    if isinstance(value, tiered_config.Tiered):
        return {"tiered": value.get_config()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(
        f"Cannot serialise table {table.name!r}: option {option}={value!r} has no JSON form (a dtype, a proto "
        "message, te.Tiered, a number, a string or None)."
    )


def _option_from_json(value: Any) -> Any:
    if isinstance(value, dict) and "dtype" in value:
        return tf.as_dtype(value["dtype"])
    if isinstance(value, dict) and "proto" in value:
        cls = symbol_database.Default().GetSymbol(value["proto"])
        return cls.FromString(base64.b64decode(value["bytes"]))
    if isinstance(value, dict) and "tiered" in value:
        return tiered_config.Tiered.from_config(value["tiered"])
    return value


# The storage replacements of the active `tiered_storage` contexts, innermost last.
_STORAGE_OVERRIDES: list = []


@contextlib.contextmanager
def tiered_storage(storage: Any) -> Iterator[None]:
    """Inside this context, tiered tables rebuilt from a saved config (`keras.models.load_model`, `from_config`)
    take another `te.Tiered` than the one saved, e.g. a new directory for the loaded copy's row files (the saved
    `mode="create"` refuses the row file the saved model may still be using).

    Args:
      storage: a `te.Tiered` (every tiered table), `{table name: te.Tiered}` (the tables named; the others keep
        theirs), or a callable `(table name, saved te.Tiered) -> te.Tiered`.

    Raises:
      ValueError: (when a table is rebuilt) the replacement is not a `te.Tiered`, naming the table.

    Example:
        >>> with te.keras.tiered_storage(lambda name, saved: te.Tiered(**{**saved.get_config(), "directory": d})):
        ...     model = keras.models.load_model(path)
    """
    _STORAGE_OVERRIDES.append(storage)
    try:
        yield
    finally:
        _STORAGE_OVERRIDES.pop()


def _loaded_storage(name: str, saved: Any) -> Any:
    """The storage a rebuilt table takes: the saved one, or the innermost `tiered_storage` replacement."""
    if not isinstance(saved, tiered_config.Tiered) or not _STORAGE_OVERRIDES:
        return saved
    override = _STORAGE_OVERRIDES[-1]
    if isinstance(override, dict):
        storage = override.get(name, saved)
    elif callable(override) and not isinstance(override, tiered_config.Tiered):
        storage = override(name, saved)
    else:
        storage = override
    if not isinstance(storage, tiered_config.Tiered):
        raise ValueError(
            f"te.keras.tiered_storage: table {name!r} was saved tiered; its replacement storage must be a te.Tiered, "
            f"got {storage!r}"
        )
    return storage


def _table_class_name(table: Any) -> str:
    for name, cls in _TABLE_CLASSES.items():
        if type(table) is cls:
            return name
    raise ValueError(
        f"Cannot serialise table {table.name!r} of class {type(table).__name__}: a saved config holds "
        f"tf.tpu.experimental.embedding.TableConfig, te.TableConfig or te.DynamicTableConfig tables."
    )


def table_to_dict(table: Any) -> dict:
    """A JSON-able description of one table config: every constructor argument of its class.

    Raises:
      ValueError: a table class, combiner, initializer (of a dynamic table), optimizer or option without a JSON
        form, naming the table.
    """
    class_name = _table_class_name(table)
    if not isinstance(table.combiner, str):
        raise ValueError(f"Cannot serialise table {table.name!r}: combiner {table.combiner!r} is not a string.")
    q = table.quantization_config
    return {
        "class": class_name,
        "vocabulary_size": table.vocabulary_size,
        "dim": table.dim,
        "name": table.name,
        "combiner": table.combiner,
        "initializer": _initializer_to_dict(table.initializer, table),
        "optimizer": optimizer_to_dict(table.optimizer),
        "dynamic": dynamic_config.to_config_dict(table) if dynamic_config.is_dynamic(table) else None,
        "quantization_config": None
        if q is None
        else {"num_buckets": q.num_buckets, "lower": q.lower, "upper": q.upper},
        "options": {o: _option_to_json(table, o) for o in _generic_options(table)},
    }


def table_from_dict(t: dict) -> Any:
    """Inverse of `table_to_dict` (configs saved before it wrote "class" and "options" load as they were)."""
    class_name = t.get("class") or ("tf_embed_ops.DynamicTableConfig" if t.get("dynamic") else "TableConfig")
    if class_name not in _TABLE_CLASSES:
        raise ValueError(f"Table {t.get('name')!r}: unknown table class {class_name!r} in a saved config.")
    options = {k: _option_from_json(v) for k, v in (t.get("options") or {}).items()}
    if "storage" in options:
        options["storage"] = _loaded_storage(t["name"], options["storage"])
    initializer = _initializer_from_dict(t["initializer"])
    optimizer = optimizer_from_dict(t["optimizer"])
    if class_name == "tf_embed_ops.DynamicTableConfig":
        return dynamic_config.from_config_dict(
            t["dynamic"],
            name=t["name"],
            dim=t["dim"],
            optimizer=optimizer,
            combiner=t["combiner"],
            initializer=initializer,
            **options,
        )
    q = t.get("quantization_config")
    return _TABLE_CLASSES[class_name](
        vocabulary_size=t["vocabulary_size"],
        dim=t["dim"],
        initializer=initializer,
        optimizer=optimizer,
        combiner=t["combiner"],
        name=t["name"],
        quantization_config=None if q is None else _emb.QuantizationConfig(**q),
        **options,
    )


def feature_config_to_dict(feature_config: Any) -> dict:
    """A JSON-able description of a nest of FeatureConfigs (tables listed once, referenced by index)."""
    tables: list = []
    leaves = []
    for feature in tf.nest.flatten(feature_config):
        index = next((i for i, t in enumerate(tables) if t is feature.table), None)
        if index is None:
            tables.append(feature.table)
            index = len(tables) - 1
        leaves.append(
            {
                "table": index,
                "max_sequence_length": feature.max_sequence_length,
                "validate_weights_and_indices": feature.validate_weights_and_indices,
                "output_shape": feature.output_shape.as_list() if feature.output_shape.rank else None,
                "name": feature.name,
            }
        )
    structure = tf.nest.map_structure(lambda _: None, feature_config)
    return {
        "tables": [table_to_dict(t) for t in tables],
        "features": leaves,
        "structure": _structure_to_json(structure),
    }


def feature_config_from_dict(d: dict) -> Any:
    """Inverse of `feature_config_to_dict`: the same nest, tables shared as before."""
    tables = [table_from_dict(t) for t in d["tables"]]
    features = [
        _emb.FeatureConfig(
            table=tables[f["table"]],
            max_sequence_length=f["max_sequence_length"],
            validate_weights_and_indices=f["validate_weights_and_indices"],
            output_shape=f["output_shape"],
            name=f["name"],
        )
        for f in d["features"]
    ]
    return tf.nest.pack_sequence_as(_structure_from_json(d["structure"]), features)


def _structure_to_json(structure: Any) -> Any:
    """Dicts keep their (string) keys; lists and tuples are tagged so tuples come back as tuples."""
    if structure is None:
        return None
    if isinstance(structure, dict):
        for k in structure:
            if not isinstance(k, str):
                raise ValueError(f"feature_config dict keys must be strings to be serialised; got {k!r}.")
        return {"dict": {k: _structure_to_json(v) for k, v in structure.items()}}
    if isinstance(structure, (list, tuple)):
        return {"list" if isinstance(structure, list) else "tuple": [_structure_to_json(v) for v in structure]}
    raise ValueError(f"Unsupported feature_config container {type(structure).__name__}.")


def _structure_from_json(j: Any) -> Any:
    if j is None:
        return None
    if "dict" in j:
        return {k: _structure_from_json(v) for k, v in j["dict"].items()}
    if "list" in j:
        return [_structure_from_json(v) for v in j["list"]]
    return tuple(_structure_from_json(v) for v in j["tuple"])
