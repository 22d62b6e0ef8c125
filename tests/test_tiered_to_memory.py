"""A tiered table's streamed checkpoint restored into the same table kept in memory, and back.

References: the tiered table's state when it was saved (read back bitwise from the in-memory variables), and the
uninterrupted tiered run: the in-memory table restored from its checkpoint continues exactly as it does.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import assert_same_state, embedding, memory_state, step, table_pair, tiered_state

import tf_embed_ops as te

V, DIM, CACHE_ROWS = 80, 4, 8
BATCHES = [[0, 5, 5, 79, 40, 12], [12, 13, 40, 41, 0, 66], [70, 71, 72, 5, 79, 79, 3], [5, 12, 40, 79, 0, 33]]


def _ids(i):
    return {"f": tf.constant(BATCHES[i % len(BATCHES)], tf.int64)}


def _pair(directory, dim=DIM, **options):
    memory, tiered = table_pair(directory, te.optimizers.Adam(0.05), V, dim, CACHE_ROWS, **options)
    # Chunks of 7 rows (12 chunks, the last one short): the restore moves them one at a time.
    tiered.storage = te.Tiered(**{**tiered.storage.get_config(), "chunk_bytes": 7 * dim * 4 * 3})
    return memory, tiered


@pytest.mark.parametrize(
    "options",
    [{}, {"storage_dtype": tf.bfloat16, "slot_storage_dtype": tf.bfloat16, "rounding": "stochastic"}],
    ids=["fp32", "bf16-stochastic"],
)
def test_a_tiered_checkpoint_restores_into_memory_and_back_bitwise(tmp_path, options):
    memory_config, tiered_config = _pair(tmp_path / "a", **options)
    tiered = embedding(tiered_config)
    for i in range(2):
        step(tiered, _ids(i))
    saved = tiered_state(tiered, tiered_config)
    path = tf.train.Checkpoint(embedding=tiered).write(str(tmp_path / "ckpt" / "tiered"))

    memory = embedding(memory_config)
    assert not np.array_equal(memory_state(memory, memory_config)[0], saved[0])
    tf.train.Checkpoint(embedding=memory).read(path).expect_partial()
    assert_same_state(memory_state(memory, memory_config), saved)
    if options:
        assert int(memory._rounding_step.numpy()) == 2
    for i in range(2, 5):
        np.testing.assert_array_equal(step(memory, _ids(i))["f"].numpy(), step(tiered, _ids(i))["f"].numpy())
    assert_same_state(memory_state(memory, memory_config), tiered_state(tiered, tiered_config))

    # Back: the in-memory table's checkpoint into a new tiered table.
    path = tf.train.Checkpoint(embedding=memory).write(str(tmp_path / "ckpt" / "memory"))
    _, again_config = _pair(tmp_path / "b", **options)
    again = embedding(again_config)
    tf.train.Checkpoint(embedding=again).read(path)
    assert_same_state(tiered_state(again, again_config), memory_state(memory, memory_config))


def test_a_tiered_checkpoint_of_another_geometry_changes_no_in_memory_table(tmp_path):
    _, tiered_config = _pair(tmp_path / "a")
    tiered = embedding(tiered_config)
    step(tiered, _ids(0))
    path = tf.train.Checkpoint(embedding=tiered).write(str(tmp_path / "ckpt" / "tiered"))
    wider, _ = _pair(tmp_path / "b", dim=DIM + 1)
    memory = embedding(wider)
    before = memory_state(memory, wider)
    with pytest.raises(ValueError, match=r"table 't' \(in memory, saved tiered\).*dim 4.*dim 5"):
        tf.train.Checkpoint(embedding=memory).read(path)
    assert_same_state(memory_state(memory, wider), before)

    unbuilt = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(_pair(tmp_path / "c")[0], name="f")})
    with pytest.raises(ValueError, match=r"holds table 't' as a tiered table.*build"):
        tf.train.Checkpoint(embedding=unbuilt).read(path)
