"""`fit` for Keras 3 models under `ParameterServerStrategy`: Keras' own `Model.fit` has no parameter-server path.

`fit(model, dataset_fn, epochs=..., steps_per_epoch=..., ...)` keeps Keras `fit`'s argument names and returns a
`keras.callbacks.History`.  The chief (this process) schedules the compiled model's own `train_step` on the
workers with a `ClusterCoordinator`; the model's loss, metrics and optimizer update the dense variables on the
parameter servers, and a `ShardedEmbeddingLayer`'s backward pass runs each table shard's fused update on the
server that owns it.  Callbacks (History, the progress bar, EarlyStopping, ...) run on the chief.

Semantics (docs/distributed.md, "Keras fit on a cluster"):
* asynchronous: each worker runs its steps one after another; workers run concurrently on the shared variables;
* metrics live on the parameter servers, so every worker's steps add to the same totals: an epoch's logs are the
  metrics over all steps of all workers;
* a step whose worker fails is rescheduled on another worker by the coordinator: at-least-once (a step that had
  already applied its updates before the failure is applied again);
* a lost parameter server stops `fit` with `TrainingInterruptedError`; run the job again with the same
  `checkpoint_manager` and it resumes after the last completed epoch.

Example:
    >>> with strategy.scope():
    ...   model = keras.Model(...)   # with a ShardedEmbeddingLayer
    ...   model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy", metrics=["auc"])
    >>> history = te.distribute.fit(model, dataset_fn, epochs=3, steps_per_epoch=100)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import tensorflow as tf

from tf_embed_ops.distribute.fit_callbacks import begin_training

if TYPE_CHECKING:  # keras is imported on the first call: `import tf_embed_ops.distribute` does not need it
    import keras

__all__ = ["TrainingInterruptedError", "fit"]

# What the coordinator raises when a parameter server (or the chief's connection to the cluster) is lost.  A lost
# worker raises nothing: the coordinator reschedules its steps on the other workers.
_LOST_TASK_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)


class TrainingInterruptedError(RuntimeError):
    """Training stopped because a parameter server was lost; restarting the job resumes from the last checkpoint."""


# Steps scheduled ahead of the progress bar: enough to keep every worker busy, few enough that the bar and the
# batch callbacks follow the steps that have really finished.
_STEPS_IN_FLIGHT_PER_WORKER = 4


def fit(
    model: keras.Model,
    dataset_fn: Callable,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    callbacks: list | None = None,
    validation_data: Callable | None = None,
    validation_steps: int | None = None,
    verbose: Any = "auto",
    initial_epoch: int = 0,
    *,
    checkpoint_manager: tf.train.CheckpointManager | None = None,
    coordinator: tf.distribute.coordinator.ClusterCoordinator | None = None,
    strategy: tf.distribute.Strategy | None = None,
    max_ids_per_worker: int | None = None,
    timeout_seconds: float = 300.0,
) -> keras.callbacks.History:
    """Trains a compiled Keras model on a ParameterServerStrategy cluster; Keras `fit`'s arguments and return.

    Under a `tf.distribute.MultiWorkerMirroredStrategy` (`strategy=`, or the model's), every worker calls `fit`
    and trains synchronously with its `te.keras.TPUEmbedding` tables sharded over the workers
    (docs/collective_training.md): `tf_embed_ops.distribute.collective.loop.fit`.

    Args:
      model: a Keras 3 model created and compiled inside `strategy.scope()` (so its variables, optimizer and
        metrics live on the parameter servers).
      dataset_fn: `dataset_fn(input_context) -> tf.data.Dataset` of `(x, y)` or `(x, y, sample_weight)` batches;
        called once on every worker (each reads its own copy: shuffle without a seed for different orders).
        It must yield at least `epochs * steps_per_epoch` batches per worker (use `.repeat()`).
      epochs: train until this epoch (as Keras: with `initial_epoch`, `epochs - initial_epoch` epochs run).
      steps_per_epoch: steps scheduled per epoch, over all workers together (required: per-worker datasets have
        no length the chief could read).
      callbacks: Keras callbacks, called on the chief.  Batch callbacks see a step's logs once it has finished
        (steps finish slightly out of order; at most a few steps per worker run ahead of them).
      validation_data: a dataset function like `dataset_fn`; evaluated after every epoch with the model's
        `test_step`, scheduled on the workers; its logs get the `val_` prefix.
      validation_steps: evaluation steps per epoch (required with `validation_data`).
      verbose: 0, 1 (progress bar), 2 (one line per epoch) or "auto" (1).
      initial_epoch: the epoch to start from (as Keras).
      checkpoint_manager: a `tf.train.CheckpointManager` whose checkpoint tracks the model (and its optimizer):
        saved after every epoch with the number of epochs completed.  If it already holds a checkpoint, that
        checkpoint is restored first and training continues after the epochs it had completed.
      coordinator: the `ClusterCoordinator` to schedule with (default: the one of the model's strategy).
      strategy: the model's strategy (default: `model.distribute_strategy`).
      max_ids_per_worker: collective mode only: the fixed capacity of an all-to-all (ids one worker sends another
        for one table in a step); None: each step's largest count. A step that needs more stops with an error.
      timeout_seconds: collective mode only: how long a collective waits for the other workers before the job
        stops with `WorkerLostError`.

    Returns:
      The `keras.callbacks.History` (also `model.history`).

    Raises:
      ValueError: for a bad argument (named, with its value), a model that is not compiled, or a model built
        outside the strategy's scope.
    """

    strategy = strategy if strategy is not None else getattr(model, "distribute_strategy", None)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        if coordinator is not None or validation_data is not None:
            raise ValueError(
                "Arguments `coordinator` and `validation_data` are ParameterServerStrategy arguments; under "
                "MultiWorkerMirroredStrategy leave them None."
            )
        from tf_embed_ops.distribute.collective import loop

        return loop.fit(
            model,
            dataset_fn,
            strategy,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks,
            verbose=verbose,
            initial_epoch=initial_epoch,
            checkpoint_manager=checkpoint_manager,
            max_ids_per_worker=max_ids_per_worker,
            timeout_seconds=timeout_seconds,
        )
    if max_ids_per_worker is not None:
        raise ValueError("Argument `max_ids_per_worker` applies under MultiWorkerMirroredStrategy only.")
    verbose = _check_arguments(epochs, steps_per_epoch, validation_data, validation_steps, verbose, initial_epoch)
    if not callable(dataset_fn):
        raise ValueError(f"Argument `dataset_fn` must be a function of an InputContext; got {dataset_fn!r}.")
    if not getattr(model, "compiled", False):
        raise ValueError("`fit` needs a compiled model: call `model.compile(...)` inside `strategy.scope()` first.")
    strategy = coordinator.strategy if coordinator is not None else strategy
    if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ValueError(
            f"`fit` runs under ParameterServerStrategy or MultiWorkerMirroredStrategy (create and compile the model "
            f"in its scope); the model's strategy is {type(strategy).__name__}. Without one, use `model.fit`."
        )
    coordinator = coordinator or tf.distribute.coordinator.ClusterCoordinator(strategy)

    _check_variables_in_scope(model, strategy)  # the layers' variables, before anything else is created
    with strategy.scope():
        _build(model, dataset_fn)
    _check_variables_in_scope(model, strategy)  # and the metrics' and optimizer's
    if checkpoint_manager is not None and checkpoint_manager.latest_checkpoint:
        checkpoint_manager.restore_or_initialize()
        initial_epoch = max(initial_epoch, _completed_epochs(checkpoint_manager))

    train = _Steps(
        _step_function(strategy, model.train_step),
        _per_worker_iterator(coordinator, strategy, dataset_fn),
        steps_per_epoch,
    )
    validation = (
        _Steps(
            _step_function(strategy, model.test_step),
            _per_worker_iterator(coordinator, strategy, validation_data),
            validation_steps,
        )
        if validation_data is not None
        else None
    )
    in_flight = _STEPS_IN_FLIGHT_PER_WORKER * _num_workers()

    callbacks = begin_training(callbacks, model, verbose=verbose, epochs=epochs, steps=steps_per_epoch)
    training_logs = None
    for epoch in range(initial_epoch, epochs):
        try:
            epoch_logs = _run_epoch(
                model, coordinator, callbacks, epoch, train, validation, in_flight, checkpoint_manager
            )
        except _LOST_TASK_ERRORS as e:
            latest = checkpoint_manager.latest_checkpoint if checkpoint_manager is not None else None
            resume = (
                f"restart the job with the same checkpoint_manager: fit restores {latest} and continues "
                f"with epoch {_completed_epochs(checkpoint_manager) + 1}"
                if latest
                else "no checkpoint was saved (pass checkpoint_manager= to resume after a restart)"
            )
            raise TrainingInterruptedError(
                f"training stopped in epoch {epoch + 1}/{epochs}: a parameter server is unreachable "
                f"({type(e).__name__}: {' '.join(str(e).split())[:300]}). Updates after the last checkpoint are "
                f"lost; {resume}."
            ) from e
        callbacks.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    callbacks.on_train_end(logs=training_logs)
    return model.history


class _Steps(NamedTuple):
    """One kind of step of an epoch (training or validation): the scheduled step function, the per-worker iterator
    it reads, and how many steps an epoch runs."""

    function: Callable
    iterator: Any
    count: int


def _run_epoch(model, coordinator, callbacks, epoch, train, validation, in_flight, checkpoint_manager) -> dict:
    """One epoch: training steps, validation (`validation` None: none), checkpoint; returns the epoch's logs
    (callbacks not yet told)."""
    model.reset_metrics()
    callbacks.on_epoch_begin(epoch)
    _run_steps(
        coordinator,
        train.function,
        train.iterator,
        train.count,
        in_flight,
        callbacks.on_train_batch_begin,
        callbacks.on_train_batch_end,
        lambda: model.stop_training,
    )
    epoch_logs = _metrics(model)
    if validation is not None:
        model.reset_metrics()
        callbacks.on_test_begin()
        _run_steps(
            coordinator,
            validation.function,
            validation.iterator,
            validation.count,
            in_flight,
            callbacks.on_test_batch_begin,
            callbacks.on_test_batch_end,
            lambda: False,
        )
        val_logs = _metrics(model)
        callbacks.on_test_end(val_logs)
        epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
    if checkpoint_manager is not None:
        checkpoint_manager.save(checkpoint_number=epoch + 1)
    return epoch_logs


def _check_arguments(epochs, steps_per_epoch, validation_data, validation_steps, verbose, initial_epoch):
    """Validates the scalar arguments (before anything is built or scheduled); returns `verbose` resolved."""

    def positive_int(name, value, minimum=1):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"Argument `{name}` must be an int >= {minimum}; got {value!r}.")

    positive_int("epochs", epochs)
    if steps_per_epoch is None:
        raise ValueError(
            "Argument `steps_per_epoch` is required: per-worker datasets have no length the chief can read."
        )
    positive_int("steps_per_epoch", steps_per_epoch)
    positive_int("initial_epoch", initial_epoch, minimum=0)
    if validation_data is not None:
        if not callable(validation_data):
            raise ValueError(
                "Argument `validation_data` must be a dataset function like `dataset_fn` (it runs on the "
                f"workers); got {type(validation_data).__name__}."
            )
        if validation_steps is None:
            raise ValueError("Argument `validation_steps` is required with `validation_data`.")
        positive_int("validation_steps", validation_steps)
    if verbose == "auto":
        return 1
    if verbose not in (0, 1, 2) or isinstance(verbose, bool):
        raise ValueError(f"Argument `verbose` must be 0, 1, 2 or 'auto'; got {verbose!r}.")
    return verbose


def _build(model: keras.Model, dataset_fn: Callable) -> None:
    """Creates every variable the steps use (layers, compiled loss and metrics, optimizer slots), in the scope.

    Scheduled functions cannot create variables, so this runs on the chief before the first step: one forward
    pass, loss and metrics on one real batch of `dataset_fn` (real tensors, so Ragged/Sparse inputs keep their
    type, which a symbolic build from shapes would lose), then the metrics are reset.
    """
    import keras

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(next(iter(dataset_fn(tf.distribute.InputContext()))))
    y_pred = model(x, training=False)
    model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
    model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.reset_metrics()


def _check_variables_in_scope(model: keras.Model, strategy) -> None:
    """Every dense, metric and optimizer variable must live on the cluster, not only on the chief."""
    variables = list(model.variables) + list(model.metrics_variables)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    for v in variables:
        if not strategy.extended.variable_created_in_scope(getattr(v, "value", v)):
            raise ValueError(
                f"Variable {v.path!r} was created outside the strategy's scope: create and compile the model "
                "inside `strategy.scope()` so its variables live on the parameter servers."
            )


def _num_workers() -> int:
    """Worker tasks of the cluster this process is connected to (the coordinator connects the eager context)."""
    tasks = {d.name.split("/device:")[0] for d in tf.config.list_logical_devices() if "/job:worker/" in d.name}
    return max(1, len(tasks))


def _completed_epochs(manager: tf.train.CheckpointManager) -> int:
    """The number of epochs a checkpoint saved by `fit` had completed (its checkpoint number)."""
    return int(manager.latest_checkpoint.rsplit("-", 1)[-1])


def _per_worker_iterator(coordinator, strategy, dataset_fn: Callable):
    def per_worker_dataset():
        return strategy.distribute_datasets_from_function(dataset_fn)

    return iter(coordinator.create_per_worker_dataset(per_worker_dataset))


def _step_function(strategy, step: Callable):
    @tf.function
    def function(iterator):
        return strategy.run(step, args=(next(iterator),))

    return function


def _run_steps(coordinator, function, iterator, steps, in_flight, on_begin, on_end, should_stop) -> None:
    """Schedules `steps` steps; batch callbacks follow the finished steps in order, a window behind."""
    pending: collections.deque = collections.deque()
    for step in range(steps):
        on_begin(step)
        pending.append((step, coordinator.schedule(function, args=(iterator,))))
        if len(pending) >= in_flight:
            done, value = pending.popleft()
            on_end(done, _pythonify(value.fetch()))
        if should_stop():
            break
    coordinator.join()
    while pending:
        done, value = pending.popleft()
        on_end(done, _pythonify(value.fetch()))


def _metrics(model: keras.Model) -> dict:
    """The model's metrics (read on the chief from the servers' variables: all workers' steps together)."""
    return _pythonify(model.get_metrics_result())


def _pythonify(logs: dict) -> dict:
    return {name: float(np.asarray(value)) for name, value in logs.items()}
