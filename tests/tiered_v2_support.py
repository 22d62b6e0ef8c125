"""What the tests of tiered tables trained by `te.TPUEmbeddingV2` (test_tiered_v2*.py) share: the embedding of a
tiered table "t" beside an in-memory "u", its batches and training step, and comparisons of its tables' state
with an in-memory reference's.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import cache_bytes_for

import tf_embed_ops as te

_emb = tf.tpu.experimental.embedding
V, U, DIM, SAMPLES = 64, 32, 8, 8
CACHE_ROWS = 36  # a step needs at most 3 * 8 + 8 = 32 distinct rows of "t"; the table has 64

OPTIMIZERS = {
    "sgd": lambda: _emb.SGD(0.1),
    "adagrad": lambda: _emb.Adagrad(0.1, initial_accumulator_value=0.2),
    "adagrad_momentum": lambda: _emb.AdagradMomentum(0.1, momentum=0.7),
    "adam": lambda: _emb.Adam(0.05),
    "ftrl": lambda: _emb.FTRL(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
}


def _rows(n: int, seed: int, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


def _feature_config(
    directory,
    optimizer,
    tiered: bool,
    u_dim: int = DIM,
    cache_rows: int = CACHE_ROWS,
    vocab: int = V,
    mode: str = "create",
    **options,
):
    """Tiered (or in-memory) table "t" under features "f" (ragged, mean) and "h" (dense); in-memory "u" under "a".
    With `u_dim == DIM` the two tables would share a stack in memory. `mode`: the tiered table's te.Tiered mode."""
    storage = None
    if tiered:
        cache = cache_bytes_for(cache_rows, optimizer, DIM, options.get("storage_dtype", tf.float32))
        storage = te.Tiered(cache_bytes=cache, directory=str(directory), mode=mode)
    t = te.TableConfig(
        vocab,
        DIM,
        name="t",
        optimizer=optimizer,
        combiner="mean",
        initializer=tf.constant_initializer(_rows(vocab, 0)),
        storage=storage,
        **options,
    )
    u = te.TableConfig(
        U, u_dim, name="u", optimizer=optimizer, initializer=tf.constant_initializer(_rows(U, 1, u_dim)), **options
    )
    # "u" first in the table order (tests/test_rounding_table_ids.py trains a 16-bit in-memory table after a tiered
    # one: bitwise too, every table being keyed by its index among the embedding's static tables).
    return {
        "a": _emb.FeatureConfig(u, output_shape=[SAMPLES]),
        "f": _emb.FeatureConfig(t, output_shape=[SAMPLES]),
        "h": _emb.FeatureConfig(t, output_shape=[SAMPLES]),
    }


def _embedding(directory, optimizer, tiered: bool, sc_config=None, **kwargs) -> te.TPUEmbeddingV2:
    emb = te.TPUEmbeddingV2(
        _feature_config(directory, optimizer, tiered, **kwargs),
        sparse_core_embedding_config=sc_config or _emb.SparseCoreEmbeddingConfig(),
    )
    emb.build()
    return emb


def _batches(n: int, seed: int = 2) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ragged = [list(rng.integers(0, V, rng.integers(1, 4))) for _ in range(SAMPLES)]
        out.append(
            {
                "f": tf.ragged.constant(ragged, dtype=tf.int64),
                "a": tf.constant(rng.integers(0, U, SAMPLES), tf.int64),
                "h": tf.constant(rng.integers(0, V, SAMPLES), tf.int64),
            }
        )
    return out


def _loss(acts) -> tf.Tensor:
    return sum(
        tf.reduce_sum((a - 1.0) ** 2 * tf.range(1.0, a.shape[-1] + 1.0)) for a in tf.nest.flatten(acts)
    )  # weighted per column: every column's gradient differs


def _step(emb: te.TPUEmbeddingV2, features) -> dict:
    with tf.GradientTape() as tape:
        acts, batch = emb(features)
        tape.watch(acts)
        loss = _loss(acts)
    emb.apply_gradients(tape.gradient(loss, acts), batch)
    return acts


def _state(emb: te.TPUEmbeddingV2, name: str) -> dict:
    """`{slot: float32 array}` ("parameters" and the slots) of table `name`, tiered or in memory."""
    tiered = {c.name: t for c, t in emb.tiered_tables.items()}
    if name in tiered:
        values, slots = tiered[name].read_all()
        return {"parameters": values, **slots}
    return {k: tf.cast(v, tf.float32).numpy() for k, v in emb.variables[name].items()}


def _assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _stats(emb: te.TPUEmbeddingV2) -> dict:
    [table] = emb.tiered_tables.values()
    return {k: float(v) for k, v in table.stats().items()}


def _train_both(tmp_path, make_optimizer, steps: int = 4, **options):
    tiered = _embedding(tmp_path, make_optimizer(), True, **options)
    memory = _embedding(tmp_path, make_optimizer(), False, **options)
    for features in _batches(steps):
        acts_t, acts_m = _step(tiered, features), _step(memory, features)
        _assert_same_acts(acts_t, acts_m)
    return tiered, memory


def _check_trained_bitwise(tmp_path, name: str, steps: int, **options) -> None:
    tiered, memory = _train_both(tmp_path, OPTIMIZERS[name], steps, **options)
    _assert_same_tables(tiered, _states(memory))
    stats = _stats(tiered)
    assert stats["capacity_rows"] == CACHE_ROWS
    assert stats["misses"] > 0 and stats["evictions"] > 0  # the cache holds 36 of the 64 rows
    # In memory "t" and "u" share a stack; the tiered table is never stacked.
    assert memory.embedding_layouts["t"].stacked_table_name == memory.embedding_layouts["u"].stacked_table_name
    assert sorted(tiered.embedding_tables) == ["u"] and sorted(tiered.embedding_layouts) == ["u"]
    assert [t.name for t in tiered.table_variables] == ["u"]
    assert tiered.sparse_core_layouts["t"].stacked_table_name == "t"


TABLES = ("t", "u")


def _states(emb: te.TPUEmbeddingV2) -> dict:
    """`{table: _state}` of both tables."""
    return {name: _state(emb, name) for name in TABLES}


def _assert_same_tables(emb: te.TPUEmbeddingV2, states: dict) -> None:
    """Both tables of `emb` hold bitwise `states` (an earlier `_states`)."""
    for name in TABLES:
        _assert_same(_state(emb, name), states[name])


def _assert_same_acts(acts: dict, expected: dict) -> None:
    """Bitwise the same activations, feature by feature."""
    for key in expected:
        np.testing.assert_array_equal(acts[key].numpy(), expected[key].numpy(), err_msg=key)


def _changes_nothing(emb, call, match: str, error=ValueError) -> None:
    """`call()` raises `error` matching `match`, and neither table of `emb` changed."""
    before = _states(emb)
    with pytest.raises(error, match=match):
        call()
    _assert_same_tables(emb, before)


def _write(emb, path) -> str:
    return tf.train.Checkpoint(embedding=emb).write(str(path))


def _read(emb, path) -> None:
    tf.train.Checkpoint(embedding=emb).read(path).expect_partial()


def _apart(tmp_path, sub: str, tiered: bool, **kwargs) -> te.TPUEmbeddingV2:
    """ "t" with a stack of its own in memory too ("u" is wider: stacked tables share a padded width)."""
    return _embedding(tmp_path / sub, OPTIMIZERS["adagrad"](), tiered, u_dim=16, **kwargs)
