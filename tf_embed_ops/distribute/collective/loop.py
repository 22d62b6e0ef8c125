"""`fit` under `MultiWorkerMirroredStrategy`: a synchronous training loop with tables sharded over the workers.

Keras 3's `Model.fit` does not run under `MultiWorkerMirroredStrategy` (keras-team/keras#20585, #21172), so this is
the loop, written with `strategy.run` and explicit collectives; every worker runs it (SPMD):

* each `te.keras.TPUEmbedding` layer's tables are mod-sharded (`shards.LayerShards`); its lookup is replaced, while
  this loop traces the model, by the collective lookup (`lookup.lookup`) and its update by `update.apply_gradients`;
* the dense weights are mirrored: the model's Keras optimizer all-reduces their gradients (in the strategy's
  replica context) and applies the sum on every worker;
* the loss is the model's `compute_loss` on the worker's batch, which Keras scales by 1 / workers under the
  strategy: the gradients are those of the global batch's mean loss;
* the logs hold `loss` (the global batch's, averaged over the epoch's steps), the compiled metrics (this
  worker's batches) and `exchange_bytes`: the bytes this worker's table exchange sent per step (padding included,
  the dense gradients' all-reduce not);
* each worker holds only its shards while it trains (`LayerShards.attach`: the layers' table and slot variables are
  the shards); a `tf.train.Checkpoint` of the model, saved on every worker at any time (a callback mid-epoch, or
  `checkpoint_manager` after each epoch), holds the full tables under the single-process keys, gathered at save
  time; when `fit` returns (or refuses a step on every worker) the layers hold the full tables again
  (`LayerShards.detach`);
* Keras callbacks run on every worker.

Example:
    >>> history = te.distribute.fit(model, dataset_fn, epochs=2, steps_per_epoch=50, strategy=strategy)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.distribute.collective import lookup as lookup_lib
from tf_embed_ops.distribute.collective import update as update_lib
from tf_embed_ops.distribute.collective.exchange import Exchange
from tf_embed_ops.distribute.collective.shards import LayerShards
from tf_embed_ops.distribute.fit_callbacks import begin_training

__all__ = ["CollectiveTraining", "WorkerLostError", "check_arguments", "embedding_layers", "fit", "worker_index"]

# What a collective raises when a peer is gone: its timeout (DeadlineExceeded), the coordination service's
# report (Unavailable / Aborted), a cancelled step.
_LOST_PEER_ERRORS = (
    tf.errors.DeadlineExceededError,
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


class WorkerLostError(RuntimeError):
    """A worker of the collective job stopped answering; restarting the job resumes from the last checkpoint."""


def worker_index() -> tuple[int, int]:
    """(this worker's index, the number of workers) from TF_CONFIG ((0, 1) without one)."""
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    cluster = config.get("cluster", {})
    workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    task = config.get("task", {})
    if not workers:
        return 0, 1
    index = int(task.get("index", 0)) + (len(cluster.get("chief", [])) if task.get("type") == "worker" else 0)
    return index, workers


def embedding_layers(model: Any) -> list:
    """The model's `te.keras.TPUEmbedding` layers (nested models included), depth first in `layers` order."""
    from tf_embed_ops.keras import TPUEmbedding

    found: list = []
    for layer in getattr(model, "layers", []):
        if isinstance(layer, TPUEmbedding):
            if all(layer is not f for f in found):
                found.append(layer)
        else:
            found.extend(f for f in embedding_layers(layer) if all(f is not g for g in found))
    return found


class CollectiveTraining:
    """The sharded tables of a model's embedding layers and the compiled step; one per `fit` call."""

    def __init__(self, model: Any, strategy: Any, max_ids_per_worker: int | None, timeout_seconds: float):
        self.model = model
        self.strategy = strategy
        self.worker, self.num_workers = worker_index()
        if strategy.num_replicas_in_sync != self.num_workers:
            raise ValueError(
                f"The strategy has {strategy.num_replicas_in_sync} replicas and TF_CONFIG {self.num_workers} "
                "workers: the collective mode runs one replica per worker (one CPU device each)."
            )
        self.exchange = Exchange(self.num_workers, timeout_seconds)
        self.max_ids_per_worker = max_ids_per_worker
        self.layers = embedding_layers(model)
        if not self.layers:
            raise ValueError("The model has no te.keras.TPUEmbedding layer: use a plain training loop.")
        self.shards = [LayerShards(layer, self.exchange, self.worker) for layer in self.layers]
        layer_vars = {id(v) for layer in self.layers for v in layer.weights}
        self.dense = [v for v in model.trainable_variables if id(v) not in layer_vars]
        self._pending: dict = {}
        self._tape = None
        self._train = None

    def attach(self) -> None:
        """Every layer onto this worker's shards (no collective)."""
        for s in self.shards:
            s.attach()

    def detach(self) -> None:
        """Every layer's full tables back from the shards (collective: every worker calls it)."""
        for s in self.shards:
            s.detach()

    @contextlib.contextmanager
    def _collective_calls(self, tape: tf.GradientTape):
        """While tracing: each embedding layer's call is the collective lookup (recording its pending update)."""
        self._pending = {}

        def collective_call(shards):
            def call(features, weights=None, training=None):
                acts, pending = lookup_lib.lookup(shards, features, weights, tape, self.max_ids_per_worker)
                self._pending[id(shards)] = pending
                return acts

            return call

        for s in self.shards:
            s.layer.call = collective_call(s)
        try:
            yield
        finally:
            for s in self.shards:
                del s.layer.call

    def _replica_step(self, data):
        import keras

        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        batch = tf.shape(tf.nest.flatten(x)[0], out_type=tf.int64)[0]
        sizes = self.exchange.all_reduce(tf.stack([batch, -batch]), "Max")
        check = tf.debugging.assert_equal(
            sizes[0],
            -sizes[1],
            message=(
                "The workers' batch sizes differ (largest and -smallest shown): every worker's dataset_fn must give "
                "batches of one size (global batch / workers; drop_remainder=True); nothing was changed"
            ),
        )
        with tf.control_dependencies([check]), tf.GradientTape() as tape:
            with self._collective_calls(tape):
                y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        pending = [self._pending[id(s)] for s in self.shards]
        watched = [p.rows for per_layer in pending for p in per_layer]
        grads = tape.gradient(loss, self.dense + watched)
        dense_grads, row_grads = grads[: len(self.dense)], grads[len(self.dense) :]
        context = tf.distribute.get_replica_context()
        updates = []
        if self.dense:
            # The Keras optimizer sums the replicas' gradients itself (an all-reduce in its replica context).
            model.optimizer.apply(dense_grads, self.dense)
        k = 0
        for s, per_layer in zip(self.shards, pending, strict=True):
            updates.extend(update_lib.apply_gradients(s, per_layer, row_grads[k : k + len(per_layer)]))
            k += len(per_layer)
        with tf.control_dependencies([u for u in updates if u is not None]):
            model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(loss))
        return total

    def train_function(self):
        if self._train is None:

            @tf.function
            def train(iterator):
                return self.strategy.run(self._replica_step, args=(next(iterator),))

            self._train = train
        return self._train


