"""Tiered tables (`te.TableConfig(storage=te.Tiered(...))`) trained by `te.TPUEmbeddingV2`.

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

import tf_embed_ops as te
from tf_embed_ops.sparse_core import checkpoint as sc_checkpoint

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
        for key in acts_m:
            np.testing.assert_array_equal(acts_t[key].numpy(), acts_m[key].numpy(), err_msg=key)
    return tiered, memory


def _check_trained_bitwise(tmp_path, name: str, steps: int, **options) -> None:
    tiered, memory = _train_both(tmp_path, OPTIMIZERS[name], steps, **options)
    for table in ("t", "u"):
        _assert_same(_state(tiered, table), _state(memory, table))
    stats = _stats(tiered)
    assert stats["capacity_rows"] == CACHE_ROWS
    assert stats["misses"] > 0 and stats["evictions"] > 0  # the cache holds 36 of the 64 rows
    # In memory "t" and "u" share a stack; the tiered table is never stacked.
    assert memory.embedding_layouts["t"].stacked_table_name == memory.embedding_layouts["u"].stacked_table_name
    assert sorted(tiered.embedding_tables) == ["u"] and sorted(tiered.embedding_layouts) == ["u"]
    assert [t.name for t in tiered.table_variables] == ["u"]
    assert tiered.sparse_core_layouts["t"].stacked_table_name == "t"


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
        for key in acts_m:
            np.testing.assert_array_equal(acts_t[key].numpy(), acts_m[key].numpy(), err_msg=key)
    assert not np.any(acts_t["f"].numpy())  # an empty sample's activation is zero
    for table in ("t", "u"):
        _assert_same(_state(tiered, table), _state(memory, table))
    # An id one past the table is refused (naming the feature and the table), changing nothing.
    before = {name: _state(tiered, name) for name in ("t", "u")}
    bad = dict(batches[0], h=tf.constant([V] + [0] * (SAMPLES - 1), tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"Feature h: id {V} is outside table 't'"):
        _step(tiered, bad)
    for name in ("t", "u"):
        _assert_same(_state(tiered, name), before[name])


def test_a_tiered_table_without_an_optimizer_is_looked_up_but_not_trained(tmp_path):
    tiered = _embedding(tmp_path, None, True)
    memory = _embedding(tmp_path, None, False)
    features = _batches(1)[0]
    acts_t, batch = tiered(features)
    acts_m, _ = memory(features)
    for key in acts_m:
        np.testing.assert_array_equal(acts_t[key].numpy(), acts_m[key].numpy(), err_msg=key)
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
        for key in acts_m:
            np.testing.assert_array_equal(acts_t[key].numpy(), acts_m[key].numpy(), err_msg=key)
    for table in ("t", "u"):
        _assert_same(_state(tiered, table), _state(memory, table))


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
        for key in acts_m:
            np.testing.assert_array_equal(acts_t[key].numpy(), acts_m[key].numpy(), err_msg=key)
    for table in ("t", "u"):
        _assert_same(_state(tiered, table), _state(memory, table))
    assert memory.prefetch(batches[0]) == []  # no tiered table: nothing to do
    assert _stats(tiered)["misses"] > 0


def test_a_lookup_over_the_cache_is_refused_and_changes_nothing(tmp_path):
    emb = _embedding(tmp_path, OPTIMIZERS["adagrad"](), True, cache_rows=12)
    before = {name: _state(emb, name) for name in ("t", "u")}
    features = _batches(1)[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 't'.*distinct rows"):
        _step(emb, features)
    for name in ("t", "u"):
        _assert_same(_state(emb, name), before[name])


def test_an_update_the_tiered_op_refuses_changes_no_table_of_either_kind(tmp_path):
    # The tiered update's checks run first, writing nothing; the in-memory update runs only after them.
    emb = _embedding(tmp_path, _emb.Adagrad(learning_rate=lambda: -1.0), True)
    before = {name: _state(emb, name) for name in ("t", "u")}
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 't'.*learning rate must be finite and >= 0"):
        _step(emb, _batches(1)[0])
    for name in ("t", "u"):
        _assert_same(_state(emb, name), before[name])


def _write(emb, path) -> str:
    return tf.train.Checkpoint(embedding=emb).write(str(path))


def _read(emb, path) -> None:
    tf.train.Checkpoint(embedding=emb).read(path).expect_partial()


def test_checkpoint_streams_the_tiered_table_and_restores_it(tmp_path):
    emb = _embedding(tmp_path / "rows", OPTIMIZERS["adam"](), True)
    batches = _batches(4)
    for features in batches[:2]:
        _step(emb, features)
    saved = {name: _state(emb, name) for name in ("t", "u")}
    path = _write(emb, tmp_path / "ckpt")
    keys = {k for k, _ in tf.train.list_variables(path)}
    assert {"embedding/t/manifest", "embedding/t/part-0", "embedding/t/momenta/part-0"} <= keys  # streamed
    assert "embedding/u/.ATTRIBUTES/VARIABLE_VALUE" in keys  # the in-memory stack, as before
    layouts = sc_checkpoint.read_layouts(path)
    assert sorted(layouts) == ["u"]  # the layouts proto lists the stacked (in-memory) tables only
    for features in batches[2:]:
        _step(emb, features)
    _read(emb, path)
    for name in ("t", "u"):
        _assert_same(_state(emb, name), saved[name])
    # Training on from the restored state is the training that followed the save.
    again = _embedding(tmp_path / "rows2", OPTIMIZERS["adam"](), True)
    for features in batches[:2]:
        _step(again, features)
    for features in batches[2:]:
        _step(emb, features), _step(again, features)
    for name in ("t", "u"):
        _assert_same(_state(emb, name), _state(again, name))


def test_a_table_made_with_mode_restore_is_written_once_by_the_restore(tmp_path):
    emb = _embedding(tmp_path / "rows", OPTIMIZERS["adagrad"](), True)
    batches = _batches(4)
    for features in batches[:2]:
        _step(emb, features)
    path = _write(emb, tmp_path / "ckpt")
    restored = _embedding(tmp_path / "rows2", OPTIMIZERS["adagrad"](), True, mode="restore")
    assert _stats(restored)["rows_written"] == 0  # no initial rows
    _read(restored, path)
    assert _stats(restored)["rows_written"] == V
    for name in ("t", "u"):
        _assert_same(_state(restored, name), _state(emb, name))
    for features in batches[2:]:
        acts, restored_acts = _step(emb, features), _step(restored, features)
        for key in acts:
            np.testing.assert_array_equal(restored_acts[key].numpy(), acts[key].numpy(), err_msg=key)
    for name in ("t", "u"):
        _assert_same(_state(restored, name), _state(emb, name))


def _apart(tmp_path, sub: str, tiered: bool, **kwargs) -> te.TPUEmbeddingV2:
    """ "t" with a stack of its own in memory too ("u" is wider: stacked tables share a padded width)."""
    return _embedding(tmp_path / sub, OPTIMIZERS["adagrad"](), tiered, u_dim=16, **kwargs)


@pytest.mark.parametrize("storage_dtype", [tf.float32, tf.bfloat16], ids=["fp32", "bf16"])
def test_restores_across_the_tiered_and_in_memory_kinds(tmp_path, storage_dtype):
    options = {"storage_dtype": storage_dtype}
    tiered = _apart(tmp_path, "a", True, **options)
    for features in _batches(2):
        _step(tiered, features)
    saved = {name: _state(tiered, name) for name in ("t", "u")}
    streamed = _write(tiered, tmp_path / "from_tiered")

    memory = _apart(tmp_path, "b", False, **options)
    _read(memory, streamed)
    for name in ("t", "u"):
        _assert_same(_state(memory, name), saved[name])

    # And an in-memory checkpoint (the stacked layout) into a new tiered table.
    for features in _batches(2, seed=7):
        _step(memory, features)
    saved = {name: _state(memory, name) for name in ("t", "u")}
    stacked = _write(memory, tmp_path / "from_memory")
    assert "embedding/t/.ATTRIBUTES/VARIABLE_VALUE" in {k for k, _ in tf.train.list_variables(stacked)}
    fresh = _apart(tmp_path, "c", True, **options)
    _read(fresh, stacked)
    for name in ("t", "u"):
        _assert_same(_state(fresh, name), saved[name])
    # Both keep training alike.
    for features in _batches(2, seed=9):
        acts_f, acts_m = _step(fresh, features), _step(memory, features)
        np.testing.assert_array_equal(acts_f["f"].numpy(), acts_m["f"].numpy())
    _assert_same(_state(fresh, "t"), _state(memory, "t"))


def test_an_in_memory_16_bit_v2_restores_its_rounding_step(tmp_path):
    def make():
        return _embedding(tmp_path, OPTIMIZERS["adam"](), False, storage_dtype=tf.bfloat16)

    saved_run, batches = make(), _batches(4, seed=11)
    for features in batches[:2]:
        _step(saved_run, features)
    path = _write(saved_run, tmp_path / "ckpt")
    assert "embedding/rounding_step/.ATTRIBUTES/VARIABLE_VALUE" in {k for k, _ in tf.train.list_variables(path)}
    restored = make()
    _read(restored, path)
    assert restored.variables["t"]["parameters"].dtype == tf.bfloat16
    for features in batches[2:]:
        _step(saved_run, features), _step(restored, features)
    for name in ("t", "u"):
        _assert_same(_state(restored, name), _state(saved_run, name))


def test_restores_a_per_table_checkpoint_of_te_tpu_embedding(tmp_path):
    # te.TPUEmbedding's checkpoint (per table, the tiered table streamed) restores into the V2's tiered table.
    config = _feature_config(tmp_path / "a", OPTIMIZERS["adagrad"](), True)
    source = te.TPUEmbedding({"a": config["a"], "f": config["f"]})
    source.build()
    [table] = source.tiered_tables.values()
    rows = np.random.default_rng(4).normal(size=(V, DIM)).astype(np.float32)
    table.write_rows(0, rows, {"accumulators": np.full((V, DIM), 0.5, np.float32)})
    path = _write(source, tmp_path / "ckpt")
    target = _embedding(tmp_path / "b", OPTIMIZERS["adagrad"](), True)
    _read(target, path)
    state = _state(target, "t")
    np.testing.assert_array_equal(state["parameters"], rows)
    np.testing.assert_array_equal(state["accumulators"], np.full((V, DIM), 0.5, np.float32))


def test_a_tiered_checkpoint_of_te_tpu_embedding_restores_into_the_table_in_memory(tmp_path):
    config = _feature_config(tmp_path / "a", OPTIMIZERS["adagrad"](), True, u_dim=16)
    source = te.TPUEmbedding({"a": config["a"], "f": config["f"]})
    source.build()
    [table] = source.tiered_tables.values()
    rows = np.random.default_rng(8).normal(size=(V, DIM)).astype(np.float32)
    table.write_rows(0, rows, {"accumulators": np.full((V, DIM), 0.25, np.float32)})
    path = _write(source, tmp_path / "ckpt")
    target = _apart(tmp_path, "b", False)  # "t" in memory, alone in its stack
    _read(target, path)
    state = _state(target, "t")
    np.testing.assert_array_equal(state["parameters"], rows)
    np.testing.assert_array_equal(state["accumulators"], np.full((V, DIM), 0.25, np.float32))
    _assert_same(_state(target, "u"), {k: v.numpy() for k, v in source.variables["u"].items()})


def test_restores_a_checkpoint_of_te_tpu_embedding_with_the_table_in_memory(tmp_path):
    config = _feature_config(tmp_path, OPTIMIZERS["adagrad"](), False)
    source = te.TPUEmbedding({"a": config["a"], "f": config["f"]})
    source.build()
    rows = np.random.default_rng(6).normal(size=(V, DIM)).astype(np.float32)
    source.variables["t"]["parameters"].assign(rows)
    path = _write(source, tmp_path / "ckpt")
    target = _embedding(tmp_path / "b", OPTIMIZERS["adagrad"](), True)
    _read(target, path)  # per table: the tiered table's saver reads the variable's rows, chunk by chunk
    np.testing.assert_array_equal(_state(target, "t")["parameters"], rows)
    _assert_same(_state(target, "u"), {k: v.numpy() for k, v in source.variables["u"].items()})


def test_the_tracker_tracks_the_tiered_table_of_a_v2(tmp_path):
    emb = _embedding(tmp_path, OPTIMIZERS["sgd"](), True)
    tracker = te.tracking.Tracker(emb)
    cursor = tracker.cursor()
    features = _batches(1)[0]
    _step(emb, features)
    changes = tracker.changed_since(cursor)
    want = np.unique(np.concatenate([features["f"].flat_values.numpy(), features["h"].numpy()]))
    np.testing.assert_array_equal(changes.tables["t"].rows, want)
    np.testing.assert_array_equal(changes.tables["u"].rows, np.unique(features["a"].numpy()))


def _changes_nothing(emb, restore, match: str) -> None:
    before = {name: _state(emb, name) for name in ("t", "u")}
    with pytest.raises(ValueError, match=match):
        restore()
    for name in ("t", "u"):
        _assert_same(_state(emb, name), before[name])


def test_refused_restores_change_no_table(tmp_path):
    # Saved tiered, restored into an in-memory table that shares its stack with "u": refused, naming both.
    tiered = _embedding(tmp_path / "a", OPTIMIZERS["adagrad"](), True)
    _step(tiered, _batches(1)[0])
    streamed = _write(tiered, tmp_path / "streamed")
    stacked_memory = _embedding(tmp_path / "b", OPTIMIZERS["adagrad"](), False)
    _changes_nothing(stacked_memory, lambda: _read(stacked_memory, streamed), r"table 't'.*stacked table 't_u'")

    # Saved in memory with "t" stacked with "u", restored into a tiered "t": refused.
    _step(stacked_memory, _batches(1)[0])
    stacked = _write(stacked_memory, tmp_path / "stacked")
    _changes_nothing(tiered, lambda: _read(tiered, stacked), r"stacks table 't' \(tiered here\) with \['u'\]")

    # A tiered table of another size: its check fails before "u" (which matches) is written.
    other = _embedding(tmp_path / "c", OPTIMIZERS["adagrad"](), True, vocab=V + 8)
    _step(other, _batches(1)[0])
    _changes_nothing(other, lambda: _read(other, streamed), r"TieredTable 't'.*72 rows")


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
        for key in m:
            np.testing.assert_array_equal(a[key].numpy(), m[key].numpy(), err_msg=key)
    for name in ("t", "u"):
        _assert_same(_state(tiered_emb, name), _state(memory_emb, name))
    stats = _stats(tiered_emb)
    assert stats["misses"] > 0 and stats["evictions"] > 0 and stats["hits"] > stats["misses"]
