"""Helpers of the serving-export tests: serve an export from an interpreter that cannot import tf_embed_ops, and
find FBGEMM's interpreter (the benchmark peer's virtualenv) for the tests that compare with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

FBGEMM_PYTHON = os.environ.get("TF_EMBED_OPS_FBGEMM_PYTHON", "/opt/fbgemm-venv/bin/python")


def _serve(code_and_args: list, feed: dict, cwd: str, timeout: int):
    """Runs `python -c code args...` from `cwd` without PYTHONPATH, `feed` as JSON on stdin; the JSON it prints
    last."""
    result = subprocess.run(
        [sys.executable, "-c", *code_and_args],
        input=json.dumps(feed),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# Feeds the JSON on stdin to the export's serving_default signature (`string_inputs` are tf.string, the rest int64)
# and prints output_0 as JSON. tf_embed_ops is made unimportable before TensorFlow loads the export.
_SERVE_CODE = """
import json, sys
sys.modules["tf_embed_ops"] = None  # from here on `import tf_embed_ops` raises ImportError
import tensorflow as tf
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
strings = set(json.loads(sys.argv[2]))
feed = json.loads(sys.stdin.read())
out = fn(**{k: tf.constant(v, tf.string if k in strings else tf.int64) for k, v in feed.items()})
assert not [m for m, v in sys.modules.items() if m.startswith("tf_embed_ops") and v is not None], "imported"
print(json.dumps(out["output_0"].numpy().tolist()))
"""


def serve_without_plugin(export_dir: str, feed: dict, cwd: str, string_inputs: tuple = ()) -> np.ndarray:
    """output_0 of `export_dir`'s serving_default on `feed` ({name: tensor}), computed by a fresh interpreter in
    which `tf_embed_ops` cannot be imported, run from `cwd` (outside the source tree) without PYTHONPATH."""
    plain = {k: [x.decode() if isinstance(x, bytes) else x for x in v.numpy().tolist()] for k, v in feed.items()}
    out = _serve([_SERVE_CODE, export_dir, json.dumps(list(string_inputs))], plain, cwd, timeout=300)
    return np.array(out, np.float32)


# The same for several exports in one interpreter (inputs int64 unless argv[2] names their dtype): prints the list
# of their output_0s.
_SERVE_MANY_CODE = """
import json, sys
sys.modules["tf_embed_ops"] = None  # from here on `import tf_embed_ops` raises ImportError
import tensorflow as tf
feed = json.loads(sys.stdin.read())
dtypes = json.loads(sys.argv[2])
outs = []
for path in json.loads(sys.argv[1]):
    fn = tf.saved_model.load(path).signatures["serving_default"]
    args = {k: tf.constant(v, tf.as_dtype(dtypes.get(k, "int64"))) for k, v in feed.items()}
    outs.append(fn(**args)["output_0"].numpy().tolist())
assert not [m for m, v in sys.modules.items() if m.startswith("tf_embed_ops") and v is not None], "imported"
print(json.dumps(outs))
"""


def serve_many_without_plugin(export_dirs: list, feed: dict, cwd: str) -> list:
    """output_0 of each export's serving_default on `feed` ({name: tensor}: integers fed as int64, floats in their
    dtype, which JSON carries exactly), computed by one fresh interpreter in which `tf_embed_ops` cannot be imported
    (as `serve_without_plugin`)."""
    plain = {k: v.numpy().tolist() for k, v in feed.items()}
    dtypes = {k: v.dtype.name for k, v in feed.items() if v.dtype.is_floating}
    out = _serve([_SERVE_MANY_CODE, json.dumps([str(d) for d in export_dirs]), json.dumps(dtypes)], plain, cwd, 600)
    return [np.array(x, np.float32) for x in out]


def fbgemm_available() -> bool:
    """Whether FBGEMM_PYTHON runs and imports torch and fbgemm_gpu."""
    if not os.access(FBGEMM_PYTHON, os.X_OK):
        return False
    probe = subprocess.run(
        [FBGEMM_PYTHON, "-c", "import fbgemm_gpu, torch"], capture_output=True, timeout=300, check=False
    )
    return probe.returncode == 0
