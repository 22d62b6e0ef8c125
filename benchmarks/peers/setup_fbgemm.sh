#!/usr/bin/env bash
# Creates the optional FBGEMM peer interpreter for the benchmark suite.
#
# FBGEMM's CPU table-batched embedding needs PyTorch, which must not share an interpreter with
# TensorFlow (two copies of oneDNN/OpenMP, and a multi-GB install). So the peer lives in its own
# virtualenv and the suite calls it as a subprocess on the same ids (benchmarks/peers/fbgemm_peer.py).
#
# Usage: bash benchmarks/peers/setup_fbgemm.sh [VENV_DIR]        (default /opt/fbgemm-venv)
# Then:  python -m benchmarks --fbgemm-python VENV_DIR/bin/python  (the default path is tried automatically)
#
# torch==2.13.0 is pinned on purpose: on this project's machines it is a local CPU wheel; an unpinned
# `torch` would pull a CUDA build of several GB. fbgemm-gpu-cpu 1.8.0 is built against torch 2.13.
set -euo pipefail
VENV="${1:-/opt/fbgemm-venv}"
PY="${PYTHON:-python3}"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0" "fbgemm-gpu-cpu==1.8.0" numpy
"$VENV/bin/python" - <<'PY'
import torch, fbgemm_gpu  # noqa: F401  (import registers torch.ops.fbgemm)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen  # noqa: F401
print("fbgemm peer ready: torch", torch.__version__, "fbgemm_gpu", getattr(fbgemm_gpu, "__version__", "?"))
PY
