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


def _skip_reason(excinfo) -> str | None:
    """Why a failure is a skip: the running TensorFlow minor lacks what the test needs (tf_embed_ops._tf_compat
    refused a feature with TensorFlowVersionError, or a TensorFlow API of a newer minor, _tf_compat.ADDED_IN, is
    missing); None for any other failure."""
    if excinfo is None or excinfo.typename not in ("TensorFlowVersionError", "AttributeError"):
        return None
    from tf_embed_ops import _tf_compat  # pylint: disable=import-outside-toplevel

    if excinfo.errisinstance(_tf_compat.TensorFlowVersionError):
        return str(excinfo.value)
    return _tf_compat.missing_api(excinfo.value)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that needs a newer TensorFlow minor than the running one (_skip_reason) is reported as skipped, with
    the minor it needs as the reason."""
    outcome = yield
    reason = _skip_reason(call.excinfo)
    if reason is not None:
        report = outcome.get_result()
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a test module whose import fails on a TensorFlow API of a newer minor (_tf_compat.ADDED_IN): an
    AttributeError (a public name) or an ImportError (a module)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or not any(e in str(report.longrepr) for e in ("AttributeError", "ImportError")):
        return
    from tf_embed_ops import _tf_compat  # pylint: disable=import-outside-toplevel

    reason = _tf_compat.missing_api(AttributeError(str(report.longrepr)))
    if reason is not None:
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: {reason}")
