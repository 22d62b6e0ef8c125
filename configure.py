#!/usr/bin/env python3
"""The one source of truth for how tf_embed_ops is compiled.

Reads ``tf.sysconfig`` from the *installed* TensorFlow and derives every compiler and linker flag from it, so
no ABI or ``-std`` flag is hard-coded here.  Used by ``setup.py`` (through :func:`write_ninja`) and by bazel
(``python configure.py`` writes ``.tf_configure.bazelrc``, read by ``.bazelrc``).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import sysconfig

ROOT = os.path.dirname(os.path.abspath(__file__))

# Sources of each shared object, as globs relative to ROOT.  cc/lib is header-only or TF-free .cc files.
OP_LIBRARY_SOURCES = ["cc/lib/*.cc", "cc/config/*.cc", "cc/ops/*.cc", "cc/kernels/*.cc"]
CONFIG_MODULE_SOURCES = ["cc/lib/*.cc", "cc/config/*.cc", "cc/python/*.cc"]

# Optimisation flags are ours to choose (TensorFlow's own flags carry none).  -O3 lets the row loops of
# cc/lib vectorise; TF_EMBED_OPS_CXXFLAGS adds to them (e.g. "-march=native" for a local build).
# -fno-math-errno lets the optimizer loops vectorise std::sqrt (sqrt/sqrtps are correctly rounded either way, so
# results are bitwise unchanged; only errno, which nothing reads, is no longer set): Adagrad's update ~1.5x.
# -ffp-contract=off: no a*b+c is fused into one rounding, so a build for a CPU with FMA or AVX-512
# (TF_EMBED_OPS_CXXFLAGS=-march=native) gives the bits of the baseline build (cc/lib/tests/vector_isa_test.cc).
OPT_FLAGS = [
    "-O3",
    "-DNDEBUG",
    "-fno-math-errno",
    "-ffp-contract=off",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wno-deprecated-declarations",
]


# TF_EMBED_OPS_SANITIZE=address,undefined (or `python configure.py --sanitize ...`) builds both shared objects
# with AddressSanitizer/UndefinedBehaviorSanitizer.  UBSan stops at its first finding (no recovery), a few of
# its checks are left out (see sanitize_flags), and -O1 -g keeps the reports readable.  The
# sanitizer runtime must then be loaded first: LD_PRELOAD the libasan/libubsan of this compiler
# (.ci/sanitize.sh does all of it; docs/reliability.md explains).
SANITIZERS = ("address", "undefined")


def sanitize_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for the sanitizers named in TF_EMBED_OPS_SANITIZE; ([], []) when unset."""
    names = [n for n in os.environ.get("TF_EMBED_OPS_SANITIZE", "").replace(" ", "").split(",") if n]
    unknown = [n for n in names if n not in SANITIZERS]
    if unknown:
        raise ValueError(f"TF_EMBED_OPS_SANITIZE: unknown sanitizer(s) {unknown}; supported: {', '.join(SANITIZERS)}")
    if not names:
        return [], []
    flags = ["-fsanitize=" + ",".join(names), "-fno-omit-frame-pointer", "-g", "-O1"]
    if "undefined" in names:
        # vptr: TensorFlow's types cross uninstrumented libraries.  null, nonnull-attribute,
        # returns-nonnull-attribute and pointer-overflow: with them g++ 12 refuses absl's constexpr function-pointer
        # comparisons in TensorFlow's headers ("is not a constant expression"); a null or wild dereference is still
        # caught, by ASan.
        flags += [
            "-fno-sanitize-recover=undefined",
            "-fno-sanitize=vptr,null,nonnull-attribute,returns-nonnull-attribute,pointer-overflow",
        ]
    return flags, ["-fsanitize=" + ",".join(names)]


# The TensorFlow minors this release supports: each is built and its fast test tier run by tools/version_matrix.py
# (docs/building.md has the table); CI runs the oldest and the newest. A build against another minor is refused
# (TF_EMBED_OPS_ALLOW_UNSUPPORTED_TF=1 builds anyway, for trying a new release).
SUPPORTED_TF_MINORS = ((2, 16), (2, 21))

