"""Every use of TensorFlow internals in tf_embed_ops, in one place.

tf_embed_ops replicates TensorFlow classes (the TPU embedding mid-level API, its optimizers, its checkpoint
layout), and part of what that takes has no public API. Nothing else in the package reaches into TensorFlow's
private modules or members: it imports them from here. Each entry says why it is needed; all were checked
against TensorFlow 2.16 to 2.21 (the supported minors, configure.SUPPORTED_TF_MINORS). A TensorFlow upgrade starts
here: an internal that moved fails at import of this module, with the name of the entry, instead of deep inside
a training step. Where TensorFlow or Keras differ between the supported minors, the difference is held here too,
and a feature an older minor cannot run is refused here (`require_tensorflow`) with the version it needs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf

# The TPU embedding protos. TensorFlow ships the generated modules but exports no `tf.*` name for them; the
# serialized `TPUEmbeddingConfiguration` is the `config` attr of our ops, as of TensorFlow's TPU ops.
# (TF 2.0 - 2.21: tensorflow/core/protobuf/tpu/.)
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2, tpu_embedding_configuration_pb2

# The SparseCore (TPUEmbeddingV2) layout proto; with tpu_embedding_v3(_utils) below: TensorFlow's table stacker and
# checkpoint key, which our TPUEmbeddingV2 runs as is so its checkpoints are TensorFlow's, bit for bit.
# (TF 2.17 - 2.21: tensorflow/core/tpu/kernels/, tensorflow/python/tpu/tpu_embedding_v3.py, tpu_embedding_v3_utils.py.)
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2

# AutoGraph's conversion rules: which modules a `tf.function` converts when it reaches their functions. TensorFlow's
# and Keras' own modules are listed as not converted, so their TPU embedding classes run in a `tf.function` as
# written; ours were converted function by function instead (the first trace of a TPUEmbeddingV2 step converted
# about 130 of them, some 6 s), and ran through AutoGraph's rewrites of Python control flow, which TensorFlow's
# classes never see. `exclude_from_autograph` lists the package beside TensorFlow's. (TF 2.0 - 2.21:
# tensorflow/python/autograph/core/config.py; `tf.autograph.experimental.do_not_convert` is the public form, one
# function at a time, and it also stops the conversion of the user functions those functions call.)
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.autograph.core import config_lib as autograph_config_lib

# `tf.train.Checkpoint`'s restore (`TrackableSaver.restore`) reads the checkpoint's object graph, the last tensor of its
# data file, before it restores any object: on a truncated data file TensorFlow's reader raises IndexError ("Read less
# bytes than requested"), an error type TensorFlow documents nowhere, naming no file. `on_unreadable_checkpoint` lets
# the package turn it into the documented DataLossError naming the file and the tables
# (tf_embed_ops/dynamic/checkpoint_check.py). (TF 2.9 - 2.21: tensorflow/python/checkpoint/checkpoint.py.)
from tensorflow.python.checkpoint import checkpoint as checkpoint_lib

# The restore's walk over a checkpoint's object graph: TensorFlow 2.17 added the `Trackable._checkpoint_adapter(path)`
# hook to it (called when a restore reaches an object, before any child of it is restored), through which our
# embeddings and tables check a whole restore before any table is written; `checkpoint_adapter_hook` adds the same
# call to 2.16's walk. (TF 2.16 - 2.21: tensorflow/python/checkpoint/restore.py.)
from tensorflow.python.checkpoint import restore as restore_lib

# Initializer classes TensorFlow's `TableConfig` and TPU optimizers use by default (`init_ops_v2.Constant`
# with `support_partition=True`, which sharded slots need). (TF 2.0 - 2.21.)
from tensorflow.python.ops import init_ops_v2

# A variable that has a shape and a dtype but no value yet: a tiered table's serving form in a SavedModel is such a
# variable, so the serving function can be traced and saved without the (larger-than-memory) table in memory; its
# rows are then written into the SavedModel's checkpoint chunk by chunk (tf_embed_ops/serving/streamed.py), and
# the loader restores it as any variable. (TF 2.3 - 2.21; `tf.Variable` needs an initial value.)
from tensorflow.python.ops.resource_variable_ops import UninitializedVariable

# Rewrites a SavedModel's `fingerprint.pb` from its files: after its checkpoint was completed chunk by chunk, the
# fingerprint's checkpoint hash must be the final index's. (TF 2.12 - 2.21.)
from tensorflow.python.saved_model.fingerprinting_utils import write_fingerprint as write_saved_model_fingerprint

# A registered checkpoint saver: a tiered table (tf_embed_ops/tiered/checkpoint.py) streams its rows into the
# checkpoint chunk by chunk (one SaveV2 per chunk, merged by TensorFlow into the checkpoint) instead of handing
# TensorFlow one tensor of the whole, larger-than-memory table; its restore function reads them back the same way.
# Exported only to TensorFlow's own packages ("evolving"). (TF 2.10 - 2.21.)
from tensorflow.python.saved_model.registration import register_checkpoint_saver

# tpu_embedding_v2_utils: our optimizers subclass TensorFlow's TPU optimizer base class so that
# `tf.tpu.experimental.embedding.TableConfig` accepts them (it checks `isinstance(optimizer, _Optimizer)`) and they
# create slots as TensorFlow's do (TF 2.4 - 2.21). tpu_embedding_v3(_utils): the SparseCore layout, above.
from tensorflow.python.tpu import tpu_embedding_v2_utils, tpu_embedding_v3, tpu_embedding_v3_utils

# Checkpoint hooks of a custom trackable (`Trackable`, `SaveType`, `VARIABLE_VALUE_KEY`), for the stacked SparseCore
# slots, which are saved as one tensor per stack though we hold one variable per table. (TF 2.11 - 2.21.)
from tensorflow.python.trackable import base as trackable_base

# How a checkpoint key escapes an object's local name ("/" -> ".S"): a tiered table restored from the checkpoint of
# an in-memory table finds its slots' keys (`<table>/<slot>` children) beside the table's. (TF 2.5 - 2.21.)
from tensorflow.python.trackable.trackable_utils import escape_local_name

# A checkpoint tensor produced only when the checkpoint writes it (`SaveSpec(callable, ...)`): the collective mode's
# stand-ins gather a sharded table from every worker at save time, and a restore (which asks for the tensors'
# dtypes, never their values) runs no collective. (TF 2.0 - 2.21.)
from tensorflow.python.training.saving.saveable_object import SaveSpec

# Structure helpers TensorFlow's TPUEmbedding uses to match `output_shapes` and name features by path; the public
# `tf.nest` has neither `flatten_up_to` nor joined-string paths. (TF 2.0 - 2.21.)
from tensorflow.python.util import nest

__all__ = [
    "ADDED_IN",
    "TENSORFLOW_MINOR",
    "AutoTrackable",
    "CheckpointInitialValueCallable",
    "OptimizerBase",
    "ShardedVariable",
    "UninitializedVariable",
    "add_tracked_variable",
    "checkpoint_adapter_hook",
    "create_slots",
    "escape_local_name",
    "exclude_from_autograph",
    "init_ops_v2",
    "keras_learning_rate_as_given",
    "missing_api",
    "nest",
    "on_unreadable_checkpoint",
    "optimization_parameters_pb2",
    "rebind_keras_variable",
    "register_checkpoint_saver",
    "slot_initializers",
    "slot_names",
    "table_config_dtype_kwargs",
    "sparse_core_layout_pb2",
    "stack_sparse_core_tables",
    "clone_feature_config",
    "REFERENCE_ADDED_IN",
    "SaveSpec",
    "require_reference",
    "require_tensorflow",
    "TensorFlowVersionError",
    "tpu_embedding_v3_utils",
    "trackable_base",
    "tpu_embedding_configuration_pb2",
    "track_child",
    "write_saved_model_fingerprint",
    "yield_flat_paths",
    "zero_depending_on",
]

# (major, minor) of the running TensorFlow, for the version differences below.
TENSORFLOW_MINOR: tuple[int, int] = tuple(int(n) for n in re.match(r"(\d+)\.(\d+)", tf.__version__).groups())


class TensorFlowVersionError(NotImplementedError):
    """A feature needs a newer TensorFlow minor than the installed one."""


def require_tensorflow(minimum: tuple[int, int], feature: str) -> None:
    """Raises TensorFlowVersionError, naming `feature` and the minor it needs, under an older TensorFlow."""
    if TENSORFLOW_MINOR < minimum:
        raise TensorFlowVersionError(
            f"{feature} needs TensorFlow {minimum[0]}.{minimum[1]} or newer; TensorFlow {tf.__version__} is installed"
        )


# `TableConfig(dtype=...)`, the table's value dtype, came with TensorFlow 2.20; 2.16's to 2.19's tables are float32
# only and their TableConfig has no `dtype` attribute, which our code reads from every table (TensorFlow's own too).
_TABLE_CONFIG_DTYPE = (2, 20)
if TENSORFLOW_MINOR < _TABLE_CONFIG_DTYPE:
    tf.tpu.experimental.embedding.TableConfig.dtype = tf.float32


# TPUEmbeddingForServing's public `variables` (tables and slots, keyed by table name then by slot name) came with
# TensorFlow 2.21; before, the same dict is its `_variables`, which this property returns, so the serving class reads
# the same on every supported minor (tests compare our tables with TensorFlow's through it).
_serving_class = tf.tpu.experimental.embedding.TPUEmbeddingForServing
if not hasattr(_serving_class, "variables"):

    def _serving_variables(self: Any) -> dict:
        self._maybe_build()
        return self._variables

    _serving_class.variables = property(_serving_variables)


def table_config_dtype_kwargs(dtype: Any) -> dict:
    """The `dtype` keyword for TensorFlow's `TableConfig.__init__`: none before 2.20, where only float32 exists
    (another dtype is refused there, naming the minor it needs)."""
    if TENSORFLOW_MINOR >= _TABLE_CONFIG_DTYPE:
        return {"dtype": dtype}
    if tf.as_dtype(dtype) != tf.float32:
        require_tensorflow(_TABLE_CONFIG_DTYPE, f"TableConfig(dtype={tf.as_dtype(dtype).name})")
    return {}


def zero_depending_on(value: tf.Tensor) -> tf.Tensor:
    """An exact float32 zero of `value`'s shape that depends on `value` by data, and that Grappler cannot fold.

    The Keras trigger's gradient (update_trigger.py) is such a zero computed from a value read after the table
    update, so that the update is a data dependency of what Keras applies. TensorFlow 2.16's Grappler folds
    `multiply_no_nan(value, 0)` into a constant (constant folding), after which the dependency optimizer drops the
    update from Keras' compiled train step: fit then trained no table, silently (2.21's keeps it). A
    comparison of `value` with itself is data no minor's Grappler folds: `value != value` and `value == value` are
    never both true (NaN or not), so the result is 0 for every value, inf and NaN included.
    """
    value = tf.convert_to_tensor(value)
    return tf.cast(tf.math.logical_and(tf.math.not_equal(value, value), tf.math.equal(value, value)), tf.float32)


# TensorFlow names our features (and their tests) use that older supported minors lack, with the minor that added
# them: code reaching one on an older minor fails with AttributeError (a public name) or ImportError (a module),
# which `missing_api` recognises.
ADDED_IN: dict[str, tuple[int, int]] = {
    "SparseCoreEmbeddingConfig": (2, 17),  # tf.tpu.experimental.embedding: TPUEmbeddingV2's SparseCore options
    # tensorflow.python.tpu: TensorFlow's SparseCore checkpoint resharding, which TPUEmbeddingV2's tests compare with
    "tpu_embedding_v3_checkpoint_adapter": (2, 17),
    # OptimizationParameters' field (protobuf's AttributeError is the bare field name): the optimizer's proto
    "frequency_aware_adagrad": (2, 19),
}


def missing_api(error: BaseException) -> str | None:
    """For an AttributeError or ImportError naming a TensorFlow API the running minor does not have yet (ADDED_IN),
    the reason to give (which name, which minor it needs); None for any other error."""
    if not isinstance(error, (AttributeError, ImportError)):
        return None
    for name, minimum in ADDED_IN.items():
        if (f"'{name}'" in str(error) or str(error) == name) and TENSORFLOW_MINOR < minimum:
            return (
                f"{name} needs TensorFlow {minimum[0]}.{minimum[1]} or newer; TensorFlow {tf.__version__} is installed"
            )
    return None


# Behaviours of TensorFlow's own classes that tests compare ours with, and that came with a later minor. Our classes
# have them on every supported minor; a test whose reference needs one calls `require_reference(name)` first, and is
# reported as skipped (tests/conftest.py) on an older minor, with the minor named.
REFERENCE_ADDED_IN: dict[str, tuple[int, int]] = {
    # Before, TPUEmbeddingForServing looks up only the whole feature nest (nest's "don't have the same nested
    # structure" for a part of it), so it cannot be the reference of a lookup of some of the features.
    "TensorFlow's TPUEmbeddingForServing lookup of a subset of the features": (2, 21),
    # tpu_embedding_v3_checkpoint_adapter's `_shard_from_cpu_to_sc` / `_unshard_from_sc_to_cpu`: TensorFlow's own
    # resharding of a table into and out of its SparseCore stack, which TPUEmbeddingV2's checkpoint tests compare with.
    "TensorFlow's SparseCore checkpoint resharding": (2, 19),
}


def require_reference(name: str) -> None:
    """Raises TensorFlowVersionError when the running TensorFlow lacks the reference behaviour `name`
    (REFERENCE_ADDED_IN), naming the minor that has it."""
    require_tensorflow(REFERENCE_ADDED_IN[name], name)


# The base of TensorFlow's own TPUEmbedding classes: attribute tracking for checkpoints and SavedModel, without
# Keras. (`tf.__internal__` is TensorFlow's name for "public to TensorFlow's own packages"; TF 2.5 - 2.21.)
AutoTrackable = tf.__internal__.tracking.AutoTrackable

# Row-sharded tables: a checkpoint of a ShardedVariable saves its shards as slices of one tensor under one key,
# which is how TPU tables are saved; that is what lets a checkpoint move between shard counts. (TF 2.5 - 2.21.)
ShardedVariable = tf.__internal__.distribute.ShardedVariable

# Feature paths in nest.flatten order, joined as TensorFlow's TPU classes report them in errors. (TF 2.5 - 2.21.)
yield_flat_paths = tf.__internal__.nest.yield_flat_paths

# See the import above.
OptimizerBase = tpu_embedding_v2_utils._Optimizer

# A restore that ran before the variables were built hands their creator this initializer; a 16-bit table casts
# its value instead of losing it (tf_embed_ops/low_precision.py). (`tf.__internal__`, TF 2.5 - 2.21.)
CheckpointInitialValueCallable = tf.__internal__.tracking.CheckpointInitialValueCallable


# The package's examples are user code shipped with it: AutoGraph converts them as it converts a user's program.
_AUTOGRAPH_RULES = (
    autograph_config_lib.Convert("tf_embed_ops.examples"),
    autograph_config_lib.DoNotConvert("tf_embed_ops"),
)


def exclude_from_autograph() -> None:
    """Makes AutoGraph treat the package's modules as TensorFlow's own: called, not converted (idempotent).

    A user's functions that our code calls are then called as written too, as TensorFlow's TPU embedding classes
    call them; a user's `tf.function` itself is converted as before.
    """
    rules = autograph_config.CONVERSION_RULES
    if not any(isinstance(r, type(_AUTOGRAPH_RULES[1])) and r._prefix == "tf_embed_ops" for r in rules):
        autograph_config.CONVERSION_RULES = (*rules, *_AUTOGRAPH_RULES)


exclude_from_autograph()


def slot_names(optimizer: Any) -> list[str]:
    """The optimizer's slot names in TPU Load/Retrieve order (TensorFlow's private `_slot_names`, TF 2.4 - 2.21)."""
    return list(optimizer._slot_names())


def slot_initializers(optimizer: Any) -> list[Any]:
    """The slots' initializers, same order (TensorFlow's private `_slot_initializers`, TF 2.4 - 2.21)."""
    return list(optimizer._slot_initializers())


def create_slots(optimizer: Any, table: Any, slot_creator: Any) -> dict:
    """Creates the slots through TensorFlow's own factory, which honours `slot_variable_creation_fn` and the slot
    initializers (the private `_create_slots`, TF 2.4 - 2.21)."""
    return dict(optimizer._create_slots(table, slot_creator))


def add_tracked_variable(trackable: Any, **kwargs: Any) -> Any:
    """Creates a variable as a named checkpoint child of `trackable`, restoring a pending checkpoint value at
    creation: how TensorFlow's CPU TPUEmbedding classes create their tables, so our checkpoint keys are theirs
    (Trackable's protected `_add_variable_with_custom_getter`, TF 2.0 - 2.21)."""
    return trackable._add_variable_with_custom_getter(**kwargs)


def track_child(trackable: Any, child: Any, name: str, overwrite: bool = False) -> Any:
    """Makes `child` a named checkpoint child of `trackable` (Trackable's protected `_track_trackable`,
    TF 2.0 - 2.21); `overwrite` replaces the child of that name (the collective mode's checkpoint stand-ins)."""
    return trackable._track_trackable(child, name=name, overwrite=overwrite)


def rebind_keras_variable(variable: Any, backing: tf.Variable) -> None:
    """Makes the `keras.Variable` `variable` hold `backing` (a tf.Variable of any shape, which it then reports):
    Keras 3's TensorFlow backend keeps the tf.Variable in `_value` and the shape in `_shape`, with no public way to
    replace either. The collective mode swaps a layer's full tables for this worker's shards, and back."""
    variable._value = backing
    variable._shape = tuple(backing.shape)


# TensorFlow 2.16's TPUEmbeddingV2 has the two functions below as methods of its class, reading the layer's own
# state; 2.17 made them module functions, which is what lets our TPUEmbeddingV2 run TensorFlow's stacker on its own.
_SPARSE_CORE_STACKING = (2, 17)


def clone_feature_config(feature_config: Any) -> Any:
    """A copy of a feature nest whose tables are copies too, as TPUEmbeddingV2 makes one before stacking mutates
    it (the private `tpu_embedding_v3._clone_feature_config`, TF 2.17 - 2.21; refused on 2.16)."""
    require_tensorflow(_SPARSE_CORE_STACKING, "TPUEmbeddingV2 and the SparseCore layouts (TensorFlow's table stacker)")
    return tpu_embedding_v3._clone_feature_config(feature_config)


def stack_sparse_core_tables(*args: Any) -> Any:
    """TensorFlow's SparseCore table stacker: which tables share a stack and each one's row layout (the private
    `tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer`, TF 2.17 - 2.21; refused on 2.16)."""
    require_tensorflow(_SPARSE_CORE_STACKING, "TPUEmbeddingV2 and the SparseCore layouts (TensorFlow's table stacker)")
    return tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(*args)


def keras_learning_rate_as_given(optimizer: Any) -> Any:
    """A Keras 3 optimizer's learning rate as the user gave it: the schedule or callable itself, where the public
    `learning_rate` property evaluates it at the current step (Keras' private `_learning_rate`, Keras 3.0 - 3.15).
    Table optimizers evaluate it on their own step instead."""
    return optimizer._learning_rate


_UNREADABLE_HANDLERS: list[Callable[[str, Any, Exception], None]] = []


def on_unreadable_checkpoint(handler: Callable[[str, Any, Exception], None]) -> None:
    """Calls `handler(save_path, root, error)` when `tf.train.Checkpoint`'s restore fails with TensorFlow's reader's
    IndexError (see the import of `checkpoint_lib`); the handler raises its own error, or returns to let the
    IndexError go on. Idempotent. Only that IndexError is caught: every other outcome is TensorFlow's."""
    if handler not in _UNREADABLE_HANDLERS:
        _UNREADABLE_HANDLERS.append(handler)
    saver = checkpoint_lib.TrackableSaver
    if getattr(saver.restore, "tf_embed_ops_wrapped", False):
        return
    original = saver.restore

    @functools.wraps(original)
    def restore(self: Any, save_path: Any, options: Any = None) -> Any:
        try:
            return original(self, save_path, options)
        except IndexError as error:
            root = self._graph_view.root
            for h in list(_UNREADABLE_HANDLERS):
                h(save_path, root, error)
            raise

    restore.tf_embed_ops_wrapped = True
    saver.restore = restore


# `Trackable._checkpoint_adapter(path)`, TensorFlow's hook before a restore reaches an object's children, came with
# TensorFlow 2.17 (`restore._maybe_get_adapter`). On 2.16 the restore's walk (`_queue_children_for_restoration`)
# gets the same call, at the same place and from a frame with the same local (`checkpoint_position`, which
# `dynamic.checkpoint_check.calling_position` reads), so a refused restore changes no table on every supported minor.
# Only objects that define the hook are called (2.16's Trackable has none); what it returns is ignored, as ours
# return None (no resharding, which 2.16 cannot do).
def checkpoint_adapter_hook() -> None:
    """Makes TensorFlow 2.16's restore call `_checkpoint_adapter` as 2.17 and later do (idempotent; nothing to do
    on 2.17 and later)."""
    if hasattr(restore_lib, "_maybe_get_adapter") or getattr(
        restore_lib._queue_children_for_restoration, "tf_embed_ops_wrapped", False
    ):
        return
    original = restore_lib._queue_children_for_restoration

    @functools.wraps(original)
    def queue_children(checkpoint_position: Any, visit_queue: Any) -> Any:
        hook = getattr(checkpoint_position.trackable, "_checkpoint_adapter", None)
        if hook is not None:
            hook(checkpoint_position.checkpoint.save_path_string)
        return original(checkpoint_position, visit_queue)

    queue_children.tf_embed_ops_wrapped = True
    restore_lib._queue_children_for_restoration = queue_children


checkpoint_adapter_hook()


def trackable_children(obj: Any, save_type: str | None = None) -> dict:
    """`obj`'s tracked children by name: TensorFlow's private `Trackable._trackable_children` (there is no public
    listing; `save_type="savedmodel"` lists what a SavedModel tracks, a superset of the checkpoint's)."""
    if save_type is None:
        return dict(obj._trackable_children())
    return dict(obj._trackable_children(save_type=save_type))


def checkpoint_descendants(root: Any) -> tuple[list, dict]:
    """(every object a checkpoint of `root` reaches, their paths): `TrackableView`'s private
    `_descendants_with_paths` (the public `descendants()` gives no paths)."""
    return tf.train.TrackableView(root)._descendants_with_paths()


def flatten_layers(model: Any) -> list | None:
    """Every layer inside `model` at any depth, `model` included, as Keras' own weight tracking walks them
    (Keras' private `_flatten_layers`: it has no public recursive walk); None for an object without it."""
    if not hasattr(model, "_flatten_layers"):
        return None
    return list(model._flatten_layers(include_self=True))
