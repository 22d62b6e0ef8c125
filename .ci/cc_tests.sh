#!/usr/bin/env bash
# The C++ unit tests of the TensorFlow-free core (cc/lib/tests/*_test.cc, GoogleTest), built and run without
# bazel: g++ with the compile flags configure.py derives for the library (so the tests exercise the code as the
# wheel compiles it), the system GoogleTest (Debian: libgtest-dev), and a ctest-style summary.
#
# Layering: cc/lib may use absl (TensorFlow's bundled copy, the one its kernels must link against) and nothing
# else of TensorFlow.  So cc/lib and its tests are compiled with an include root that holds only absl/ (never
# TensorFlow's include directory), and a grep rejects any tensorflow/, tsl/, Eigen or third_party include in
# cc/lib.  absl's compiled symbols come from libtensorflow_framework, as in the op library.
#
# Usage: .ci/cc_tests.sh [gtest flags, e.g. --gtest_filter=Optimizers*]
#   PYTHON    the interpreter whose TensorFlow provides absl and the flags (default python3)
#   OUT       build directory (default build/cc_tests; objects are reused when unchanged)
#   CXX       compiler (default g++; ccache is used when installed)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
out=${OUT:-build/cc_tests}
cxx=${CXX:-g++}
command -v ccache >/dev/null && cxx="ccache $cxx"
# ccache keys on paths relative to the checkout: another clone of the same tree reuses the objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}

if [ ! -f /usr/include/gtest/gtest.h ]; then
  echo "GoogleTest headers not found: install libgtest-dev (apt-get install libgtest-dev)" >&2
  exit 1
fi

# 1. Layering: no TensorFlow header in cc/lib, by grep (covers headers no test includes).
if grep -rnE '#include [<"](tensorflow|tsl|xla|Eigen|unsupported|third_party|google/protobuf)/' cc/lib; then
  echo "cc/lib must stay free of TensorFlow: the includes above are not allowed (absl/ only)" >&2
  exit 1
fi

# 2. Flags from configure.py (the same as setup.py's and bazel's).
mkdir -p "$out"
flags_sh=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" - 2>"$out/configure.log" <<'EOF'
import shlex
import configure
cfg = configure.tf_build_config()
flags = [f for f in cfg["compile_flags"] if not f.startswith("-I")] + configure.opt_flags()
print("include_dir=" + shlex.quote(cfg["include_dir"]))
print("lib_dir=" + shlex.quote(cfg["lib_dir"]))
print("cxxflags=" + shlex.quote(" ".join(flags)))
EOF
) || { cat "$out/configure.log" >&2; exit 1; }
eval "$flags_sh"
framework=$(cd "$lib_dir" && ls libtensorflow_framework.so.* | head -n 1)

# An include root holding only absl/: a TensorFlow include in cc/lib or a test fails to compile.
mkdir -p "$out/absl_only"
ln -sfn "$include_dir/absl" "$out/absl_only/absl"
flags="$cxxflags -I. -isystem $out/absl_only -pthread"
link="-lgtest -lgtest_main -L$lib_dir -l:$framework -Wl,-rpath,$lib_dir -pthread"
# Objects built with other flags (another TensorFlow, TF_EMBED_OPS_CXXFLAGS) are not reused.
if [ "$(cat "$out/flags" 2>/dev/null)" != "$cxx $flags $link" ]; then
  rm -rf "$out/obj"
  echo "$cxx $flags $link" >"$out/flags"
fi

compile() {  # source object
  mkdir -p "$(dirname "$2")"
  if [ ! -f "$2" ] || [ "$1" -nt "$2" ] || [ -n "$(find cc/lib -name '*.h' -newer "$2" -print -quit)" ]; then
    echo "CXX $1"
    $cxx $flags -c "$1" -o "$2"
  fi
}

start=$(date +%s)
lib_objects=()
for src in cc/lib/*.cc; do
  compile "$src" "$out/obj/$src.o"
  lib_objects+=("$out/obj/$src.o")
done
tests=()
for src in cc/lib/tests/*_test.cc; do
  name=$(basename "$src" .cc)
  compile "$src" "$out/obj/$src.o"
  if [ ! -f "$out/$name" ] || [ -n "$(find "$out/obj" -name '*.o' -newer "$out/$name" -print -quit)" ]; then
    $cxx -o "$out/$name" "$out/obj/$src.o" "${lib_objects[@]}" $link
  fi
  tests+=("$name")
done
echo "built ${#tests[@]} test binaries in $(($(date +%s) - start)) s"

# 3. Run, ctest style: one line per binary; the full gtest output of a failing one.
failed=()
cases=0
disabled=0
total_start=$EPOCHREALTIME
for i in "${!tests[@]}"; do
  name=${tests[$i]}
  t0=$EPOCHREALTIME
  status=0
  # (libtensorflow_framework, linked for absl, logs at load time unless told not to)
  TF_CPP_MIN_LOG_LEVEL=2 "$out/$name" --gtest_color=no "$@" >"$out/$name.log" 2>&1 || status=$?
  secs=$(awk "BEGIN { print $EPOCHREALTIME - $t0 }")
  n=$(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran\..*/\1/p' "$out/$name.log" | tail -n 1)
  d=$(sed -nE 's/^ *YOU HAVE ([0-9]+) DISABLED TESTS?.*/\1/p' "$out/$name.log" | tail -n 1)
  cases=$((cases + ${n:-0}))
  disabled=$((disabled + ${d:-0}))
  if [ "$status" -eq 0 ]; then
    printf '%2d/%d Test: %-28s Passed  %6.2f sec  (%s cases%s)\n' $((i + 1)) ${#tests[@]} "$name" "$secs" "${n:-0}" \
      "${d:+, $d disabled}"
  else
    printf '%2d/%d Test: %-28s ***Failed (exit %d)  %6.2f sec\n' $((i + 1)) ${#tests[@]} "$name" "$status" "$secs"
    cat "$out/$name.log"
    failed+=("$name")
  fi
done
total=$(awk "BEGIN { print $EPOCHREALTIME - $total_start }")
passed=$((${#tests[@]} - ${#failed[@]}))
echo
echo "$((100 * passed / ${#tests[@]}))% tests passed, ${#failed[@]} tests failed out of ${#tests[@]}" \
  "($cases test cases, $disabled disabled)"
printf 'Total Test time (real) = %.2f sec\n' "$total"
if [ ${#failed[@]} -ne 0 ]; then
  printf 'The following tests FAILED:\n'
  printf '\t%s\n' "${failed[@]}"
  exit 1
fi