# Run by _environment_query in the interpreter's own environment (see there).
_QUERY = """
import json, sys
sys.path.insert(0, {root!r})
import configure
print("TF_EMBED_OPS_QUERY " + json.dumps(configure.{function}()))
"""


def tf_build_config() -> dict:
    """Flags and paths of the TensorFlow to build against (imports it in this process or a child).

    That is the TensorFlow importable here; failing that (pip's isolated build environment hides the target
    environment's packages from the build backend), the one in the environment of this interpreter
    (``sys.executable``): pip runs the backend with the interpreter it installs into, so the library is built
    against the TensorFlow it will run with, and no second TensorFlow is downloaded for the build.
    """
    try:
        import tensorflow  # noqa: F401  # pylint: disable=unused-import
    except ModuleNotFoundError:
        config = _environment_query("_tf_build_config_here")
        if config is None:
            raise RuntimeError(
                f"tf_embed_ops builds against the installed TensorFlow, but {sys.executable} has none: install "
                f'one first (`{sys.executable} -m pip install "tensorflow-cpu>={_minor_text(SUPPORTED_TF_MINORS[0])},'
                f'<{_next_minor_text(SUPPORTED_TF_MINORS[1])}"`, or `tensorflow`), or install tf_embed_ops with '
                "the `cpu` extra"
            ) from None
        return config
    return _tf_build_config_here()


def _tf_build_config_here() -> dict:
    import tensorflow as tf

    lib_dir = tf.sysconfig.get_lib()
    link_flags = list(tf.sysconfig.get_link_flags())
    # The TPU proto classes (tensorflow/core/protobuf/tpu/*.pb.h) are compiled into libtensorflow_cc.
    cc_lib = glob.glob(os.path.join(lib_dir, "libtensorflow_cc.so.*"))
    if cc_lib:
        link_flags.append("-l:" + os.path.basename(sorted(cc_lib)[0]))
    compile_flags = list(tf.sysconfig.get_compile_flags())
    return {
        "tf_version": tf.__version__,
        "include_dir": tf.sysconfig.get_include(),
        "lib_dir": lib_dir,
        "compile_flags": compile_flags,
        "link_flags": link_flags,
    }


def abi_flags(compile_flags: list[str]) -> list[str]:
    """The flags of TensorFlow's compile flags that the library's binary interface depends on (all but the include
    directory): recorded by the build, compared by the loader with the running TensorFlow's."""
    return [flag for flag in compile_flags if not flag.startswith("-I")]


def installed_tf_version() -> str | None:
    """The version of the TensorFlow distribution installed for this interpreter (package metadata, without
    importing it): the one importable here, else the one in sys.executable's own environment; None if neither."""
    version = _tf_version_here()
    if version is None:
        version = _environment_query("_tf_version_here")
    return version


def _tf_version_here() -> str | None:
    return _loader_module().installed_tensorflow_version()


def _loader_module():
    """tf_embed_ops/_loader.py as a standalone module (importing the package would run its own build check, which
    a stale build record fails: the very case a rebuild is for); it has no package imports at module level."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    name = "_tf_embed_ops_loader_for_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tf_embed_ops", "_loader.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def _environment_query(function: str):
    """Runs configure.<function>() in a child `sys.executable -I`: isolated mode ignores PYTHONPATH, through which
    pip's build isolation hides the environment's own site-packages, so the child sees the environment as it is.
    Returns its JSON result (None when it found no TensorFlow)."""
    import subprocess  # pylint: disable=import-outside-toplevel

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    code = _QUERY.format(root=ROOT, function=function)
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, env=env, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("TF_EMBED_OPS_QUERY "):
            return json.loads(line.split(" ", 1)[1])
    if "No module named 'tensorflow'" in out.stderr:
        return None
    raise RuntimeError(f"reading TensorFlow's build configuration with {sys.executable} failed:\n{out.stderr}")


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a TensorFlow version string ("2.21.0" -> (2, 21); "2.22.0rc1" -> (2, 22))."""
    return _loader_module().tensorflow_minor(version)


def _minor_text(m: tuple[int, int]) -> str:
    return f"{m[0]}.{m[1]}"


def _next_minor_text(m: tuple[int, int]) -> str:
    return f"{m[0]}.{m[1] + 1}"


