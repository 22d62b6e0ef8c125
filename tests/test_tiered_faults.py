"""Faults of tiered tables: a corrupted or mismatched row file, and a process killed mid-step.

Each fault must give a clear error (the table, the row or field, the path), and the last checkpoint must restore
the table: the row file is never the only copy of what a checkpoint promises.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import (
    assert_same_state,
    embedding,
    kill_child_after_checkpoint,
    record_bytes,
    step,
    tiered_state,
)

import tf_embed_ops as te

V, DIM = 50, 4


def _config(directory, mode="create", dim=DIM, optimizer=None):
    optimizer = optimizer or te.optimizers.Adagrad(0.1)
    storage = te.Tiered(cache_bytes=1 << 14, directory=str(directory), mode=mode)
    return te.TableConfig(V, dim, name="t", optimizer=optimizer, storage=storage)


def _trained_and_saved(tmp_path):
    """A trained table, checkpointed, flushed to its row file; returns (config, saved state, checkpoint path)."""
    config = _config(tmp_path / "rows")
    emb = embedding(config)
    step(emb, {"f": tf.constant([0, 3, V - 1], tf.int64)})
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ckpt" / "c"))
    emb.tiered_tables[config].flush()
    return config, tiered_state(emb, config), path


def _flip(path: str, offset_from_end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, os.SEEK_END)
        byte = f.read(1)
        f.seek(-offset_from_end, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x5A]))


def _record_offset(path: str, row: int, record: int) -> int:
    """Where row `row`'s record is in a row file (docs/tiered_storage.md, "The row file"): the location map after
    the record slots gives its slot."""
    with open(path, "rb") as f:
        header = f.read(4096)
        physical = int(np.frombuffer(header[288:296], "<i8")[0])
        f.seek(4096 + physical * record + 16 + 4 * row)
        slot = int(np.frombuffer(f.read(4), "<u4")[0])
    assert slot != 0xFFFFFFFF and slot < physical, slot
    return 4096 + slot * record


def _assert_names(error, *parts) -> None:
    """The error's message names every one of `parts` (the table, the row, the path, ...)."""
    for part in parts:
        assert part in str(error.value), (part, str(error.value))


def test_a_corrupted_row_is_a_clear_error_and_the_checkpoint_restores(tmp_path):
    config, saved, path = _trained_and_saved(tmp_path)
    rows = os.path.join(str(tmp_path / "rows"), "t.rows")
    record = record_bytes(config.optimizer, DIM)
    size = os.path.getsize(rows)
    _flip(rows, size - (_record_offset(rows, V - 1, record) + record - 5))  # inside row V - 1's record, before its CRC
    reopened = _config(tmp_path / "rows", mode="open")
    emb = embedding(reopened)  # a new process's view: nothing cached, the row is read from the file
    with pytest.raises(tf.errors.OpError) as error:
        emb({"f": tf.constant([V - 1], tf.int64)})
    _assert_names(error, "'t'", f"row {V - 1}", rows, "CRC")
    emb({"f": tf.constant([1, 2], tf.int64)})  # the other rows are intact
    tf.train.Checkpoint(embedding=emb).read(path).assert_consumed()
    assert_same_state(tiered_state(emb, reopened), saved)
    emb({"f": tf.constant([V - 1], tf.int64)})


def test_a_row_file_of_another_table_is_refused_naming_the_path(tmp_path):
    _trained_and_saved(tmp_path)
    rows = os.path.join(str(tmp_path / "rows"), "t.rows")
    with pytest.raises(tf.errors.OpError) as error:
        embedding(_config(tmp_path / "rows", mode="open", dim=DIM + 1))
    _assert_names(error, "'t'", rows)
    with pytest.raises(tf.errors.OpError) as error:
        embedding(_config(tmp_path / "rows", mode="open", optimizer=te.optimizers.Adam(0.1)))  # other slots
    _assert_names(error, "'t'", rows)


def test_a_row_file_with_a_corrupted_header_is_refused(tmp_path):
    _trained_and_saved(tmp_path)
    rows = os.path.join(str(tmp_path / "rows"), "t.rows")
    with open(rows, "r+b") as f:
        f.write(b"NOTROWS!")
    with pytest.raises(tf.errors.OpError) as error:
        embedding(_config(tmp_path / "rows", mode="open"))
    _assert_names(error, "'t'", rows)


@pytest.mark.slow
def test_a_process_killed_mid_step_restores_and_continues_bitwise(tmp_path):
    """A child trains a bf16 tiered table, checkpoints, trains on and is SIGKILLed mid-step; a new process over the
    same directory restores the checkpoint and trains on: its table is bitwise the in-memory table trained on
    the same batches without interruption."""
    out = kill_child_after_checkpoint(tmp_path)

    import tiered_kill_child as reference  # pylint: disable=import-outside-toplevel

    table = reference.config(None)
    emb = reference.embedding(table)
    for i in range(reference.STEPS_BEFORE + reference.STEPS_AFTER):
        reference.train_step(emb, i)
    got = np.load(out)
    np.testing.assert_array_equal(got["values"], tf.cast(emb.embedding_tables[table], tf.float32).numpy())
    for name, slot in emb.slot_variables[table].items():
        np.testing.assert_array_equal(got[name], tf.cast(slot, tf.float32).numpy(), err_msg=name)
