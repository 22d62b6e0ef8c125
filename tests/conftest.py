"""Shared pytest setup: quiet TensorFlow, deterministic seeds."""

import os
import random
import zlib

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Changing this runs the whole suite on other random draws (tables, initializers, Keras layers): every draw must
# pass, since a test that depends on a lucky draw is a test that fails one CI run in a thousand.
BASE_SEED = int(os.environ.get("TF_EMBED_OPS_TEST_SEED", "0"))


def seed_for(nodeid: str) -> int:
    """The seed of one test: fixed per test id, so a test's draws do not depend on which tests ran before it."""
    return (BASE_SEED + zlib.crc32(nodeid.encode())) % 2**31


@pytest.fixture(autouse=True)
def _seed_everything(request):
    """Seeds Python's, numpy's global and TensorFlow's global generators (and with it every unseeded initializer:
    the default TableConfig initializer, Keras layers) before each test."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    seed = seed_for(request.node.nodeid)
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    try:
        import keras  # pylint: disable=import-outside-toplevel

        keras.utils.set_random_seed(seed)  # also Keras' own SeedGenerator state
    except ImportError:
        pass
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that reaches a feature the running TensorFlow minor cannot run (tf_embed_ops._tf_compat refuses it
    with TensorFlowVersionError, naming the minor it needs) is reported as skipped, with that message as reason."""
    outcome = yield
    if call.excinfo is None or call.excinfo.typename != "TensorFlowVersionError":
        return
    from tf_embed_ops import _tf_compat  # pylint: disable=import-outside-toplevel

    if call.excinfo.errisinstance(_tf_compat.TensorFlowVersionError):
        report = outcome.get_result()
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")
