"""Touched-row tracking of static tiered tables (docs/tracking.md): `te.tracking.Tracker` over a tiered table
against the same table in memory trained on the same ids.

Reference: the in-memory table's tracker (its rows and `read_rows`), and numpy from the semantics (the rows a step
changes are its unique ids; an optimizer that updates every row marks the table full).  The tiered table's cache
holds 8 of its 64 rows, so the steps evict dirty rows and `read_rows` reads both cached and on-disk rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import embedding, step, table_pair

import tf_embed_ops as te
from tf_embed_ops.tiered import ops as tiered_ops

_emb = tf.tpu.experimental.embedding
V, DIM, CACHE_ROWS = 64, 4, 8
OPTIMIZERS = {
    "adagrad": lambda: _emb.Adagrad(0.1),
    "sgd": lambda: _emb.SGD(0.1),
    "lazy_adam": lambda: _emb.Adam(0.05, lazy_adam=True),
    "adam": lambda: _emb.Adam(0.05, lazy_adam=False),  # updates every row: full
}
BATCHES = [
    np.array([3, 7, 7, 42, 63, 0, 12, 3], np.int64),
    np.array([5, 6, 7, 8, 9, 10, 11, 13, 5], np.int64),
    np.array([42, 1], np.int64),
]


def _pair(tmp_path, optimizer_name="adagrad", **options):
    """(in-memory embedding, tiered embedding, tiered table): the same initial rows and optimizer."""
    memory, tiered = table_pair(tmp_path / "rows", OPTIMIZERS[optimizer_name](), V, DIM, CACHE_ROWS, **options)
    emb_t = embedding(tiered)
    return embedding(memory), emb_t, emb_t.tiered_tables[tiered]


def _train(embs, ids):
    for emb in embs:
        step(emb, {"f": tf.constant(ids)})


def _assert_same_read(tracker_m, tracker_t, rows):
    a, b = tracker_m.read_rows("t", rows), tracker_t.read_rows("t", rows)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_changed_rows_and_read_rows_match_the_in_memory_table(tmp_path, optimizer_name):
    emb_m, emb_t, table = _pair(tmp_path, optimizer_name)
    tracker_m, tracker_t = te.tracking.Tracker(emb_m), te.tracking.Tracker(emb_t)
    assert tracker_t.kind("t") == "static"
    cursor_m, cursor_t = tracker_m.cursor(), tracker_t.cursor()
    for ids in BATCHES:
        _train([emb_m, emb_t], ids)
        changes_m, changes_t = tracker_m.changed_since(cursor_m), tracker_t.changed_since(cursor_t)
        cm, ct = changes_m.tables["t"], changes_t.tables["t"]
        expected = np.arange(V) if optimizer_name == "adam" else np.unique(ids)
        assert ct.full == cm.full == (optimizer_name == "adam")
        np.testing.assert_array_equal(ct.rows, expected)
        np.testing.assert_array_equal(cm.rows, expected)
        _assert_same_read(tracker_m, tracker_t, ct.rows)
        cursor_m, cursor_t = changes_m.cursor, changes_t.cursor
    # Nothing since: an empty answer.
    assert tracker_t.changed_since(cursor_t).tables["t"].rows.size == 0 or optimizer_name == "adam"
    # Every row, cached or on disk, in an order that is not ascending, with a duplicate.
    rows = np.concatenate([np.arange(V)[::-1], [7]]).astype(np.int64)
    _assert_same_read(tracker_m, tracker_t, rows)
    assert table.stats()["resident_rows"].numpy() <= CACHE_ROWS


def test_sixteen_bit_rows_read_in_their_storage_dtype(tmp_path):
    emb_m, emb_t, _ = _pair(tmp_path, storage_dtype=tf.bfloat16)
    tracker_m, tracker_t = te.tracking.Tracker(emb_m), te.tracking.Tracker(emb_t)
    cursor = tracker_t.cursor()
    _train([emb_m, emb_t], BATCHES[0])
    rows = tracker_t.changed_since(cursor).tables["t"].rows
    np.testing.assert_array_equal(rows, np.unique(BATCHES[0]))
    assert tracker_t.read_rows("t", rows)["parameters"].dtype == tf.bfloat16.as_numpy_dtype
    _assert_same_read(tracker_m, tracker_t, rows)


def test_read_rows_does_not_fill_the_cache_and_sees_dirty_rows(tmp_path):
    emb_m, emb_t, table = _pair(tmp_path)
    tracker_m, tracker_t = te.tracking.Tracker(emb_m), te.tracking.Tracker(emb_t)
    _train([emb_m, emb_t], BATCHES[2])  # rows 1 and 42 are now dirty in the cache
    before = table.stats()
    _assert_same_read(tracker_m, tracker_t, np.arange(V))
    after = table.stats()
    for key in ("resident_rows", "hits", "misses", "evictions", "rows_written"):
        assert int(after[key]) == int(before[key]), key


def test_cursors_are_independent(tmp_path):
    emb_m, emb_t, _ = _pair(tmp_path)
    tracker = te.tracking.Tracker(emb_t)
    a = b = tracker.cursor()
    _train([emb_t], BATCHES[0])
    a = tracker.changed_since(a).cursor  # consumer a reads the first step
    _train([emb_t], BATCHES[2])
    np.testing.assert_array_equal(tracker.changed_since(a).tables["t"].rows, np.unique(BATCHES[2]))
    np.testing.assert_array_equal(
        tracker.changed_since(b).tables["t"].rows, np.unique(np.concatenate([BATCHES[0], BATCHES[2]]))
    )
    # A second Tracker of the same table shares the stamps and keeps its own cursors.
    other = te.tracking.Tracker(emb_t)
    np.testing.assert_array_equal(other.changed_since(a).tables["t"].rows, np.unique(BATCHES[2]))
    assert other.changed_since(None).tables["t"].full


def test_mark_all_and_a_restore_make_every_consumer_read_full(tmp_path):
    _, emb_t, table = _pair(tmp_path)
    tracker = te.tracking.Tracker(emb_t)
    cursor = tracker.cursor()
    tracker.mark_all()
    changes = tracker.changed_since(cursor)
    assert changes.tables["t"].full
    np.testing.assert_array_equal(changes.tables["t"].rows, np.arange(V))
    cursor = changes.cursor
    _train([emb_t], BATCHES[0])
    saved = tf.train.Checkpoint(embedding=emb_t).save(str(tmp_path / "ckpt" / "c"))
    cursor = tracker.changed_since(cursor).cursor
    _train([emb_t], BATCHES[1])
    cursor = tracker.changed_since(cursor).cursor
    assert tracker.changed_since(cursor).tables["t"].rows.size == 0
    # The streamed restore writes every row through the tier: every consumer reads full without mark_all.
    before_restore = tracker.cursor()
    tf.train.Checkpoint(embedding=emb_t).restore(saved).assert_consumed()
    for since in (cursor, before_restore):
        changes = tracker.changed_since(since).tables["t"]
        assert changes.full
        np.testing.assert_array_equal(changes.rows, np.arange(V))
    # The restored rows are the saved ones.
    after = tracker.read_rows("t", np.arange(V))
    np.testing.assert_array_equal(after["parameters"], table.read_all()[0])


CHUNK_ROWS = 7  # 64 rows in 10 chunks: no chunk write covers the whole table


def _chunked(table: te.TableConfig) -> te.TableConfig:
    """`table` (Adagrad: one slot of dim floats) with restores and saves moving CHUNK_ROWS rows at a time."""
    table.storage = te.Tiered(**{**table.storage.get_config(), "chunk_bytes": CHUNK_ROWS * 4 * 2 * DIM})
    return table


def _keras_model(table: te.TableConfig):
    """(model, layer): feature "f" over `table`, a Dense head."""
    import keras  # pylint: disable=import-outside-toplevel

    from tf_embed_ops import keras as te_keras  # pylint: disable=import-outside-toplevel

    layer = te_keras.TPUEmbedding({"f": _emb.FeatureConfig(table, name="f")}, name="embedding")
    inputs = {"f": keras.Input(shape=(), dtype="int64", name="f")}
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(seed=7), name="head")
    model = keras.Model(inputs, head(layer(inputs)["f"]))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model, layer


class _Front:
    """One front end over a tiered table (or the same table in memory): train, checkpoint object, tracker, state."""

    def __init__(self, tmp_path, via: str, tiered: bool = True, vocab: int = V):
        memory, config = table_pair(tmp_path / "rows", _emb.Adagrad(0.1), vocab, DIM, CACHE_ROWS)
        config = _chunked(config) if tiered else memory
        if via == "keras":
            self.model, layer = _keras_model(config)
            self.root = self.model
            engine = layer
        else:
            self.model = None
            self.root = engine = embedding(config)
        self.tracker = te.tracking.Tracker(self.root)
        self.table = engine.tiered_tables[config] if tiered else None
        self.engine, self._config = engine, config

    def train(self, ids) -> None:
        if self.model is None:
            _train([self.root], ids)
        else:
            self.model.fit({"f": ids}, np.ones([ids.size, 1], np.float32), batch_size=ids.size, verbose=0)

    def state(self) -> list:
        if self.table is not None:
            values, slots = self.table.read_all()
            return [values, *(slots[k] for k in sorted(slots))]
        slots = self.engine.slot_variables[self._config]
        return [self.engine.embedding_tables[self._config].numpy(), *(slots[k].numpy() for k in sorted(slots))]


def _assert_state(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("via", ["embedding", "keras"])
def test_a_chunked_restore_makes_every_consumer_read_full(tmp_path, via):
    front = _Front(tmp_path, via)
    assert front.table.chunk_rows == CHUNK_ROWS and len(front.table.chunks()) == 10
    first = front.tracker.cursor()  # a consumer from before training
    front.train(BATCHES[0])
    saved_state = front.state()
    saved = tf.train.Checkpoint(root=front.root).write(str(tmp_path / "ckpt" / "c"))
    front.train(BATCHES[1])
    assert not np.array_equal(front.state()[0], saved_state[0])
    cursor = front.tracker.changed_since(first).cursor  # a consumer up to date before the restore
    assert front.tracker.changed_since(cursor).tables["t"].rows.size == 0
    tf.train.Checkpoint(root=front.root).read(saved).assert_existing_objects_matched()
    _assert_state(front.state(), saved_state)
    for since in (cursor, first):
        changes = front.tracker.changed_since(since).tables["t"]
        assert changes.full, "a restore streamed in 10 chunks must read full, not every row listed"
        np.testing.assert_array_equal(changes.rows, np.arange(V))
    # After it, the rows of the next step only.
    cursor = front.tracker.changed_since(cursor).cursor
    front.train(BATCHES[2])
    changes = front.tracker.changed_since(cursor).tables["t"]
    assert not changes.full
    np.testing.assert_array_equal(changes.rows, np.unique(BATCHES[2]))


def test_the_in_memory_table_reads_full_after_the_restore_and_mark_all(tmp_path):
    """The comparison: the same table in memory, restored by tf.train.Checkpoint (TensorFlow assigns the variables;
    docs/tracking.md), reads full once `mark_all` is called, as te.checkpoint does; the tiered one needs no call."""
    fronts = [_Front(tmp_path / "m", "embedding", tiered=False), _Front(tmp_path / "t", "embedding")]
    answers = []
    for k, front in enumerate(fronts):
        front.train(BATCHES[0])
        saved = tf.train.Checkpoint(root=front.root).write(str(tmp_path / "ckpt" / str(k)))
        front.train(BATCHES[1])
        cursor = front.tracker.changed_since(front.tracker.cursor()).cursor
        tf.train.Checkpoint(root=front.root).read(saved).assert_existing_objects_matched()
        if front.table is None:
            front.tracker.mark_all()
        answers.append(front.tracker.changed_since(cursor).tables["t"])
    for changes in answers:
        assert changes.full
        np.testing.assert_array_equal(changes.rows, np.arange(V))
    _assert_state(fronts[0].state(), fronts[1].state())  # the same rows restored, bitwise


def test_a_keras_weights_load_makes_every_consumer_read_full(tmp_path):
    front = _Front(tmp_path, "keras")
    front.train(BATCHES[0])
    store: dict = {}
    front.engine.save_own_variables(store)
    saved_state = front.state()
    front.train(BATCHES[1])
    cursor = front.tracker.changed_since(front.tracker.cursor()).cursor
    front.engine.load_own_variables(store)
    _assert_state(front.state(), saved_state)
    changes = front.tracker.changed_since(cursor).tables["t"]
    assert changes.full
    np.testing.assert_array_equal(changes.rows, np.arange(V))


@pytest.mark.parametrize("via", ["embedding", "keras"])
def test_a_refused_restore_marks_nothing_and_changes_nothing(tmp_path, via):
    larger = _Front(tmp_path / "larger", via, vocab=V + 8)  # the same head: only the table differs
    larger.train(BATCHES[0])
    saved = tf.train.Checkpoint(root=larger.root).write(str(tmp_path / "ckpt" / "larger"))
    front = _Front(tmp_path / "t", via)
    front.train(BATCHES[1])
    cursor = front.tracker.changed_since(front.tracker.cursor()).cursor
    state, step = front.state(), int(front.table.step.numpy())
    with pytest.raises(ValueError, match=r"'t'.*72 rows.*64 rows"):
        tf.train.Checkpoint(root=front.root).read(saved)
    _assert_state(front.state(), state)
    assert int(front.table.step.numpy()) == step
    changes = front.tracker.changed_since(cursor).tables["t"]
    assert not changes.full and changes.rows.size == 0
    if via == "keras":  # the Keras weights of the larger table: refused the same way
        store: dict = {}
        larger.engine.save_own_variables(store)
        with pytest.raises(ValueError, match=r"tiered table 't'.*72 rows.*64 rows"):
            front.engine.load_own_variables(store)
        _assert_state(front.state(), state)
        changes = front.tracker.changed_since(cursor).tables["t"]
        assert not changes.full and changes.rows.size == 0


def test_the_mark_all_op_changes_no_row_and_is_a_no_op_untracked(tmp_path):
    _, emb_t, table = _pair(tmp_path)
    _train([emb_t], BATCHES[0])
    rows, slots = table.read_all()
    stats = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
    table.mark_all_touched()  # no tracker yet: nothing to mark
    tracker = te.tracking.Tracker(emb_t)
    cursor = tracker.changed_since(None).cursor
    assert tracker.changed_since(cursor).tables["t"].rows.size == 0
    tiered_ops.tiered_table_mark_all_touched(table.handle)
    assert {k: int(v) for k, v in table.stats().items() if k != "hit_rate"} == stats  # no row read or written
    changes = tracker.changed_since(cursor).tables["t"]
    assert changes.full
    np.testing.assert_array_equal(changes.rows, np.arange(V))
    after_rows, after_slots = table.read_all()
    _assert_state([after_rows, *after_slots.values()], [rows, *slots.values()])
    with pytest.raises(ValueError, match=r"table: expected a tiered table handle"):
        tiered_ops.tiered_table_mark_all_touched(tf.constant(1))


def test_row_writes_of_part_of_the_table_mark_those_rows(tmp_path):
    _, emb_t, table = _pair(tmp_path)
    tracker = te.tracking.Tracker(emb_t)
    cursor = tracker.cursor()
    table.write_rows(10, np.ones([3, DIM], np.float32), [np.full([3, DIM], 0.5, np.float32)])
    changes = tracker.changed_since(cursor).tables["t"]
    assert not changes.full
    np.testing.assert_array_equal(changes.rows, [10, 11, 12])
    np.testing.assert_array_equal(tracker.read_rows("t", changes.rows)["parameters"], np.ones([3, DIM]))


def test_bad_row_ids_are_refused_and_change_nothing(tmp_path):
    emb_m, emb_t, table = _pair(tmp_path)
    tracker = te.tracking.Tracker(emb_t)
    _train([emb_t], BATCHES[0])
    cursor = tracker.cursor()
    rows_before, slots_before = table.read_all()
    stats_before = {k: int(v) for k, v in table.stats().items()}
    for bad in ([0, V], [-1], [5, 2**40]):
        with pytest.raises(ValueError, match=r"table 't': rows must be in \[0, 64\)"):
            tracker.read_rows("t", bad)
    # The op itself checks every id before reading any (the Python check aside).
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tiered table 't': rows\[2\] = 64 is outside \[0, 64\)"):
        tiered_ops.tiered_table_gather_rows(table.handle, [1, 2, V, 3], num_slots=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows\[0\] = -3 is outside"):
        tiered_ops.tiered_table_gather_rows(table.handle, [-3], num_slots=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"has 1 slots but the op gives 0"):
        tiered_ops.tiered_table_gather_rows(table.handle, [1], num_slots=0)
    assert {k: int(v) for k, v in table.stats().items()} == stats_before
    rows_after, slots_after = table.read_all()
    np.testing.assert_array_equal(rows_after, rows_before)
    for k in slots_before:
        np.testing.assert_array_equal(slots_after[k], slots_before[k])
    assert tracker.changed_since(cursor).tables["t"].rows.size == 0
    # An empty list reads nothing.
    assert tracker.read_rows("t", np.zeros([0], np.int64))["parameters"].shape == (0, DIM)


def test_a_rejected_step_marks_nothing(tmp_path):
    _, emb_t, _ = _pair(tmp_path)
    tracker = te.tracking.Tracker(emb_t)
    cursor = tracker.cursor()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        _train([emb_t], np.array([1, V + 5], np.int64))
    assert tracker.changed_since(cursor).tables["t"].rows.size == 0


# Tiered dynamic tables: the DynamicTable behind a tiered one (keys, metadata, stamps in DRAM) is tracked as in
# memory; the changed rows' values come from the tier.
DYNAMIC_BATCHES = [
    [3, 900, 900, 7, 1 << 40, 12],
    [12, 13, 40, 41, 3, 66],
    [70, 71, 72, 900, 7, 7, 5],
    [5, 12, 40, 1 << 40, 3, 33, 34],
]


def _dynamic_pair(tmp_path, optimizer, chunk_bytes=None, **options):
    """(in-memory embedding, tiered embedding) over the same DynamicTableConfig "t" (a cache of 8 rows)."""
    from tiered_support import cache_bytes_for  # pylint: disable=import-outside-toplevel

    common = dict(optimizer=optimizer, seed=11, **options)
    chunks = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    cache = cache_bytes_for(CACHE_ROWS, optimizer, DIM)
    storage = te.Tiered(cache_bytes=cache, directory=str(tmp_path / "dyn"), **chunks)
    return (
        embedding(te.DynamicTableConfig("t", DIM, **common)),
        embedding(te.DynamicTableConfig("t", DIM, storage=storage, **common)),
    )


def _assert_same_changes(a, b, with_values=True):
    assert a.kind == b.kind == "dynamic" and a.full == b.full
    np.testing.assert_array_equal(a.rows, b.rows)
    np.testing.assert_array_equal(a.evicted, b.evicted)
    for key in a.contents:
        if not with_values and key in ("weights", "slots"):
            assert b.contents[key] is None, key
            continue
        np.testing.assert_array_equal(a.contents[key], b.contents[key], err_msg=key)


@pytest.mark.parametrize("optimizer_name", ["adagrad", "adam"])
def test_tiered_dynamic_changes_match_the_in_memory_table(tmp_path, optimizer_name):
    optimizer = {"adagrad": te.optimizers.Adagrad(0.1), "adam": _emb.Adam(0.05, lazy_adam=False)}[optimizer_name]
    emb_m, emb_t = _dynamic_pair(tmp_path, optimizer, eviction=te.dynamic.LRU(10))
    tracker_m, tracker_t = te.tracking.Tracker(emb_m), te.tracking.Tracker(emb_t)
    assert tracker_t.kind("t") == "dynamic"
    cursor_m, cursor_t = tracker_m.cursor(), tracker_t.cursor()
    seen_evictions = False
    for ids in DYNAMIC_BATCHES:
        _train([emb_m, emb_t], np.array(ids, np.int64))
        changes_m, changes_t = tracker_m.changed_since(cursor_m), tracker_t.changed_since(cursor_t)
        cm, ct = changes_m.tables["t"], changes_t.tables["t"]
        # Non-lazy Adam writes every row: full, whose tiered contents carry keys and metadata only.
        assert ct.full == (optimizer_name == "adam")
        _assert_same_changes(cm, ct, with_values=not ct.full)
        if not ct.full:
            # Lazy: the batch's keys that have rows now (all of them: no admission policy).
            np.testing.assert_array_equal(ct.rows, np.unique(ids))
        seen_evictions = seen_evictions or ct.evicted.size > 0
        # The rows by key, read from the tier in two chunks: the in-memory contents' values.
        if cm.rows.size:
            half = cm.rows.size // 2
            parts = [tracker_t.read_rows("t", cm.rows[:half]), tracker_t.read_rows("t", cm.rows[half:])]
            np.testing.assert_array_equal(np.concatenate([p["weights"] for p in parts]), cm.contents["weights"])
            np.testing.assert_array_equal(np.concatenate([p["slots"] for p in parts]), cm.contents["slots"])
        cursor_m, cursor_t = changes_m.cursor, changes_t.cursor
    assert seen_evictions or optimizer_name == "adam"  # LRU(10) over 13 keys evicts


@pytest.mark.parametrize("chunk_bytes", [None, 3 * 4 * 2 * DIM], ids=["one-chunk", "rows-3-at-a-time"])
def test_tiered_dynamic_restore_and_mark_all_read_full(tmp_path, chunk_bytes):
    # The streamed restore imports the keys first (the import marks the table full), then writes the rows chunk
    # by chunk: full however many chunks.
    _, emb_t = _dynamic_pair(tmp_path, te.optimizers.Adagrad(0.1), chunk_bytes)
    tracker = te.tracking.Tracker(emb_t)
    cursor = tracker.cursor()
    _train([emb_t], np.array(DYNAMIC_BATCHES[0], np.int64))
    saved = tf.train.Checkpoint(embedding=emb_t).save(str(tmp_path / "ckpt" / "c"))
    cursor = tracker.changed_since(cursor).cursor
    _train([emb_t], np.array(DYNAMIC_BATCHES[1], np.int64))
    cursor = tracker.changed_since(cursor).cursor
    tf.train.Checkpoint(embedding=emb_t).restore(saved)
    changes = tracker.changed_since(cursor).tables["t"]
    assert changes.full and changes.contents["weights"] is None
    table = next(iter(emb_t.dynamic_tables.values()))
    exported = {k: v.numpy() for k, v in table.export().items()}
    np.testing.assert_array_equal(changes.rows, exported["keys"])
    values = tracker.read_rows("t", changes.rows)
    np.testing.assert_array_equal(values["weights"], exported["weights"])
    np.testing.assert_array_equal(values["slots"], exported["slots"])
    cursor = tracker.changed_since(cursor).cursor
    tracker.mark_all()
    assert tracker.changed_since(cursor).tables["t"].full


def test_tiered_dynamic_read_rows_refuses_a_key_without_a_row_and_changes_nothing(tmp_path):
    _, emb_t = _dynamic_pair(tmp_path, te.optimizers.Adagrad(0.1))
    tracker = te.tracking.Tracker(emb_t)
    _train([emb_t], np.array(DYNAMIC_BATCHES[0], np.int64))
    cursor = tracker.cursor()
    table = next(iter(emb_t.dynamic_tables.values()))
    before = {k: v.numpy() for k, v in table.export().items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'t'.*\b4242\b"):
        tracker.read_rows("t", [3, 4242])
    after = {k: v.numpy() for k, v in table.export().items()}
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert tracker.changed_since(cursor).tables["t"].rows.size == 0


def test_in_memory_dynamic_read_rows_is_still_refused(tmp_path):
    emb_m, _ = _dynamic_pair(tmp_path, te.optimizers.Adagrad(0.1))
    with pytest.raises(ValueError, match=r"table 't' is dynamic: its rows come with changed_since"):
        te.tracking.Tracker(emb_m).read_rows("t", [3])
