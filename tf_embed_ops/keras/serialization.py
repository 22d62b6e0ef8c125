"""JSON-able configs for `tf.tpu.experimental.embedding` objects, for `keras` `get_config`/`from_config`.

`feature_config_to_dict` stores each distinct TableConfig once (shared tables stay shared after a round trip),
its optimizer's constructor arguments and its initializer; `feature_config_from_dict` rebuilds the same nest.

Example:
    >>> d = feature_config_to_dict({"a": tf.tpu.experimental.embedding.FeatureConfig(table=t)})
    >>> fc = feature_config_from_dict(json.loads(json.dumps(d)))
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from absl import logging

from tf_embed_ops import optimizers as _optimizers
from tf_embed_ops.dynamic import config as dynamic_config

__all__ = ["feature_config_from_dict", "feature_config_to_dict", "optimizer_from_dict", "optimizer_to_dict"]

_emb = tf.tpu.experimental.embedding
# Class names of tf_embed_ops.optimizers carry this prefix in a saved config (TF's five are bare names).
_CATALOGUE_PREFIX = "tf_embed_ops.optimizers."

_COMMON_OPTIMIZER_ARGS = (
    "learning_rate",
    "use_gradient_accumulation",
    "clip_weight_min",
    "clip_weight_max",
    "weight_decay_factor",
    "multiply_weight_decay_factor_by_learning_rate",
    "low_dimensional_packing_status",
)
_OPTIMIZER_ARGS = {
    "SGD": (),
    "Adagrad": ("initial_accumulator_value",),
    "AdagradMomentum": ("momentum", "use_nesterov", "exponent", "beta2", "epsilon"),
    "FTRL": (
        "initial_accumulator_value",
        "learning_rate_power",
        "l1_regularization_strength",
        "l2_regularization_strength",
        "beta",
        "multiply_linear_by_learning_rate",
        "allow_zero_accumulator",
    ),
    "Adam": ("beta_1", "beta_2", "epsilon", "lazy_adam", "sum_inside_sqrt"),
}
# TensorFlow's own (init_ops_v2) initializers, which TableConfig and the optimizers use by default.
_TF_INITIALIZERS = {
    cls.__name__: cls
    for cls in (
        tf.initializers.TruncatedNormal,
        tf.initializers.RandomNormal,
        tf.initializers.RandomUniform,
        tf.initializers.Constant,
        tf.initializers.Zeros,
        tf.initializers.Ones,
    )
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
    if not catalogue and (name not in _OPTIMIZER_ARGS or not isinstance(optimizer, getattr(_emb, name))):
        raise ValueError(
            f"Cannot serialise optimizer {optimizer!r}: not one of {sorted(_OPTIMIZER_ARGS)} nor a "
            "tf_embed_ops.optimizers class."
        )
    if optimizer.slot_variable_creation_fn is not None:
        raise ValueError(f"Cannot serialise {name} with a slot_variable_creation_fn (a Python callable).")
    args = {a: getattr(optimizer, a) for a in _COMMON_OPTIMIZER_ARGS}
    if catalogue:
        args.update(optimizer.specific_arguments())
        name = _CATALOGUE_PREFIX + name
    else:
        args.update({a: getattr(optimizer, a) for a in _OPTIMIZER_ARGS[name]})
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


def _initializer_to_dict(init: Any, table_name: str) -> dict | None:
    cls = type(init).__name__
    if cls in _TF_INITIALIZERS and isinstance(init, _TF_INITIALIZERS[cls]):
        return {"tf": cls, "config": init.get_config()}
    if isinstance(init, keras.initializers.Initializer):
        return {"keras": keras.saving.serialize_keras_object(init)}
    # The values are saved with the weights; the initializer only matters for a fresh layer built from config.
    logging.warning(
        "Table %s: initializer %r is not serialisable; a layer rebuilt from this config uses the default "
        "TruncatedNormal(0, 1/sqrt(dim)) before its weights are loaded.",
        table_name,
        init,
    )
    return None


def _initializer_from_dict(d: dict | None) -> Any:
    if d is None:
        return None
    if "tf" in d:
        return _TF_INITIALIZERS[d["tf"]](**d["config"])
    return keras.saving.deserialize_keras_object(d["keras"])


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
    table_dicts = []
    for t in tables:
        if not isinstance(t.combiner, str):
            raise ValueError(f"Cannot serialise table {t.name!r}: combiner {t.combiner!r} is not a string.")
        table_dicts.append(
            {
                "vocabulary_size": t.vocabulary_size,
                "dim": t.dim,
                "name": t.name,
                "combiner": t.combiner,
                "initializer": _initializer_to_dict(t.initializer, t.name),
                "optimizer": optimizer_to_dict(t.optimizer),
                "dynamic": dynamic_config.to_config_dict(t) if dynamic_config.is_dynamic(t) else None,
                "quantization_config": None
                if t.quantization_config is None
                else {
                    "num_buckets": t.quantization_config.num_buckets,
                    "lower": t.quantization_config.lower,
                    "upper": t.quantization_config.upper,
                },
            }
        )
    structure = tf.nest.map_structure(lambda _: None, feature_config)
    return {"tables": table_dicts, "features": leaves, "structure": _structure_to_json(structure)}


def feature_config_from_dict(d: dict) -> Any:
    """Inverse of `feature_config_to_dict`: the same nest, tables shared as before."""
    tables = []
    for t in d["tables"]:
        q = t.get("quantization_config")
        if t.get("dynamic") is not None:  # a te.DynamicTableConfig (docs/dynamic_tables.md)
            tables.append(
                dynamic_config.from_config_dict(
                    t["dynamic"],
                    name=t["name"],
                    dim=t["dim"],
                    optimizer=optimizer_from_dict(t["optimizer"]),
                    combiner=t["combiner"],
                    initializer=_initializer_from_dict(t["initializer"]),
                )
            )
            continue
        tables.append(
            _emb.TableConfig(
                vocabulary_size=t["vocabulary_size"],
                dim=t["dim"],
                initializer=_initializer_from_dict(t["initializer"]),
                optimizer=optimizer_from_dict(t["optimizer"]),
                combiner=t["combiner"],
                name=t["name"],
                quantization_config=None if q is None else _emb.QuantizationConfig(**q),
            )
        )
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