def tf_requirement(distribution: str = "tensorflow-cpu") -> str:
    """The requirement that installs a supported TensorFlow (e.g. "tensorflow-cpu>=2.16,<2.22")."""
    low, high = SUPPORTED_TF_MINORS
    return f"{distribution}>={_minor_text(low)},<{_next_minor_text(high)}"


def check_supported(version: str) -> None:
    """Refuses to build against a TensorFlow outside SUPPORTED_TF_MINORS, naming the range."""
    low, high = SUPPORTED_TF_MINORS
    if low <= minor(version) <= high or os.environ.get("TF_EMBED_OPS_ALLOW_UNSUPPORTED_TF") == "1":
        return
    raise RuntimeError(
        f"tf_embed_ops supports TensorFlow {_minor_text(low)} to {_minor_text(high)}, but the build found TensorFlow "
        f"{version} (in {sys.executable}'s environment): install a supported one (`pip install "
        f'"{tf_requirement()}"`), or set TF_EMBED_OPS_ALLOW_UNSUPPORTED_TF=1 to build anyway'
    )


def version_suffix(version: str) -> str:
    """The local version label of a build for TensorFlow `version`: "tf221" for 2.21.x."""
    major, minor_ = minor(version)
    return f"tf{major}{minor_}"


def sources(patterns: list[str]) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        out.extend(sorted(glob.glob(os.path.join(ROOT, pattern))))
    return out


def _ninja_escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def write_ninja(build_dir: str, op_library: str, config_module: str, config: dict | None = None) -> str:
    """Writes build_dir/build.ninja producing the op library and the pybind11 config module.

    Returns the path of the ninja file.  A source of both outputs (cc/lib, cc/config) is compiled once.

    TensorFlow's and pybind11's headers are reached through links inside build_dir (see _stable_link), so the
    compile commands do not change when pip's build isolation installs them under a new random /tmp path: an
    unchanged tree then recompiles nothing.  They are -isystem directories, so their own warnings are not ours
    (-MMD also stops tracking them: a build_dir must be keyed by the TensorFlow version, as setup.py does).
    """
    config = config or tf_build_config()
    os.makedirs(build_dir, exist_ok=True)
    cxx = os.environ.get("CXX", "g++")
    launcher = "ccache " if os.environ.get("TF_EMBED_OPS_CCACHE", "1") == "1" and _which("ccache") else ""
    python = python_build_config()
    tf_include = _stable_link(build_dir, "tensorflow_include", config["include_dir"])
    tf_lib = _stable_link(build_dir, "tensorflow_lib", config["lib_dir"])
    tf_flags = [_system_include(flag, config["include_dir"], tf_include) for flag in config["compile_flags"]]
    cflags = opt_flags() + tf_flags + ["-I" + ROOT]
    py_cflags = cflags + [
        "-isystem",
        _stable_link(build_dir, "pybind11_include", python["pybind11_include_dir"]),
        "-isystem",
        python["python_include_dir"],
    ]
    link_flags = ["-L" + tf_lib if flag == "-L" + config["lib_dir"] else flag for flag in config["link_flags"]]
    # The rpath is the stable link too, so the link commands do not change either.  TensorFlow is imported (and
    # its libraries loaded) before either library is, so it is a fallback, never what finds them in a pip install.
    rpath = "-Wl,-rpath," + tf_lib
    version_script = os.path.join(ROOT, "cc", "op_library.lds")
    lines = [
        "# Generated by configure.py; do not edit.",
        f"cxx = {launcher}{cxx}",
        f"cflags = {' '.join(cflags)}",
        f"pyflags = {' '.join(py_cflags)}",
        f"ldflags = -shared {' '.join(link_flags)} {rpath} {' '.join(sanitize_flags()[1])}",
        "rule cxx",
        "  command = $cxx -MMD -MF $out.d $flags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CXX $src",
        "rule link",
        "  command = $cxx -o $out $in $ldflags $extra_ldflags",
        "  description = LINK $name",
    ]

    def objects(srcs: list[str], flags_var: str, tag: str) -> list[str]:
        objs = []
        for src in srcs:
            rel = os.path.relpath(src, ROOT)
            obj = os.path.join(build_dir, tag, rel + ".o")
            lines.append(f"build {_ninja_escape(obj)}: cxx {_ninja_escape(src)}")
            lines.append(f"  flags = ${flags_var}")
            lines.append(f"  src = {_ninja_escape(rel)}")
            objs.append(obj)
        return objs

    # cc/lib and cc/config go into both outputs: compiled once, with the op library's flags (they include no
    # Python or pybind11 header, so the config module's extra include directories would change nothing in them).
    op_sources = sources(OP_LIBRARY_SOURCES)
    op_objs = objects(op_sources, "cflags", "op")
    shared = dict(zip(op_sources, op_objs, strict=True))
    py_sources = sources(CONFIG_MODULE_SOURCES)
    py_own = objects([src for src in py_sources if src not in shared], "pyflags", "py")
    py_objs = [shared[src] for src in py_sources if src in shared] + py_own
    lines.append(
        f"build {_ninja_escape(op_library)}: link {' '.join(map(_ninja_escape, op_objs))} | "
        f"{_ninja_escape(version_script)}"
    )
    lines.append(f"  extra_ldflags = -Wl,--version-script={version_script}")
    lines.append(f"  name = {os.path.basename(op_library)}")
    lines.append(f"build {_ninja_escape(config_module)}: link {' '.join(map(_ninja_escape, py_objs))}")
    lines.append(f"  name = {os.path.basename(config_module)}")
    lines.append("  extra_ldflags =")
    path = os.path.join(build_dir, "build.ninja")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _stable_link(build_dir: str, name: str, target: str) -> str:
    """build_dir/sys/<name>, a symbolic link to target (re-pointed on every call); returns the link's path."""
    link = os.path.join(build_dir, "sys", name)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.islink(link) or os.path.exists(link):
        if os.path.islink(link) and os.readlink(link) == target:
            return link
        os.remove(link)
    os.symlink(target, link)
    return link


