"""tf_embed_ops.formats.atomic_write: the one atomic write of every file and directory other processes read.

Checked against the file system itself: what is on disk after a write, a failed write (the function raising, an
injected ENOSPC or EACCES) and a killed writer's temporaries.
"""

import errno
import os
import subprocess
import sys
import threading

import pytest
import tensorflow as tf

from tests import fault_support as support
from tf_embed_ops.formats import atomic_write


def test_a_file_is_written_and_replaced_whole(tmp_path):
    path = str(tmp_path / "f")
    assert atomic_write.write_file(path, b"old") == 3
    assert atomic_write.write_file(path, lambda f: f.write(b"new!")) == 4
    assert support.files(tmp_path) == {"f": b"new!"}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = str(tmp_path / "f")
    atomic_write.write_file(path, b"old")

    def half(f):
        f.write(b"half")
        raise ValueError("the writer failed")

    with pytest.raises(ValueError, match="the writer failed"):
        atomic_write.write_file(path, half)
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", support.no_space)
        with pytest.raises(tf.errors.ResourceExhaustedError, match=rf"^{path}: .*errno 28.*nothing was written"):
            atomic_write.write_file(path, b"new")
    with monkeypatch.context() as m:
        m.setattr(os, "replace", lambda *_: (_ for _ in ()).throw(PermissionError(errno.EACCES, "Permission denied")))
        with pytest.raises(PermissionError) as err:
            atomic_write.write_file(path, b"new")
    assert err.value.filename == path and "nothing was written" in str(err.value)
    assert support.files(tmp_path) == {"f": b"old"}


def test_temporary_names_are_unique_across_threads():
    names, lock = [], threading.Lock()

    def take():
        mine = [atomic_write.temporary_path("/x/f") for _ in range(200)]
        with lock:
            names.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(names)) == 1600 and all(n.startswith(f"/x/f.tmp-{os.getpid()}-") for n in names)


def test_a_directory_is_written_whole_and_replaced_only_when_asked(tmp_path):
    path = str(tmp_path / "d")

    def fill(content):
        def write(tmp):
            with open(os.path.join(tmp, "a"), "w") as f:
                f.write(content)
            return content

        return write

    assert atomic_write.write_directory(path, fill("1")) == "1"
    with pytest.raises(OSError) as err:  # not empty, not replaced
        atomic_write.write_directory(path, fill("2"))
    assert err.value.filename == path
    assert atomic_write.write_directory(path, fill("3"), replace=True) == "3"

    def broken(tmp):
        fill("4")(tmp)
        raise RuntimeError("fill failed")

    with pytest.raises(RuntimeError, match="fill failed"):
        atomic_write.write_directory(path, broken, replace=True)
    assert support.files(tmp_path) == {"d/a": b"3"}


def test_only_the_temporaries_of_writers_that_are_gone_are_removed_from_a_shared_directory(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(gone.stdout), os.getppid()
    for pid in (dead, alive, os.getpid()):
        (tmp_path / f"export.tmp-{pid}-0-abc").mkdir()
    (tmp_path / "export.tmp-old").mkdir()  # no process id: kept
    removed = atomic_write.remove_temporaries(str(tmp_path), "export.tmp-", only_dead_writers=True)
    assert removed == [str(tmp_path / f"export.tmp-{dead}-0-abc")]
    assert len(atomic_write.remove_temporaries(str(tmp_path))) == 3 and os.listdir(tmp_path) == []
