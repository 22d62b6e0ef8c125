#!/usr/bin/env bash
# CI: `bazel test //...` with Debian's bazel-bootstrap (Bazel 4), offline, against the TensorFlow installed for
# ${PYTHON:-python3} (the README's pip install).  Test logs of failing tests are printed (--test_output=errors
# in .bazelrc).  Usage: .ci/bazel_test.sh [targets and bazel test flags]   (no target: //...)
# Compiled actions are shared between checkouts through a disk cache (~/.cache/tf_embed_ops-bazel; see below).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
python=${PYTHON:-python3}

# Bazel 4 (Debian's bazel-bootstrap) and the system GoogleTest the C++ unit tests link (@system_gtest).
missing=()
command -v bazel >/dev/null || missing+=(bazel-bootstrap)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
if [ ${#missing[@]} -ne 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Writes .tf_configure.bazelrc: TensorFlow's headers, libraries and flags, the Python and pybind11 headers.
"$python" configure.py >/dev/null

# Output base outside the source tree, so `//...` never walks into it and a checkout stays clean.
output_root=${BAZEL_OUTPUT_USER_ROOT:-/tmp/tf_embed_ops_bazel}

# A disk cache shared by every checkout on this machine (as ccache is for the pip and sanitizer builds): a fresh
# clone's output base is new, but an action whose inputs and command are unchanged is taken from the cache instead
# of compiled again. Test results are never taken from it (--nocache_test_results): the tests always run.
# TF_EMBED_OPS_BAZEL_DISK_CACHE sets the directory ("" turns the cache off). Bazel 4 never trims it, so a cache
# grown past TF_EMBED_OPS_BAZEL_DISK_CACHE_MAX_MB (default 4096) is emptied first.
disk_cache=${TF_EMBED_OPS_BAZEL_DISK_CACHE-$HOME/.cache/tf_embed_ops-bazel}
cache_flags=()
if [ -n "$disk_cache" ]; then
  if [ -d "$disk_cache" ] && [ "$(du -sm "$disk_cache" | cut -f1)" -gt "${TF_EMBED_OPS_BAZEL_DISK_CACHE_MAX_MB:-4096}" ]; then
    rm -rf "$disk_cache"
  fi
  mkdir -p "$disk_cache"
  cache_flags=(--disk_cache="$disk_cache" --nocache_test_results)
fi
targets=()
for arg in "$@"; do [[ "$arg" == //* ]] && targets+=("$arg"); done
[ ${#targets[@]} -ne 0 ] || set -- //... "$@"
status=0
bazel --output_user_root="$output_root" test --verbose_failures "${cache_flags[@]}" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  # Compile/link failures have no test log; failing tests already printed theirs.  Name what broke.
  echo "bazel test $* failed (exit $status); test logs are under bazel-links/testlogs/" >&2
fi
# The bazel server would otherwise keep its memory for hours after CI is done with it.
bazel --output_user_root="$output_root" shutdown
exit "$status"
