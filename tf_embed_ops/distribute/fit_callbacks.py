"""The Keras callbacks of a `fit` loop written outside `Model.fit` (the parameter-server `fit` and the collective
`fit`), set up as `Model.fit` sets them up.

keras is imported on the first call: `import tf_embed_ops.distribute` does not need it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["begin_training"]


def begin_training(callbacks: Any, model: Any, *, verbose: int, epochs: int, steps: int, progbar: bool = True) -> Any:
    """`callbacks` as a `keras.callbacks.CallbackList` (with a History, and a progress bar when `verbose` and
    `progbar`), told that training begins; `model.stop_training` is reset. Returns the list."""
    import keras

    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0 and progbar,
            verbose=verbose,
            epochs=epochs,
            steps=steps,
            model=model,
        )
    model.stop_training = False
    callbacks.on_train_begin()
    return callbacks
