"""te.serving.Publisher and te.keras.export_for_serving under faults: concurrent publishes, a full disk, broken
manifests, bad arguments, non-finite rows, export targets that hold other files, and a killed export.

Each refusal is checked for its error (naming the file or the argument) and for what it leaves: the directory's
files bitwise as they were, no temporary behind, and the training tables unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests import fault_support as support
from tests import serving_delta_util as util
from tf_embed_ops.serving import Publisher, read_manifest


# ------------------------------------------------------------------------------------------------ threads
def test_concurrent_publishes_while_training_make_one_ordered_chain(tmp_path):
    """Two threads publishing deltas while a third trains: versions 1, 2, 3, ... in the manifest's order, each
    delta based on the version before it, and a servable applies the whole chain."""
    model, _, _ = util.dynamic_model()
    util.fit(model, seed=0)
    directory = str(tmp_path / "chain")
    pub = Publisher(model, directory, util.SIGNATURE, min_free_slots=4096)
    pub.publish_full()
    seeds = iter(range(1, 10**6))
    errors = support.race(
        pub.publish_delta, times=4, threads=2, train=lambda: util.fit(model, next(seeds), high=util.V)
    )
    assert errors == []
    chain = read_manifest(directory)["chain"]
    assert [e["version"] for e in chain] == list(range(1, 10))
    assert all(e["base"] == e["version"] - 1 for e in chain if e["kind"] == "delta")
    assert not support.temporaries(directory)
    served = tf.saved_model.load(os.path.join(directory, "1"))
    for entry in chain[1:]:
        if entry["kind"] == "delta":
            path = tf.constant(os.path.join(directory, entry["path"]))
            assert int(served.signatures["apply_delta"](path=path)["version"]) == entry["version"]


# ------------------------------------------------------------------------------------------------ full disk
@pytest.mark.parametrize("kind", ["delta", "full"])
def test_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch, kind):
    model, _, _ = util.dynamic_model()
    util.fit(model, seed=0)
    directory = str(tmp_path / "chain")
    pub = Publisher(model, directory, util.SIGNATURE, min_free_slots=256)
    pub.publish_full()
    util.fit(model, seed=1)
    before = support.files(directory)
    target = os.path.join(directory, "deltas", "2.delta") if kind == "delta" else os.path.join(directory, "2")
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", support.no_space)
        with pytest.raises(tf.errors.ResourceExhaustedError) as err:
            pub.publish_delta() if kind == "delta" else pub.publish_full()
    assert err.value.message.startswith(f"{target}: ") and "nothing was written" in err.value.message
    assert support.files(directory) == before and not support.temporaries(directory)
    assert pub.version == 1
    # Nothing was lost: the next delta holds the rows and applies.
    assert pub.publish_delta() == 2
    served = tf.saved_model.load(os.path.join(directory, "1"))
    path = tf.constant(os.path.join(directory, "deltas", "2.delta"))
    assert int(served.signatures["apply_delta"](path=path)["version"]) == 2


# ------------------------------------------------------------------------------------------------ manifests
@pytest.mark.parametrize(
    "content",
    ["{", "[1, 2, 3]", '{"chain": [1]}', '{"chain": [{"version": "1", "kind": "full"}]}', '{"model_id": 3}', "7"],
)
def test_a_broken_manifest_is_refused_naming_it(tmp_path, content):
    (tmp_path / "MANIFEST.json").write_text(content)
    model, _, _ = util.dynamic_model()
    with pytest.raises(ValueError, match=r"MANIFEST\.json: "):
        Publisher(model, str(tmp_path), util.SIGNATURE)
    assert support.files(tmp_path) == {"MANIFEST.json": content.encode()} and os.listdir(tmp_path) == ["MANIFEST.json"]
    with pytest.raises(ValueError, match=r"MANIFEST\.json: "):
        read_manifest(str(tmp_path))


# ------------------------------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"dense_every": 1.5}, "dense_every: must be an integer, got 1.5"),
        ({"dense_every": "2"}, "dense_every: must be an integer, got '2'"),
        ({"dense_every": True}, "dense_every: must be an integer, got True"),
        ({"dense_every": 0}, r"dense_every: must be in \[1, "),
        ({"dynamic_headroom": float("nan")}, "dynamic_headroom: must be a finite number >= 0, got nan"),
        ({"dynamic_headroom": -0.5}, "dynamic_headroom: must be a finite number >= 0, got -0.5"),
        ({"dynamic_headroom": "1"}, "dynamic_headroom: must be a finite number >= 0, got '1'"),
        ({"min_free_slots": -1}, r"min_free_slots: must be in \[0, "),
        ({"min_free_slots": 2.5}, "min_free_slots: must be an integer, got 2.5"),
        ({"model_id": ""}, "model_id: must be a non-empty string or None, got ''"),
        ({"model_id": 7}, "model_id: must be a non-empty string or None, got 7"),
    ],
)
def test_bad_arguments_are_refused_naming_them(tmp_path, kwargs, words):
    model, _, _ = util.dynamic_model()
    with pytest.raises(ValueError, match=words):
        Publisher(model, str(tmp_path / "chain"), util.SIGNATURE, **kwargs)
    assert not (tmp_path / "chain").exists()


# ------------------------------------------------------------------------------------------------ non-finite rows
def test_a_non_finite_row_is_not_published(tmp_path):
    model, layer, _ = util.dynamic_model()
    util.fit(model, seed=0)
    directory = str(tmp_path / "chain")
    pub = Publisher(model, directory, util.SIGNATURE, min_free_slots=256)
    pub.publish_full()
    static = [v for c, v in layer.embedding_tables.items() if c.name == "static"][0]
    trained = static.numpy()
    util.fit(model, seed=1)
    row = int(np.flatnonzero(np.any(static.numpy() != trained, axis=1))[0])  # trained since: the tracker lists it
    poisoned = static.numpy()
    poisoned[row] = np.nan
    static.assign(poisoned)
    before = support.files(directory)
    with pytest.raises(ValueError, match=rf"table 'static': row {row} is nan \(not finite\).*nothing was written"):
        pub.publish_delta()
    assert support.files(directory) == before and pub.version == 1


# ------------------------------------------------------------------------------------------------ export targets
def _export(model, path):
    return te.keras.export_for_serving(model, path, util.SIGNATURE)


def test_an_export_never_replaces_a_directory_it_did_not_write(tmp_path, monkeypatch):
    model, _, _ = util.dynamic_model()
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "notes.txt").write_text("mine")
    (project / "src" / "main.py").write_text("print(1)")
    before = support.files(project)
    with pytest.raises(ValueError, match=r"project is a non-empty directory that is not a previous export"):
        _export(model, str(project))
    monkeypatch.chdir(project)
    with pytest.raises(ValueError, match=r"not a previous export \(notes\.txt, src\)"):
        _export(model, ".")  # what a new user typed
    assert support.files(project) == before and sorted(os.listdir(tmp_path)) == ["project"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"file exists and is not a directory"):
        _export(model, str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "x"
    # An extra file inside a previous export makes it one no more.
    export = str(tmp_path / "export")
    _export(model, export)
    (tmp_path / "export" / "README").write_text("kept")
    with pytest.raises(ValueError, match=r"not a previous export \(README\)"):
        _export(model, export)
    assert (tmp_path / "export" / "README").read_text() == "kept"


def test_an_export_replaces_an_earlier_export_or_an_empty_directory(tmp_path):
    model, _, _ = util.dynamic_model()
    (tmp_path / "empty").mkdir()
    _export(model, str(tmp_path / "empty"))
    util.fit(model, seed=0)
    _export(model, str(tmp_path / "empty"))  # the previous export is replaced
    assert te.serving.read_export_metadata(str(tmp_path / "empty"))
    assert sorted(os.listdir(tmp_path)) == ["empty"]


def test_a_full_disk_during_an_export_names_it_and_keeps_the_previous_one(tmp_path, monkeypatch):
    model, _, _ = util.dynamic_model()
    export = str(tmp_path / "export")
    _export(model, export)
    before = support.files(tmp_path)
    util.fit(model, seed=0)
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", support.no_space)
        with pytest.raises(tf.errors.ResourceExhaustedError, match=rf"{export}: .*nothing was written"):
            _export(model, export)
    assert support.files(tmp_path) == before and not support.temporaries(tmp_path)


_KILLED_EXPORT = """
import os, sys, time
sys.path.insert(0, {root!r})
from tests import fault_support as support
from tests import serving_delta_util as util
import tf_embed_ops as te
from tf_embed_ops.serving import metadata

def hang(*args, **kwargs):
    print("writing", flush=True)
    time.sleep(600)

metadata.write_export_metadata = hang
model, _, _ = util.dynamic_model()
te.keras.export_for_serving(model, {path!r}, util.SIGNATURE)
"""


@pytest.mark.slow  # a child process that builds a model and is killed mid-export
def test_the_temporary_of_a_killed_export_is_removed_by_the_next_export(tmp_path):
    export = str(tmp_path / "export")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = _KILLED_EXPORT.format(root=root, path=export)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        assert proc.stdout.readline().strip() == "writing"  # inside the export, its SavedModel written
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = [n for n in os.listdir(tmp_path) if n.startswith("export.tmp-")]
    assert left and not os.path.exists(export)
    model, _, _ = util.dynamic_model()
    _export(model, export)
    assert os.listdir(tmp_path) == ["export"]
    assert te.serving.read_export_metadata(export)