def check_arguments(epochs, steps_per_epoch, verbose, initial_epoch, max_ids_per_worker, timeout_seconds):
    """Validates `fit`'s scalar arguments before anything is built; returns `verbose` resolved (ValueError names the
    argument and the value)."""

    def positive_int(name, value, minimum=1):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"Argument `{name}` must be an int >= {minimum}; got {value!r}.")

    positive_int("epochs", epochs)
    if steps_per_epoch is None:
        raise ValueError("Argument `steps_per_epoch` is required: per-worker datasets have no common length.")
    positive_int("steps_per_epoch", steps_per_epoch)
    positive_int("initial_epoch", initial_epoch, minimum=0)
    if max_ids_per_worker is not None:
        positive_int("max_ids_per_worker", max_ids_per_worker)
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)) or not timeout_seconds > 0:
        raise ValueError(f"Argument `timeout_seconds` must be a number > 0; got {timeout_seconds!r}.")
    if verbose == "auto":
        return 1
    if verbose not in (0, 1, 2) or isinstance(verbose, bool):
        raise ValueError(f"Argument `verbose` must be 0, 1, 2 or 'auto'; got {verbose!r}.")
    return verbose


def fit(
    model: Any,
    dataset_fn: Callable,
    strategy: Any,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    callbacks: list | None = None,
    verbose: Any = "auto",
    initial_epoch: int = 0,
    checkpoint_manager: tf.train.CheckpointManager | None = None,
    max_ids_per_worker: int | None = None,
    timeout_seconds: float = 300.0,
) -> Any:
    """`te.distribute.fit` under a MultiWorkerMirroredStrategy (see `tf_embed_ops.distribute.fit`)."""
    verbose = check_arguments(epochs, steps_per_epoch, verbose, initial_epoch, max_ids_per_worker, timeout_seconds)
    if not callable(dataset_fn):
        raise ValueError(f"Argument `dataset_fn` must be a function of an InputContext; got {dataset_fn!r}.")
    if not getattr(model, "compiled", False):
        raise ValueError("`fit` needs a compiled model: call `model.compile(...)` inside `strategy.scope()` first.")
    if tf.distribute.has_strategy():
        raise ValueError(
            "Call te.distribute.fit outside `strategy.scope()` (build and compile the model inside it): the shards "
            "are plain variables of each worker, which the scope would mirror."
        )
    training = CollectiveTraining(model, strategy, max_ids_per_worker, timeout_seconds)
    training.attach()
    if checkpoint_manager is not None and checkpoint_manager.latest_checkpoint:
        try:
            # Into the shards: each worker reads the full tensors and keeps its rows.
            checkpoint_manager.restore_or_initialize()
        except Exception:
            training.detach()  # every worker read the same files and refused them alike; nothing was changed
            raise
        initial_epoch = max(initial_epoch, int(checkpoint_manager.latest_checkpoint.rsplit("-", 1)[-1]))
    # After a lost worker (WorkerLostError) or an error of this worker alone no gather could complete: the layers
    # keep this worker's shards, and restarting the job resumes from the last checkpoint.
    try:
        history = _train(
            training, dataset_fn, epochs, steps_per_epoch, callbacks, verbose, initial_epoch, checkpoint_manager
        )
    except tf.errors.InvalidArgumentError:
        training.detach()  # a refused step is refused on every worker alike: they all gather
        raise
    return history


