"""Touched-row tracking (te.tracking): the rows each step changed, against the set numpy computes from the ids.

Every optimizer x table kind (static float32, 16-bit, sharded over three shards, dynamic); independent cursors;
non-lazy Adam (every row: full); restores (full); tracking enabled after a step function was traced; the Keras
layer in model.fit.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.tracked_optimizers import DIM, OPTIMIZERS, VA, VB
from tf_embed_ops import tracking

_emb = tf.tpu.experimental.embedding
KINDS = ["static", "bfloat16", "sharded", "dynamic", "sharded_dynamic"]


def _build(optimizer_name, kind):
    opt = OPTIMIZERS[optimizer_name]()
    if kind in ("dynamic", "sharded_dynamic"):
        a = te.DynamicTableConfig("a", DIM, optimizer=opt, combiner="sum")
    elif kind == "bfloat16":
        a = te.TableConfig(
            VA, DIM, name="a", optimizer=opt, combiner="sum", storage_dtype=tf.bfloat16, rounding="nearest"
        )
    else:
        a = _emb.TableConfig(VA, DIM, name="a", optimizer=opt, combiner="sum")
    b = _emb.TableConfig(VB, DIM, name="b", optimizer=opt, combiner="sum")
    features = {"a": _emb.FeatureConfig(a), "b": _emb.FeatureConfig(b)}
    if kind in ("sharded", "sharded_dynamic"):
        from tf_embed_ops.distribute import ShardedTPUEmbedding

        emb = ShardedTPUEmbedding(features, num_shards=3)
    else:
        emb = te.TPUEmbedding(features)
    emb.build(per_replica_batch_size=6)
    return emb


def _ids(rng, kind, n=6):
    a = rng.integers(0, VA, n) if "dynamic" not in kind else rng.integers(0, 12, n) * 1_000_003 + 7
    return {"a": a.astype(np.int64), "b": rng.integers(0, VB, n).astype(np.int64)}


def _step(emb, ids):
    emb.enqueue({k: tf.convert_to_tensor(v) for k, v in ids.items()})
    acts = emb.dequeue()
    emb.apply_gradients({k: tf.ones_like(v) * 0.5 for k, v in acts.items()})


def _expect(changes, name, ids, optimizer_name):
    got = changes.tables[name]
    if optimizer_name == "adam":  # non-lazy Adam writes every row each step
        assert got.full
        return
    assert not got.full
    np.testing.assert_array_equal(got.rows, np.unique(ids), err_msg=name)
    assert got.evicted.size == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_changed_rows_are_the_steps_unique_ids(optimizer_name, kind):
    emb = _build(optimizer_name, kind)
    rng = np.random.default_rng(3)
    tracker = tracking.Tracker(emb)
    first = tracker.cursor()
    assert tracker.changed_since(first).tables["b"].rows.size == 0  # nothing yet
    ids1 = _ids(rng, kind)
    _step(emb, ids1)
    c1 = tracker.changed_since(first)
    for name in ("a", "b"):
        _expect(c1, name, ids1[name], optimizer_name)
    ids2 = _ids(rng, kind)
    _step(emb, ids2)
    # Consumer 1 read after step 1: it sees step 2's rows only; consumer 2 (still at `first`) sees both steps'.
    c2 = tracker.changed_since(c1.cursor)
    both = tracker.changed_since(first)
    for name in ("a", "b"):
        _expect(c2, name, ids2[name], optimizer_name)
        _expect(both, name, np.concatenate([ids1[name], ids2[name]]), optimizer_name)
    # Nothing since the latest cursor.
    latest = tracker.changed_since(c2.cursor)
    for name in ("a", "b"):
        assert not latest.tables[name].full and latest.tables[name].rows.size == 0


@pytest.mark.parametrize("kind", ["static", "sharded"])
def test_read_rows_gives_the_tables_values(kind):
    emb = _build("adagrad", kind)
    tracker = tracking.Tracker(emb)
    c0 = tracker.cursor()
    ids = _ids(np.random.default_rng(0), kind)
    _step(emb, ids)
    rows = tracker.changed_since(c0).tables["a"].rows
    got = tracker.read_rows("a", rows)
    table = [t for t in emb.embedding_tables if t.name == "a"][0]
    full = np.asarray(tf.convert_to_tensor(emb.embedding_tables[table]))
    np.testing.assert_array_equal(got["parameters"], full[rows])
    acc = np.asarray(tf.convert_to_tensor(emb.slot_variables[table]["accumulators"]))
    np.testing.assert_array_equal(got["accumulators"], acc[rows])
    with pytest.raises(ValueError, match="rows must be in"):
        tracker.read_rows("a", [VA])


def test_dynamic_inserts_evictions_and_contents():
    emb = _build("adagrad", "dynamic")
    tracker = tracking.Tracker(emb)
    c0 = tracker.cursor()
    _step(emb, {"a": np.array([5, 6, 7, 8, 9, 5], np.int64), "b": np.array([1] * 6, np.int64)})
    c1 = tracker.changed_since(c0)
    np.testing.assert_array_equal(c1.tables["a"].rows, [5, 6, 7, 8, 9])
    table = list(emb.dynamic_tables.values())[0]
    exported = {k: v.numpy() for k, v in table.export().items()}
    contents = c1.tables["a"].contents
    for k in ("keys", "weights", "slots", "counts", "last_steps"):
        np.testing.assert_array_equal(contents[k], exported[k], err_msg=k)
    # Evict 6 and 7; 7 comes back in the next step: 6 is evicted, 7 is a changed row.
    table.evict_keys(tf.constant([6, 7], tf.int64))
    _step(emb, {"a": np.array([7, 7, 7, 7, 7, 7], np.int64), "b": np.array([1] * 6, np.int64)})
    c2 = tracker.changed_since(c1.cursor)
    np.testing.assert_array_equal(c2.tables["a"].evicted, [6])
    np.testing.assert_array_equal(c2.tables["a"].rows, [7])
    # An import (restore) makes the next answer full, with every live key.
    exported = {k: v for k, v in table.export().items()}
    table.import_(**exported)
    c3 = tracker.changed_since(c2.cursor)
    assert c3.tables["a"].full
    np.testing.assert_array_equal(c3.tables["a"].rows, exported["keys"].numpy())


@pytest.mark.parametrize("kind", ["static", "dynamic", "sharded"])
def test_mark_all_makes_every_consumer_read_full(kind):
    emb = _build("sgd", kind)
    tracker = tracking.Tracker(emb)
    other = tracking.Tracker(emb)  # a second consumer object over the same tables shares the state
    c = tracker.cursor()
    c_other = other.cursor()
    other.mark_all()
    for t, cursor in ((tracker, c), (other, c_other)):
        ch = t.changed_since(cursor)
        assert ch.tables["a"].full and ch.tables["b"].full
        np.testing.assert_array_equal(ch.tables["b"].rows, np.arange(VB))
        after = t.changed_since(ch.cursor)
        assert not after.tables["b"].full and after.tables["b"].rows.size == 0


def test_cursor_from_another_table_or_before_tracking_reads_full():
    emb = _build("sgd", "static")
    tracker = tracking.Tracker(emb)
    assert tracker.changed_since(None).tables["a"].full
    c = tracker.cursor()
    foreign = tracking.Cursor({"a": ((12345, c.versions["a"][0][1]),), "b": c.versions["b"]})
    got = tracker.changed_since(foreign)
    assert got.tables["a"].full and not got.tables["b"].full
    assert tracking.Cursor.from_json(c.to_json()) == c


def test_tracking_enabled_after_the_step_function_was_traced():
    emb = _build("adagrad", "static")

    @tf.function
    def step(a, b):
        _step(emb, {"a": a, "b": b})

    rng = np.random.default_rng(1)
    ids = _ids(rng, "static")
    step(tf.constant(ids["a"]), tf.constant(ids["b"]))  # traced and run without tracking
    tracker = tracking.Tracker(emb)
    c0 = tracker.cursor()
    ids = _ids(rng, "static")
    step(tf.constant(ids["a"]), tf.constant(ids["b"]))
    got = tracker.changed_since(c0)
    np.testing.assert_array_equal(got.tables["a"].rows, np.unique(ids["a"]))
    assert step.experimental_get_tracing_count() == 1


def test_rejected_step_marks_nothing():
    table_a = _emb.TableConfig(VA, DIM, name="a", optimizer=_emb.SGD(0.1), combiner="sum")
    emb = te.TPUEmbedding({"a": _emb.FeatureConfig(table_a)}, check_numerics=True)
    emb.build(per_replica_batch_size=2)
    tracker = tracking.Tracker(emb)
    c0 = tracker.cursor()
    before = emb.embedding_tables[table_a].numpy()
    emb.enqueue({"a": tf.constant([1, 2], tf.int64)})
    emb.dequeue()
    with pytest.raises(tf.errors.InvalidArgumentError):
        emb.apply_gradients({"a": tf.fill([2, DIM], np.nan)})
    np.testing.assert_array_equal(emb.embedding_tables[table_a].numpy(), before)
    got = tracker.changed_since(c0)
    assert not got.tables["a"].full and got.tables["a"].rows.size == 0


def test_keras_layer_in_fit():
    import keras

    table = _emb.TableConfig(VA, DIM, name="a", optimizer=_emb.Adagrad(0.1), combiner="sum")
    layer = te.keras.TPUEmbedding({"a": _emb.FeatureConfig(table)})
    inputs = {"a": keras.Input(shape=(), dtype="int64", name="a")}
    out = keras.layers.Dense(1)(layer(inputs)["a"])
    model = keras.Model(inputs, out)
    model.compile("sgd", "mse")
    tracker = tracking.Tracker(model)
    c0 = tracker.cursor()
    ids = np.array([3, 3, 9, 17, 39, 0], np.int64)
    model.fit({"a": ids}, np.ones([6, 1], np.float32), batch_size=6, epochs=1, verbose=0)
    np.testing.assert_array_equal(tracker.changed_since(c0).tables["a"].rows, np.unique(ids))


def test_find_engines_refuses_an_object_without_embeddings():
    with pytest.raises(ValueError, match="holds no tf_embed_ops embedding"):
        tracking.find_engines(tf.Module())


def test_tpu_embedding_v2():
    table = _emb.TableConfig(VA, DIM, name="v", optimizer=_emb.Adagrad(0.1), combiner="sum")
    emb = te.TPUEmbeddingV2(
        {"f": _emb.FeatureConfig(table, output_shape=[4])},
        sparse_core_embedding_config=_emb.SparseCoreEmbeddingConfig(max_ids_per_chip_per_sample=64),
    )
    emb.build()
    tracker = tracking.Tracker(emb)
    c0 = tracker.cursor()
    ids = np.array([5, 1, 5, 30], np.int64)
    with tf.GradientTape() as tape:
        acts, batch = emb({"f": tf.constant(ids)})
        tape.watch(acts)
        loss = tf.reduce_sum(acts["f"] ** 2)
    emb.apply_gradients(tape.gradient(loss, acts), batch)
    (name,) = tracker.table_names
    np.testing.assert_array_equal(tracker.changed_since(c0).tables[name].rows, np.unique(ids))
