#!/usr/bin/env bash
# ASan + UBSan job: builds the op library and the config module with both sanitizers into build/sanitize (the
# normal build is untouched), then runs the op, config, accumulator, hardening and tiered-table (static and
# dynamic) test files and a short fuzz pass against them, with the sanitizer runtimes preloaded into Python.  Any
# sanitizer report aborts the run.
#
#   .ci/sanitize.sh [python]        # default: python3; SANITIZE_FUZZ_SECONDS (default 60) sets the fuzz pass
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
# An absolute path: the tests run from another directory (a venv's python must stay a path into the venv).
if [[ $python == */* ]]; then python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python"); fi
root=$PWD
build=$root/build/sanitize
# ccache keys on paths relative to the checkout: a run in another clone of the same tree reuses these objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
tree=$build/tree

"$python" configure.py --sanitize address,undefined --ninja "$build" >/dev/null
ninja_bin=$(command -v ninja || "$python" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')
"$ninja_bin" -C "$build" -j "${TF_EMBED_OPS_JOBS:-$(nproc)}" >"$build/ninja.log" 2>&1 || { tail -50 "$build/ninja.log"; exit 1; }

# A copy of the package whose shared objects are the sanitized ones; tests and pytest's settings beside it, so
# `import tf_embed_ops` from this directory finds this copy and nothing else.
rm -rf "$tree"
mkdir -p "$tree"
cp -r tf_embed_ops tests pyproject.toml "$tree"/
find "$tree" -name '*.so' -delete
find "$tree" -name __pycache__ -type d -prune -exec rm -rf {} +
cp "$build"/out/*.so "$build"/out/_build_info.json "$tree"/tf_embed_ops/

# The runtimes of the compiler that built the libraries (Python itself is not instrumented, so they must come
# first), leak checks off (the interpreter's own allocations at exit), stop at the first report.
eval "$("$python" -c 'import configure
for k, v in configure.sanitizer_runtime_env().items(): print(f"export {k}=\"{v}\"")')"
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONDONTWRITEBYTECODE=1

cd "$tree"
# The sanitized libraries must be what the tests load.
"$python" -c 'import tf_embed_ops, sys; p = tf_embed_ops.get_library_path(); print("library:", p); sys.exit("/build/sanitize/" not in p)'
"$python" -m pytest -x -q -p no:cacheprovider --capture=sys -m "not slow" \
  tests/test_embedding_ops.py tests/test_embedding_ops_errors.py tests/test_tpu_embedding_errors.py \
  tests/test_config_load.py tests/test_config_validation.py \
  tests/test_sparse_accumulator.py tests/test_sparse_accumulator_errors.py tests/test_sparse_accumulator_lifetime.py \
  tests/test_hardening_inputs.py tests/test_hardening_config.py \
  tests/test_tiered_kernels.py tests/test_tiered_training.py tests/test_tiered_faults.py tests/test_tiered_checkpoint.py \
  tests/test_tiered_dynamic.py
# Seed 1: the slow tier's pass (tests/fuzz/test_fuzz.py) runs seed 0, so the two passes try different inputs.
"$python" -m tests.fuzz --seconds "${SANITIZE_FUZZ_SECONDS:-60}" --seed 1
echo "sanitize: clean"
