"""The one macro for tf_embed_ops' TensorFlow op libraries, and the compile flags every C++ target shares.

All flags come from `python3 configure.py` (tf.sysconfig, through @local_config_tf), exactly as setup.py's
ninja build gets them; nothing ABI- or -std-related is written here.
"""

load("@local_config_tf//:defs.bzl", "TF_COPTS", "TF_EMBED_OPS_COPTS")

# Compile flags of every C++ target linked into an op library or the pybind11 module: TensorFlow's own
# (-std, ...; its -I and -D arrive with @local_config_tf//:tensorflow) followed by our optimisation flags.
TF_EMBED_COPTS = TF_COPTS + TF_EMBED_OPS_COPTS

# Op and kernel registrations run from static initialisers; only these symbols must be exported.
_VERSION_SCRIPT = "//cc:op_library.lds"

def tf_embed_op_library(name, srcs = [], deps = [], copts = [], linkopts = [], **kwargs):
    """A TensorFlow custom-op shared library, loadable with `tf.load_op_library`.

    Links the sources and deps (cc_libraries holding REGISTER_OP / REGISTER_KERNEL_BUILDER must be
    `alwayslink = True`) against the installed TensorFlow's libtensorflow_framework and libtensorflow_cc, and
    exports only what TensorFlow needs (cc/op_library.lds), like the pip build.

    Args:
      name: the file name of the library, ending in ".so".
      srcs: C++ sources compiled into it with TensorFlow's flags.
      deps: cc_library targets linked in whole.
      copts: extra compile flags for srcs.
      linkopts: extra linker flags.
      **kwargs: passed on to cc_binary (visibility, tags, ...).

    Example:
      tf_embed_op_library(name = "_my_ops.so", deps = ["//cc/kernels", "//cc/ops"])
    """
    if not name.endswith(".so"):
        fail("tf_embed_op_library %s: the name is the library's file name and must end in .so" % name)
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + ["@local_config_tf//:tensorflow"],
        copts = TF_EMBED_COPTS + copts,
        linkopts = ["-Wl,--version-script=$(location %s)" % _VERSION_SCRIPT] + linkopts,
        additional_linker_inputs = [_VERSION_SCRIPT],
        linkshared = True,
        **kwargs
    )

def tf_embed_layer_library(name, deps = [], **kwargs):
    """The cc_library of one layer package under cc/ (config, ops, kernels, python).

    Globs the package's *.cc and *.h (as configure.py's source lists do, so a new file is picked up by both
    builds), compiles them with TF_EMBED_COPTS, and links them whole (alwayslink: REGISTER_OP,
    REGISTER_KERNEL_BUILDER and module initialisers run from static initialisers and have no other referrer).
    Every layer but //cc/lib sees TensorFlow's headers, so @local_config_tf//:tensorflow is always a dependency.

    Args:
      name: the target's name (the package's name by convention, so it is addressed as //cc/<name>).
      deps: the layers below it (and any extra library, e.g. pybind11).
      **kwargs: passed on to cc_library (visibility, tags, ...).

    Example:
      tf_embed_layer_library(name = "ops", deps = ["//cc/config"])
    """
    native.cc_library(
        name = name,
        srcs = native.glob(["*.cc"]),
        hdrs = native.glob(["*.h"]),
        copts = TF_EMBED_COPTS,
        linkstatic = True,
        alwayslink = True,
        deps = deps + ["@local_config_tf//:tensorflow"],
        **kwargs
    )
