#!/usr/bin/env bash
# Makes the TFRA peer's interpreter: a venv with TensorFlow Recommenders-Addons and the TensorFlow it supports.
# TFRA 0.8.1 (the last release on PyPI) requires tensorflow<=2.16.2 and drives tf.keras optimizers, which under
# TensorFlow 2.16 means Keras 2 (tf_keras, selected with TF_USE_LEGACY_KERAS=1 by the peer).
# Usage: bash benchmarks/peers/setup_tfra.sh [VENV_DIR]   (default /opt/tfra-venv)
set -euo pipefail
venv="${1:-/opt/tfra-venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install "tensorflow-recommenders-addons==0.8.1" "tensorflow==2.16.2" "tf_keras==2.16.0"
echo "TFRA peer interpreter: $venv/bin/python  (export TF_EMBED_OPS_TFRA_PYTHON=$venv/bin/python)"
