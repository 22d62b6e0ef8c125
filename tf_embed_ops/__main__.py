"""Command line: ``python -m tf_embed_ops inspect CONFIG [--json]``, ``python -m tf_embed_ops inspect-export DIR`` and
``python -m tf_embed_ops import-tfra SRC DST`` (a TFRA checkpoint converted: ``tf_embed_ops.tfra.checkpoint_import``).

CONFIG is a ``.pb`` / ``.pbtxt`` TPUEmbeddingConfiguration, or the word ``example`` for the bundled example.
A config that does not load exits with status 1 and the validator's message on stderr (no traceback).

DIR is a SavedModel written by ``tf_embed_ops.keras.export_for_serving``: ``inspect-export`` prints, per table, the
rows kept of those trained, the bytes, the quantization and the pruning applied, from the metadata the export
records (plain JSON: neither TensorFlow nor the op library is loaded).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence

# Each command: (its line in the command list, its own help page's description).
_COMMANDS = {
    "inspect": (
        "validate a TPUEmbeddingConfiguration and print its tables, features, optimizers and tags",
        "Validate a TPUEmbeddingConfiguration (the same C++ checks the ops run) and print it.",
    ),
    "inspect-export": (
        "print the tables of a serving export: rows, bytes, quantization and pruning",
        "Print what export_for_serving recorded about each table of a SavedModel (no TensorFlow needed).",
    ),
    "import-tfra": (
        "convert a TensorFlow Recommenders-Addons checkpoint for tf_embed_ops.tfra (docs/migrating.md)",
        "Convert a TFRA tf.train.Checkpoint (de.Variable tables, optimizer slots, dense weights).",
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tf_embed_ops", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    parsers = {
        name: commands.add_parser(name, help=summary, description=text) for name, (summary, text) in _COMMANDS.items()
    }
    inspect, export, tfra = parsers["inspect"], parsers["inspect-export"], parsers["import-tfra"]
    inspect.add_argument("config", help="path to a .pb (binary) or .pbtxt (text) config, or 'example'")
    inspect.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    export.add_argument("directory", help="the SavedModel directory export_for_serving wrote")
    export.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    tfra.add_argument("src", help="the TFRA checkpoint prefix (or its directory)")
    tfra.add_argument("dst", help="the prefix of the checkpoint to write")
    tfra.add_argument(
        "--initial-accumulator-value", type=float, default=1e-7, help="Adagrad accumulator of keys without a slot row"
    )
    return parser


@contextlib.contextmanager
def _native_stderr_held_back() -> Iterator[None]:
    """Holds back what native code writes to fd 2 (TensorFlow's start-up logging) unless the block fails.

    TF_CPP_MIN_LOG_LEVEL does not silence the absl messages TensorFlow prints while loading, and they would
    bury the one line a failing ``inspect`` is meant to print.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _inspect(config: str, as_json: bool) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with _native_stderr_held_back():
        from tf_embed_ops import _loader
        from tf_embed_ops import config as tec

        _loader.load_config_module()

    path = tec.example_config_path() if config == "example" else config
    try:
        cfg = tec.load(path)
    except (ValueError, OSError) as e:  # ConfigError is a ValueError
        print(f"error: {path}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(tec.format_json(cfg) if as_json else tec.format_text(cfg, title=f"config: {path}"))
    return 0


def _inspect_export(directory: str, as_json: bool) -> int:
    import json  # pylint: disable=import-outside-toplevel

    from tf_embed_ops.serving import metadata  # pylint: disable=import-outside-toplevel  (json only, no TensorFlow)

    try:
        tables = metadata.read_export_metadata(directory)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    total = metadata.saved_model_bytes(directory)
    if as_json:
        sys.stdout.write(json.dumps({"saved_model_bytes": total, "tables": tables}, indent=1, sort_keys=True) + "\n")
    else:
        sys.stdout.write(metadata.format_text(directory, tables, total))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tf_embed_ops`` and the ``tf-embed-ops`` script; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "inspect":
        return _inspect(args.config, args.json)
    if args.command == "inspect-export":
        return _inspect_export(args.directory, args.json)
    if args.command == "import-tfra":
        from tf_embed_ops.tfra import checkpoint_import  # pylint: disable=import-outside-toplevel

        return checkpoint_import.main(args.src, args.dst, args.initial_accumulator_value)
    return 2  # unreachable: argparse enforces the sub-command


if __name__ == "__main__":
    sys.exit(main())
