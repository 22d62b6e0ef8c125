"""Suite side of the TFRA peer: finds its interpreter (``INTERPRETER``: ``--tfra-python``, else
$TF_EMBED_OPS_TFRA_PYTHON, else what ``setup_tfra.sh`` creates), writes the keys, runs ``tfra_peer.py``, reads its
JSON. Without an interpreter ``available()`` says why and the suite reports the peer as absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import numpy as np

from benchmarks.peers import interpreter

_PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfra_peer.py")
DEFAULT_PYTHON = "/opt/tfra-venv/bin/python"
INTERPRETER = interpreter.Interpreter(
    "TFRA", "setup_tfra.sh", "--tfra-python", "TF_EMBED_OPS_TFRA_PYTHON", DEFAULT_PYTHON
)


def find_python(explicit: str | None = None) -> str | None:
    return INTERPRETER.find(explicit)


def available(python: str | None) -> tuple[bool, str]:
    """(True, versions) if ``python`` imports TFRA's dynamic embedding, else (False, the reason)."""
    code = (
        "import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
        "import tensorflow as tf, tensorflow_recommenders_addons as tfra\n"
        "import tensorflow_recommenders_addons.dynamic_embedding\n"
        "print(tf.__version__, tfra.__version__)"
    )
    ok, out = INTERPRETER.probe(python, code, "TFRA", timeout=300)
    if not ok:
        return False, out
    tf_v, tfra_v = out.split()[-2:]
    return True, f"TensorFlow {tf_v}, TFRA {tfra_v}"


def run(
    python: str,
    keys: np.ndarray,
    prefill: np.ndarray,
    dim: int,
    optimizers: list[str],
    steps: int,
    blocks: int,
    warmup: int,
    threads: int = 1,
    block_ms: float = 150.0,
    timeout: int = 1800,
) -> dict:
    """Runs TFRA on ``keys`` (table prefilled with ``prefill``); returns name -> {"block_ms"} or {"error"}."""
    from benchmarks.peers import tf_native as tn

    names = [*optimizers, "lookup"]
    with tempfile.TemporaryDirectory(prefix="tfra_job_") as tmp:
        np.save(os.path.join(tmp, "keys.npy"), keys)
        np.save(os.path.join(tmp, "prefill.npy"), prefill)
        job = {
            "keys": "keys.npy",
            "prefill": "prefill.npy",
            "upstream_seed": 7,
            "dim": dim,
            "optimizers": list(optimizers),
            "learning_rate": tn.LR,
            "adagrad_init": tn.ADAGRAD_INIT,
            "steps": steps,
            "blocks": blocks,
            "warmup": warmup,
            "block_ms": block_ms,
        }
        path = os.path.join(tmp, "job.json")
        with open(path, "w") as f:
            json.dump(job, f)
        env = dict(os.environ, TFRA_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        env.pop("PYTHONPATH", None)  # the peer's TensorFlow, not ours
        try:
            proc = subprocess.run(
                [python, _PEER, path], capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            return {n: {"error": f"tfra_peer.py timed out after {timeout} s"} for n in names}
    failure = interpreter.failed(proc, "tfra_peer.py", names)
    if failure:
        return failure
    out = interpreter.last_json(proc)
    for r in out["results"].values():
        r["versions"] = f"TensorFlow {out['tensorflow']}, TFRA {out['tfra']}"
    return out["results"]
