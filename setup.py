"""pip build of tf_embed_ops: the op library and the pybind11 config module, against the installed TensorFlow.

Compilation is delegated to ninja (incremental, parallel, header dependencies tracked); every flag comes from
configure.py, which reads tf.sysconfig.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import configure

OP_LIBRARY = "tf_embed_ops._tf_embed_ops"
CONFIG_MODULE = "tf_embed_ops._config"


class NinjaBuildExt(build_ext):
    """Builds both shared objects with one ninja invocation, then places them like normal extensions."""

    def build_extensions(self):
        config = configure.tf_build_config()
        build_dir = os.path.abspath(os.path.join(self.build_temp, "ninja"))
        staged = {ext.name: os.path.join(build_dir, "out", ext.name.split(".")[-1] + ".so") for ext in self.extensions}
        ninja_file = configure.write_ninja(build_dir, staged[OP_LIBRARY], staged[CONFIG_MODULE], config)
        jobs = os.environ.get("TF_EMBED_OPS_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call([_ninja(), "-C", build_dir, "-f", ninja_file, "-j", jobs])
        for ext in self.extensions:
            target = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(staged[ext.name], target)
        configure.write_build_info(os.path.dirname(self.get_ext_fullpath(OP_LIBRARY)), config)

    def copy_extensions_to_source(self):
        # `build_ext --inplace` and editable installs build into build/lib and then copy only the declared
        # extensions back into the source tree; the loader's build record must travel with them.
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        package_dir = os.path.abspath(build_py.get_package_dir("tf_embed_ops"))
        built = os.path.join(self.build_lib, "tf_embed_ops", "_build_info.json")
        shutil.copyfile(built, os.path.join(package_dir, "_build_info.json"))


def _ninja() -> str:
    found = shutil.which("ninja")
    if found:
        return found
    import ninja

    return os.path.join(ninja.BIN_DIR, "ninja")


setup(
    ext_modules=[Extension(OP_LIBRARY, sources=[]), Extension(CONFIG_MODULE, sources=[])],
    cmdclass={"build_ext": NinjaBuildExt},
)
