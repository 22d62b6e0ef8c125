"""Tiered tables (`te.TableConfig(storage=te.Tiered(...))`) trained by `te.TPUEmbeddingV2`; their checkpoints are
tested in test_tiered_v2_checkpoint.py, the embedding and helpers both share are in tiered_v2_support.py.

The reference is the same `TPUEmbeddingV2` with the table in memory (`storage=None`): the same initial rows and
batches must give bitwise the same activations, rows and slots (each side's in-memory path is checked against
numpy and TensorFlow in tests/test_tpu_embedding_v2*.py). The tiered table's cache holds fewer rows than the table,
so rows are missed, evicted, written back and read again (the stats are asserted). The embedding mixes the tiered
table with an in-memory one of the same width and optimizer: in memory the two share a stack, with the tiered table
they do not (a tiered table is never stacked), and the results are still bitwise equal (one replica: every table's
rotation is 0, so the ids of a sample are summed in the same order).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import cache_bytes_for
from tiered_v2_support import (
    DIM,
    OPTIMIZERS,
    SAMPLES,
    U,
    V,
    _assert_same,
    _assert_same_acts,
    _assert_same_tables,
    _batches,
    _changes_nothing,
    _check_trained_bitwise,
    _emb,
    _embedding,
    _feature_config,
    _loss,
    _state,
    _states,
    _stats,
    _step,
)

import tf_embed_ops as te

IA = tf.errors.InvalidArgumentError


@pytest.mark.parametrize("name", ["adagrad", "ftrl"])
def test_trains_bitwise_as_in_memory(tmp_path, name):
    _check_trained_bitwise(tmp_path, name, steps=3)


def test_empty_samples_duplicates_and_the_first_and_last_rows_train_bitwise(tmp_path):
    tiered = _embedding(tmp_path, OPTIMIZERS["adagrad"](), True)
    memory = _embedding(tmp_path, OPTIMIZERS["adagrad"](), False)
    last = V - 1
    batches = [
        {  # empty samples, an id repeated in a sample (merged), the first and last rows
            "a": tf.constant([0, 1, 2, 3, 4, 5, 6, U - 1], tf.int64),
            "f": tf.ragged.constant([[], [0, last], [last, last], [], [3], [], [0, 0, 5], []], dtype=tf.int64),
            "h": tf.constant([last, 0, 1, 2, last, 0, 7, 9], tf.int64),
        },
        {  # no id at all for "f"
            "a": tf.constant([1] * SAMPLES, tf.int64),
            "f": tf.ragged.constant([[]] * SAMPLES, dtype=tf.int64, ragged_rank=1),
            "h": tf.constant([last] * SAMPLES, tf.int64),
        },
    ]
    for features in batches:
        acts_t, acts_m = _step(tiered, features), _step(memory, features)
        _assert_same_acts(acts_t, acts_m)
    assert not np.any(acts_t["f"].numpy())  # an empty sample's activation is zero
    _assert_same_tables(tiered, _states(memory))
    # An id one past the table is refused (naming the feature and the table), changing nothing.
    bad = dict(batches[0], h=tf.constant([V] + [0] * (SAMPLES - 1), tf.int64))
    _changes_nothing(tiered, lambda: _step(tiered, bad), rf"Feature h: id {V} is outside table 't'", IA)


def test_a_tiered_table_without_an_optimizer_is_looked_up_but_not_trained(tmp_path):
    tiered = _embedding(tmp_path, None, True)
    memory = _embedding(tmp_path, None, False)
    features = _batches(1)[0]
    acts_t, batch = tiered(features)
    acts_m, _ = memory(features)
    _assert_same_acts(acts_t, acts_m)
    assert _state(tiered, "t").keys() == {"parameters"}  # no slots in its records
    before = _state(tiered, "t")
    with pytest.raises(RuntimeError, match="Table 'u' has no optimizer"):
        tiered.apply_gradients(tf.nest.map_structure(tf.ones_like, acts_t), batch)
    _assert_same(_state(tiered, "t"), before)


def test_a_tiered_table_has_its_own_stack_and_limits(tmp_path):
    features = _batches(1)[0]
    tiered_config = _feature_config(tmp_path, OPTIMIZERS["sgd"](), True)
    max_ids, max_unique = te.TPUEmbeddingV2.compute_sparse_core_stats(features, tiered_config, num_tpu_chips=1)
    memory_ids, _ = te.TPUEmbeddingV2.compute_sparse_core_stats(
        features, _feature_config(tmp_path, OPTIMIZERS["sgd"](), False), num_tpu_chips=1
    )
    assert sorted(max_ids) == sorted(max_unique) == ["t", "u"] and sorted(memory_ids) == ["t_u"]
    # The in-memory tables are stacked as if the tiered one were not configured (here its feature comes first).
    t, u = tiered_config["f"].table, tiered_config["a"].table
    extra = te.TableConfig(16, DIM, name="w", optimizer=u.optimizer)
    with_tiered = te.TPUEmbeddingV2(
        {
            "b": _emb.FeatureConfig(t, output_shape=[SAMPLES]),
            "c": _emb.FeatureConfig(u, output_shape=[SAMPLES]),
            "d": _emb.FeatureConfig(extra, output_shape=[SAMPLES]),
        }
    )
    without = te.TPUEmbeddingV2(
        {
            "c": _emb.FeatureConfig(u, output_shape=[SAMPLES]),
            "d": _emb.FeatureConfig(extra, output_shape=[SAMPLES]),
        }
    )
    assert with_tiered.embedding_layouts == without.embedding_layouts
    assert with_tiered.embedding_layouts["w"].stacked_table_name == "u_w"
    assert with_tiered.sparse_core_layouts["t"].stacked_table_name == "t"
    # Its limit is keyed by its own name: one too few of its ids on a SparseCore is refused, naming it.
    limit = int(max_ids["t"]) - 1
    config = _emb.SparseCoreEmbeddingConfig(max_ids_per_table={"t": limit})
    emb = _embedding(tmp_path, OPTIMIZERS["sgd"](), True, sc_config=config)
    before = _state(emb, "t")
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=rf"max ids per sparse core is set to be {limit} for table t"
    ):
        _step(emb, features)
    _assert_same(_state(emb, "t"), before)


@pytest.mark.slow
@pytest.mark.parametrize("storage_dtype", [tf.float32, tf.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_trains_bitwise_as_in_memory(tmp_path, name, storage_dtype):
    _check_trained_bitwise(tmp_path, name, steps=6, storage_dtype=storage_dtype)


def test_bfloat16_stochastic_rounding_bitwise_as_in_memory(tmp_path):
    # The tiered table draws the rounding bits the same table draws in memory (same table index, same step).
    _check_trained_bitwise(tmp_path, "adam", steps=3, storage_dtype=tf.bfloat16)


@pytest.mark.slow
def test_several_chips_bitwise_when_the_table_has_its_own_stack_in_memory(tmp_path):
    # With several chips a stacked table's shards are rotated, which orders a sample's ids differently; with a
    # stack of its own in memory too (disable_table_stacking), the layouts and so the results are the same.
    config = _emb.SparseCoreEmbeddingConfig(disable_table_stacking=True)
    make = OPTIMIZERS["adagrad"]
    tiered = te.TPUEmbeddingV2(
        _feature_config(tmp_path, make(), True), sparse_core_embedding_config=config, num_replicas=2
    )
    memory = te.TPUEmbeddingV2(
        _feature_config(tmp_path, make(), False), sparse_core_embedding_config=config, num_replicas=2
    )

    def placement(emb):  # what orders a sample's ids and places its rows
        return {
            name: (lay.stacked_table_name, lay.sparse_core_shard_row_offset, lay.sparse_core_shard_rotation)
            for name, lay in emb.sparse_core_layouts.items()
        }

    assert placement(tiered) == placement(memory)
    assert any(lay.sparse_core_shard_rotation for lay in memory.sparse_core_layouts.values()) is False
    for features in _batches(5):
        acts_t, acts_m = _step(tiered, features), _step(memory, features)
        _assert_same_acts(acts_t, acts_m)
    _assert_same_tables(tiered, _states(memory))


def test_prefetch_in_a_tf_function_trains_bitwise(tmp_path):
    tiered = _embedding(tmp_path, OPTIMIZERS["adagrad"](), True)
    memory = _embedding(tmp_path, OPTIMIZERS["adagrad"](), False)

    def make_step(emb):
        @tf.function
        def step(features, next_features):
            with tf.GradientTape() as tape:
                acts, batch = emb(features)
                tape.watch(acts)
                emb.prefetch(emb.enqueue(next_features))  # between the lookup and the update
                loss = _loss(acts)
            emb.apply_gradients(tape.gradient(loss, acts), batch)
            return acts

        return step

    step_t, step_m = make_step(tiered), make_step(memory)
    batches = _batches(4, seed=5)
    for features, next_features in zip(batches, batches[1:] + batches[:1], strict=True):
        acts_t, acts_m = step_t(features, next_features), step_m(features, next_features)
        _assert_same_acts(acts_t, acts_m)
    _assert_same_tables(tiered, _states(memory))
    assert memory.prefetch(batches[0]) == []  # no tiered table: nothing to do
    assert _stats(tiered)["misses"] > 0


def test_a_lookup_over_the_cache_is_refused_and_changes_nothing(tmp_path):
    emb = _embedding(tmp_path, OPTIMIZERS["adagrad"](), True, cache_rows=12)
    features = _batches(1)[0]
    _changes_nothing(emb, lambda: _step(emb, features), r"table 't'.*distinct rows", IA)


def test_an_update_the_tiered_op_refuses_changes_no_table_of_either_kind(tmp_path):
    # The tiered update's checks run first, writing nothing; the in-memory update runs only after them.
    emb = _embedding(tmp_path, _emb.Adagrad(learning_rate=lambda: -1.0), True)
    features = _batches(1)[0]
    _changes_nothing(emb, lambda: _step(emb, features), r"table 't'.*learning rate must be finite and >= 0", IA)


def test_xla_and_dynamic_tables_are_refused(tmp_path):
    emb = _embedding(tmp_path, OPTIMIZERS["sgd"](), True)
    batch = emb.enqueue(_batches(1)[0])

    @tf.function(jit_compile=True)
    def lookup(batch):
        return emb.dequeue(batch)[0]

    with pytest.raises(ValueError, match=r"TPUEmbeddingV2.dequeue: tiered tables \['t'\].*jit_compile"):
        lookup(batch)
    acts, _ = emb.dequeue(batch)

    @tf.function(jit_compile=True)
    def update(gradients, batch):
        emb.apply_gradients(gradients, batch)

    before = _state(emb, "t")
    with pytest.raises(ValueError, match=r"TPUEmbeddingV2.apply_gradients: tiered tables \['t'\].*jit_compile"):
        update(tf.nest.map_structure(tf.ones_like, acts), batch)
    _assert_same(_state(emb, "t"), before)

    # A tiered table may not take the name of a stacked table of the others (the stacks would clash).
    a = te.TableConfig(16, 4, name="a", optimizer=_emb.SGD(0.1))
    b = te.TableConfig(16, 4, name="b", optimizer=_emb.SGD(0.1))
    clash = te.TableConfig(
        16, 4, name="a_b", optimizer=_emb.SGD(0.1), storage=te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path))
    )
    features = {k: _emb.FeatureConfig(t, output_shape=[4]) for k, t in zip("xyz", (a, b, clash), strict=True)}
    with pytest.raises(ValueError, match=r"Table 'a_b' is kept apart.*stacked table named 'a_b'"):
        te.TPUEmbeddingV2(features)

    for storage in (te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path / "d")), None):
        table = te.DynamicTableConfig(dim=4, name="d", optimizer=_emb.SGD(0.1), storage=storage)
        kind = "a tiered dynamic table" if storage else "a dynamic table"
        with pytest.raises(ValueError, match=f"table 'd' is {kind}"):
            te.TPUEmbeddingV2({"f": _emb.FeatureConfig(table, output_shape=[4])})


def test_saved_model_of_a_tiered_v2_is_refused_naming_the_table(tmp_path):
    emb = _embedding(tmp_path / "rows", OPTIMIZERS["sgd"](), True)
    with pytest.raises((ValueError, NotImplementedError), match="'t'"):
        tf.saved_model.save(emb, str(tmp_path / "model"))


@pytest.mark.slow
def test_a_longer_skewed_run_with_prefetch_trains_bitwise(tmp_path):
    # 2,048 rows, a cache of 300 (15%), Zipf-distributed ids over 64 samples a step, 16 steps in a tf.function
    # with the next batch prefetched: most rows are missed at first, then the hot ones stay resident.
    vocab, dim, samples, cache_rows = 2048, 16, 64, 300
    rng = np.random.default_rng(21)
    initial = rng.normal(size=(vocab, dim)).astype(np.float32)

    def make(tiered: bool) -> te.TPUEmbeddingV2:
        opt = _emb.Adam(0.01)
        storage = None
        if tiered:
            storage = te.Tiered(cache_bytes=cache_bytes_for(cache_rows, opt, dim), directory=str(tmp_path))
        t = te.TableConfig(
            vocab, dim, name="t", optimizer=opt, initializer=tf.constant_initializer(initial), storage=storage
        )
        u = te.TableConfig(64, dim, name="u", optimizer=opt, initializer=tf.constant_initializer(initial[:64]))
        config = {
            "a": _emb.FeatureConfig(u, output_shape=[samples]),
            "f": _emb.FeatureConfig(t, output_shape=[samples]),
        }
        big = {name: 1024 for name in (["t", "u"] if tiered else ["t_u"])}  # keyed by stacked table
        limits = _emb.SparseCoreEmbeddingConfig(max_ids_per_table=big, max_unique_ids_per_table=big)
        return te.TPUEmbeddingV2(config, sparse_core_embedding_config=limits)

    def batch() -> dict:
        ids = [list(np.minimum(rng.zipf(1.1, rng.integers(1, 5)) - 1, vocab - 1)) for _ in range(samples)]
        return {
            "a": tf.constant(rng.integers(0, 64, samples), tf.int64),
            "f": tf.ragged.constant(ids, dtype=tf.int64),
        }

    batches = [batch() for _ in range(17)]
    runs = []
    for tiered in (True, False):
        emb = make(tiered)

        @tf.function
        def step(features, next_features, emb=emb):
            with tf.GradientTape() as tape:
                acts, preserved = emb(features)
                tape.watch(acts)
                emb.prefetch(emb.enqueue(next_features))
                loss = _loss(acts)
            emb.apply_gradients(tape.gradient(loss, acts), preserved)
            return acts

        runs.append((emb, [step(b, n) for b, n in zip(batches[:-1], batches[1:], strict=True)]))
    (tiered_emb, tiered_acts), (memory_emb, memory_acts) = runs
    for a, m in zip(tiered_acts, memory_acts, strict=True):
        _assert_same_acts(a, m)
    _assert_same_tables(tiered_emb, _states(memory_emb))
    stats = _stats(tiered_emb)
    assert stats["misses"] > 0 and stats["evictions"] > 0 and stats["hits"] > stats["misses"]