def _train(training, dataset_fn, epochs, steps_per_epoch, callbacks, verbose, initial_epoch, checkpoint_manager):

    model, strategy = training.model, training.strategy
    if model.optimizer is not None and not model.optimizer.built:
        with strategy.scope():
            model.optimizer.build(training.dense)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    train = training.train_function()
    callbacks = begin_training(
        callbacks, model, verbose=verbose, epochs=epochs, steps=steps_per_epoch, progbar=training.worker == 0
    )
    logs: dict = {}
    try:
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            callbacks.on_epoch_begin(epoch)
            losses = []
            sent = int(training.exchange.sent_bytes.numpy())
            for step in range(steps_per_epoch):
                callbacks.on_train_batch_begin(step)
                loss = train(iterator)
                losses.append(float(np.asarray(strategy.experimental_local_results(loss)[0])))
                logs = _logs(model, float(np.mean(losses)))
                logs["exchange_bytes"] = (int(training.exchange.sent_bytes.numpy()) - sent) / len(losses)
                callbacks.on_train_batch_end(step, logs)
                if model.stop_training:
                    break
            if checkpoint_manager is not None:
                save(checkpoint_manager, epoch + 1, training.worker)
            callbacks.on_epoch_end(epoch, logs)
            if model.stop_training:
                break
    except _LOST_PEER_ERRORS as e:
        latest = checkpoint_manager.latest_checkpoint if checkpoint_manager is not None else None
        resume = (
            f"run the job again with the same checkpoint_manager: fit restores {latest} and continues after it"
            if latest
            else "no checkpoint was saved (pass checkpoint_manager= to resume after a restart)"
        )
        raise WorkerLostError(
            f"worker {training.worker} of {training.num_workers}: a collective with the other workers failed "
            f"({type(e).__name__}: {_cause(e)}); a worker has stopped or is unreachable. "
            f"Updates after the last checkpoint are lost; {resume}."
        ) from e
    training.detach()  # the callbacks' on_train_end and the caller see the full tables
    callbacks.on_train_end(logs=logs)
    return model.history


def _cause(error: Exception) -> str:
    """The runtime's own words (after "aborted by:"), without the traceback TensorFlow puts in the message."""
    text = getattr(error, "message", str(error))
    text = text.rsplit("aborted by:", 1)[-1].split("The error could be from")[0]
    return " ".join(text.split())[:300]


def _logs(model: Any, loss: float) -> dict:
    logs = {name: float(np.asarray(value)) for name, value in model.get_metrics_result().items()}
    logs["loss"] = loss
    return logs


def save(manager: tf.train.CheckpointManager, number: int, worker: int) -> str | None:
    """Saves `manager`'s checkpoint on every worker, as MultiWorkerMirroredStrategy asks: the chief writes the
    checkpoint, the others write to a temporary directory that is deleted (a save may run collectives)."""
    if worker == 0:
        return manager.save(checkpoint_number=number)
    scratch = tempfile.mkdtemp(prefix=f"tf_embed_ops_worker{worker}_")
    try:
        manager.checkpoint.write(os.path.join(scratch, "ckpt"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return None