def _system_include(flag: str, include_dir: str, replacement: str) -> str:
    """TensorFlow's `-I<include_dir>` as `-isystem<replacement>`; every other flag unchanged."""
    return "-isystem" + replacement if flag == "-I" + include_dir else flag


def write_build_info(directory: str, config: dict, source_dir: str | None = None, editable: bool = False) -> None:
    """Records what the libraries were built against, for the loader's checks: the TensorFlow version and its ABI
    flags; and where they were built from (the loader's error names the command that rebuilds from there)."""
    info = {"tensorflow_version": config["tf_version"], "abi_flags": abi_flags(config["compile_flags"])}
    if source_dir:
        info.update(source_dir=source_dir, editable=editable)
    with open(os.path.join(directory, "_build_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f)


def _which(program: str) -> str | None:
    for d in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(d, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def python_build_config() -> dict:
    """Headers and extension suffix of this interpreter and its pip pybind11, for the config module."""
    import importlib.machinery

    import pybind11

    return {
        "python_include_dir": sysconfig.get_paths()["include"],
        "pybind11_include_dir": pybind11.get_include(),
        # The loader looks for "_tf_embed_ops" + EXTENSION_SUFFIXES[0]; setuptools names extensions the same way.
        "ext_suffix": importlib.machinery.EXTENSION_SUFFIXES[0],
    }


def opt_flags() -> list[str]:
    """Our optimisation flags, the sanitizer flags (TF_EMBED_OPS_SANITIZE; they come later, so their -O1 wins),
    plus the user's TF_EMBED_OPS_CXXFLAGS (e.g. "-march=native")."""
    return OPT_FLAGS + sanitize_flags()[0] + os.environ.get("TF_EMBED_OPS_CXXFLAGS", "").split()


def _bazelrc_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sanitizer_runtime_env() -> dict:
    """What a Python process needs to load libraries built with both sanitizers: the runtimes of this compiler
    preloaded (Python itself is not instrumented), leak checks off (the interpreter's allocations at exit are
    not leaks of ours), and a halt with a stack trace at the first report."""
    import subprocess  # pylint: disable=import-outside-toplevel

    cxx = os.environ.get("CXX", "g++")
    runtimes = [
        subprocess.check_output([cxx, f"-print-file-name={lib}"], text=True).strip()
        for lib in ("libasan.so", "libubsan.so")
    ]
    return {
        "LD_PRELOAD": " ".join(runtimes),
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }


def _bazelrc_asan_lines() -> list[str]:
    """`--config=asan` (declared in .bazelrc): the sanitizer flags of sanitize_flags(), and the runtime for py_test."""
    saved = os.environ.get("TF_EMBED_OPS_SANITIZE")
    os.environ["TF_EMBED_OPS_SANITIZE"] = ",".join(SANITIZERS)
    try:
        copts, linkopts = sanitize_flags()
    finally:
        if saved is None:
            del os.environ["TF_EMBED_OPS_SANITIZE"]
        else:
            os.environ["TF_EMBED_OPS_SANITIZE"] = saved
    lines = [f"build:asan --copt={flag}" for flag in copts] + [f"build:asan --linkopt={flag}" for flag in linkopts]
    lines.append("build:asan --strip=never")
    try:
        env = sanitizer_runtime_env()
    except (OSError, ValueError):  # no compiler to ask: the build config still works, tests need the env by hand
        return lines
    return lines + [f"test:asan --test_env={name}={_bazelrc_quote(value)}" for name, value in env.items()]


def write_bazelrc(config: dict, python: dict | None = None) -> str:
    """Writes .tf_configure.bazelrc, imported by .bazelrc: everything bazel's repository rules
    (third_party/tf, third_party/python) and py_test need to know about the installed TensorFlow and Python.

    Returns the path of the file.
    """
    python = python or python_build_config()
    repo_env = {
        "TF_HEADER_DIR": config["include_dir"],
        "TF_SHARED_LIBRARY_DIR": config["lib_dir"],
        "TF_COMPILE_FLAGS": " ".join(config["compile_flags"]),
        "TF_LINK_FLAGS": " ".join(config["link_flags"]),
        "TF_VERSION": config["tf_version"],
        "TF_EMBED_OPS_COPTS": " ".join(opt_flags()),
        "PYTHON_INCLUDE_DIR": python["python_include_dir"],
        "PYBIND11_INCLUDE_DIR": python["pybind11_include_dir"],
        "PYTHON_EXT_SUFFIX": python["ext_suffix"],
    }
    lines = ["# Generated by configure.py; do not edit."]
    lines += [f"build --repo_env={name}={_bazelrc_quote(value)}" for name, value in repo_env.items()]
    # py_test runs this interpreter (with its TensorFlow) rather than a registered Python toolchain.
    lines.append(f"build --python_path={_bazelrc_quote(sys.executable)}")
    lines += _bazelrc_asan_lines()
    path = os.path.join(ROOT, ".tf_configure.bazelrc")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _main(argv: list[str] | None = None) -> None:
    import argparse  # pylint: disable=import-outside-toplevel

    parser = argparse.ArgumentParser(description="Writes .tf_configure.bazelrc (default) or a ninja build.")
    parser.add_argument("--sanitize", metavar="LIST", help="e.g. address,undefined (same as TF_EMBED_OPS_SANITIZE)")
    parser.add_argument(
        "--ninja",
        metavar="BUILD_DIR",
        help="write BUILD_DIR/build.ninja building both shared objects into BUILD_DIR/out (then run ninja -C it)",
    )
    args = parser.parse_args(argv)
    if args.sanitize is not None:
        os.environ["TF_EMBED_OPS_SANITIZE"] = args.sanitize
    cfg = tf_build_config()
    check_supported(cfg["tf_version"])
    if args.ninja:
        suffix = python_build_config()["ext_suffix"]
        out = os.path.join(os.path.abspath(args.ninja), "out")
        os.makedirs(out, exist_ok=True)
        print(
            "wrote",
            write_ninja(
                os.path.abspath(args.ninja),
                os.path.join(out, "_tf_embed_ops" + suffix),
                os.path.join(out, "_config" + suffix),
                cfg,
            ),
        )
        write_build_info(out, cfg)
        return
    print(json.dumps(cfg, indent=2))
    print("wrote", write_bazelrc(cfg))


if __name__ == "__main__":
    _main()
