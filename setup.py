"""pip build of tf_embed_ops: the op library and the pybind11 config module, against the installed TensorFlow.

The TensorFlow is the environment's own (configure.tf_build_config; tools/pep517_backend.py brings one into pip's
build environment only when the environment has none), and the package version says which minor the libraries are
for: pyproject.toml's [tool.tf_embed_ops] version plus a local label, 0.1.0+tf221 for TensorFlow 2.21.x.

Compilation is delegated to ninja (incremental, parallel, header dependencies tracked); every flag comes from
configure.py, which reads tf.sysconfig.

The ninja directory lives in the source tree (build/ninja/<TensorFlow version>-<flags hash>), not in setuptools'
build_temp: an editable install gets a fresh temporary build_temp every time, so everything would compile again.
With the directory kept, reinstalling an unchanged tree compiles nothing (only the two links run again).
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import configure  # noqa: E402

OP_LIBRARY = "tf_embed_ops._tf_embed_ops"
CONFIG_MODULE = "tf_embed_ops._config"


class NinjaBuildExt(build_ext):
    """Builds both shared objects with one ninja invocation, then places them like normal extensions."""

    def build_extensions(self):
        config = configure.tf_build_config()
        configure.check_supported(config["tf_version"])
        expected = configure.version_suffix(config["tf_version"])
        if not self.distribution.get_version().endswith("+" + expected):
            raise RuntimeError(
                f"tf_embed_ops: the package version {self.distribution.get_version()} was computed for another "
                f"TensorFlow than the one the build found ({config['tf_version']}): build again"
            )
        build_dir = ninja_build_dir(config, configure.python_build_config())
        staged = {ext.name: os.path.join(build_dir, "out", ext.name.split(".")[-1] + ".so") for ext in self.extensions}
        ninja_file = configure.write_ninja(build_dir, staged[OP_LIBRARY], staged[CONFIG_MODULE], config)
        jobs = os.environ.get("TF_EMBED_OPS_JOBS", str(os.cpu_count() or 1))
        announce(
            f"tf_embed_ops: building the C++ op library in {os.path.relpath(build_dir, HERE)} "
            f"(ninja -j {jobs}; an unchanged tree recompiles nothing)"
        )
        run_ninja([_ninja(), "-C", build_dir, "-f", ninja_file, "-j", jobs], env=ninja_env())
        for ext in self.extensions:
            target = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            replace_file(staged[ext.name], target)
        configure.write_build_info(
            os.path.dirname(self.get_ext_fullpath(OP_LIBRARY)),
            config,
            source_dir=HERE,
            editable=bool(self.inplace or getattr(self, "editable_mode", False)),
        )

    def copy_extensions_to_source(self):
        # `build_ext --inplace` and editable installs build into build/lib and then copy only the declared
        # extensions back into the source tree; the loader's build record must travel with them.
        build_py = self.get_finalized_command("build_py")
        package_dir = os.path.abspath(build_py.get_package_dir("tf_embed_ops"))
        # setuptools copies into the existing file; a process that has the library loaded (a test run during a
        # reinstall) would then read truncated pages.  Unlinking first gives the copy a new inode.
        for ext in self.extensions:
            in_place = os.path.join(package_dir, os.path.basename(self.get_ext_filename(ext.name)))
            if os.path.exists(in_place):
                os.remove(in_place)
        super().copy_extensions_to_source()
        built = os.path.join(self.build_lib, "tf_embed_ops", "_build_info.json")
        shutil.copyfile(built, os.path.join(package_dir, "_build_info.json"))


def ninja_build_dir(config: dict, python: dict, root: str = HERE) -> str:
    """build/ninja/tf<version>-<hash>: one directory per TensorFlow version, compiler and flags.

    The hash leaves out where TensorFlow and pybind11 are installed (pip's build isolation picks a new /tmp path
    each time; configure.write_ninja reaches them through stable links), so reinstalling reuses the objects.
    Headers of -isystem directories are not dependency-tracked by ninja, hence the version in the key.
    """
    paths = (config["include_dir"], config["lib_dir"])

    def without_paths(flags: list) -> list:
        return [flag for flag in flags if not any(p in flag for p in paths)]

    key = {
        "tf_version": config["tf_version"],
        "compile_flags": without_paths(config["compile_flags"]),
        "link_flags": without_paths(config["link_flags"]),
        "opt_flags": configure.opt_flags(),
        "cxx": os.environ.get("CXX", "g++"),
        "python": [python["python_include_dir"], python["ext_suffix"], _pybind11_version()],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return os.path.join(root, "build", "ninja", f"tf{config['tf_version']}-{digest}")


def package_version(root: str = HERE) -> str:
    """pyproject.toml's [tool.tf_embed_ops] version, plus "+tf<major><minor>" of the TensorFlow the build uses
    (none yet while pip only asks for the build requirements: the version is not used then)."""
    with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("[tool.tf_embed_ops]") :]
    base = re.search(r'^version = "([^"]+)"$', section, re.MULTILINE).group(1)
    tf_version = configure.installed_tf_version()
    return f"{base}+{configure.version_suffix(tf_version)}" if tf_version else base


def replace_file(source: str, target: str) -> None:
    """Copies source over target as a new file (rename), never rewriting a library a process has mapped."""
    tmp = target + ".tmp"
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def ninja_env() -> dict:
    """ccache (when configure.py uses it) sees paths relative to the source tree: checkouts share hits."""
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", HERE)
    return env


def _pybind11_version() -> str:
    import pybind11  # pylint: disable=import-outside-toplevel

    return pybind11.__version__


def _terminal():
    """The user's terminal when our stdout is not it (pip captures a build's output and shows it only with -v
    or on failure, leaving a silent spinner for minutes); None when there is none (CI) or stdout already is it.
    TF_EMBED_OPS_PROGRESS=0 turns this off."""
    if os.environ.get("TF_EMBED_OPS_PROGRESS", "1") == "0" or sys.stdout.isatty():
        return None
    try:
        return open("/dev/tty", "w", encoding="utf-8")
    except OSError:
        return None


def announce(message: str, terminal=None) -> None:
    print(message, flush=True)
    tty = terminal or _terminal()
    if tty is not None:
        tty.write(message + "\n")
        tty.flush()
        if terminal is None:
            tty.close()


def run_ninja(command: list, env: dict | None = None, terminal=None) -> None:
    """Runs ninja; its output goes to stdout, and its "[n/N] CXX file" progress lines also to the terminal."""
    tty = terminal if terminal is not None else _terminal()
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                if tty is not None and (line.startswith("[") or line.startswith("ninja: no work")):
                    tty.write("  " + line)
                    tty.flush()
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, command)
    finally:
        if tty is not None and terminal is None:
            tty.close()


def _ninja() -> str:
    found = shutil.which("ninja")
    if found:
        return found
    import ninja

    return os.path.join(ninja.BIN_DIR, "ninja")


if __name__ == "__main__":  # pip's setuptools backend and `python setup.py` both run this file as __main__
    setup(
        version=package_version(),
        ext_modules=[Extension(OP_LIBRARY, sources=[]), Extension(CONFIG_MODULE, sources=[])],
        cmdclass={"build_ext": NinjaBuildExt},
    )
