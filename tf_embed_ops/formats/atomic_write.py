"""One atomic write for every file and directory other processes read (docs/reliability.md, "Files on disk").

A writer fills a temporary sibling of the final path, syncs it (the file, or every file and folder of the
directory), renames it into place and syncs the parent directory, so a reader sees the old content or the new
content, never a mix, and a crash at any point leaves the old content. The temporary name is unique per call (the
process id, a per-process counter and a random part), so threads and processes writing beside each other never
share one. A write that fails removes its temporary and raises one error naming the final path: a full disk or
quota (ENOSPC, EDQUOT) as `tf.errors.ResourceExhaustedError`, any other `OSError` as an `OSError` of the same
errno, a TensorFlow `OpError` of the writer as the same class; each message ends with "nothing was written".

Temporaries of a writer that was killed (SIGKILL, a power cut) carry `TEMPORARY_MARK` and the writer's process id:
`remove_temporaries` removes them (every one, for a directory a single owner writes; or only those of processes
that are gone, for a directory several writers share).

Standard library only (TensorFlow is imported when an error is converted), so the format readers that run
without TensorFlow can import it.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from typing import Any, BinaryIO

__all__ = [
    "TEMPORARY_MARK",
    "remove",
    "remove_temporaries",
    "sync_directory",
    "sync_tree",
    "temporary_path",
    "write_directory",
    "write_file",
]

TEMPORARY_MARK = ".tmp-"
_counter = itertools.count()
_counter_lock = threading.Lock()
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def temporary_path(path: str) -> str:
    """A temporary sibling of `path` no other call (thread or process) uses: `<path>.tmp-<pid>-<n>-<random>`."""
    with _counter_lock:
        n = next(_counter)
    return f"{path}{TEMPORARY_MARK}{os.getpid()}-{n}-{uuid.uuid4().hex[:8]}"


def sync_directory(directory: str) -> None:
    """fsync of a directory (its entries: a rename into it is durable after this)."""
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: str) -> None:
    """fsync of every file and directory under `root` (a directory written before it is renamed into place)."""
    for parent, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(parent, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_directory(parent)


def write_file(path: str, data: bytes | Callable[[BinaryIO], Any]) -> int:
    """Writes a file atomically: a temporary sibling, file fsync, rename, directory fsync.

    Args:
      path: the final path (its directory must exist).
      data: the bytes, or a function that writes them to the open binary file it is given.

    Returns:
      The file's size in bytes.

    Raises:
      tf.errors.ResourceExhaustedError: a full disk or quota, naming `path`; OSError: any other failure of the
      file system, naming `path`. Either way the temporary is removed and `path` is as it was.
    """
    path = os.fspath(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "xb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
        sync_directory(os.path.dirname(path))
    except BaseException as e:
        remove(tmp)
        _reraise(path, e)
    return size


def write_directory(path: str, fill: Callable[[str], Any], replace: bool = False) -> Any:
    """Writes a directory atomically: `fill(tmp)` into a temporary sibling, every file and folder synced, rename,
    parent directory fsync.

    Args:
      path: the final directory (its parent is created if needed).
      fill: writes the directory's content into the (existing, empty) temporary directory it is given.
      replace: an existing directory at `path` is replaced (moved aside, then removed once the new one is in
        place); the caller checks before that it may be. Without it, an existing non-empty `path` is refused by
        the rename (`OSError`, nothing written).

    Returns:
      What `fill` returned.

    Raises:
      tf.errors.ResourceExhaustedError / OSError / the `tf.errors.OpError` of `fill`, naming `path`, as
      `write_file`; any other exception of `fill` unchanged. The temporary is removed and `path` is as it was.
    """
    path = os.fspath(path).rstrip(os.sep) or os.sep
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = temporary_path(path)
    old = None
    try:
        os.mkdir(tmp)
        result = fill(tmp)
        sync_tree(tmp)
        if replace and os.path.isdir(path) and not os.path.islink(path):
            old = temporary_path(path)
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old, path)  # put the previous one back
                old = None
                raise
        else:
            os.rename(tmp, path)
        sync_directory(parent)
    except BaseException as e:
        remove(tmp)
        _reraise(path, e)
    finally:
        if old is not None:
            remove(old)
    return result


def remove_temporaries(directory: str, prefix: str = "", only_dead_writers: bool = False) -> list[str]:
    """Removes the temporaries of writes that never finished (a killed writer) from `directory`.

    Args:
      directory: where to look (not recursive).
      prefix: only entries whose name starts with it (e.g. an export's base name).
      only_dead_writers: keep the temporaries of processes still running (this one included), for a directory
        that several writers share; names without a process id are kept too.

    Returns:
      The paths removed.
    """
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if TEMPORARY_MARK not in name or not name.startswith(prefix):
            continue
        if only_dead_writers and not _writer_is_gone(name):
            continue
        path = os.path.join(directory, name)
        remove(path)
        removed.append(path)
    return removed


def _writer_is_gone(name: str) -> bool:
    pid = name.rsplit(TEMPORARY_MARK, 1)[1].split("-", 1)[0]
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (another user's)
    return False


def remove(path: str) -> None:
    """Removes a file or a directory tree if it exists (best effort: never raises)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass  # best effort: the failure being reported matters more


def _reraise(path: str, error: BaseException) -> None:
    """Raises `error` as the one error of a failed write naming `path` (see the module docstring)."""
    if isinstance(error, OSError):
        detail = error.strerror or str(error)
        if error.errno in _NO_SPACE:
            import tensorflow as tf  # pylint: disable=import-outside-toplevel

            raise tf.errors.ResourceExhaustedError(
                None, None, f"{path}: {detail} (errno {error.errno}) while writing it; nothing was written"
            ) from error
        raise OSError(error.errno, f"{detail} while writing {path}; nothing was written", path) from error
    tf_errors = _tf_errors()
    if tf_errors is not None and isinstance(error, tf_errors.OpError):
        message = error.message
        if message.startswith(f"{path}: "):
            raise error
        if not message.endswith("nothing was written"):
            message += "; nothing was written"
        raise type(error)(error.node_def, error.op, f"{path}: {message}") from None
    raise error


def _tf_errors() -> Any:
    import sys  # pylint: disable=import-outside-toplevel

    tf = sys.modules.get("tensorflow")  # an OpError exists only once TensorFlow is loaded
    return getattr(tf, "errors", None) if tf is not None else None
