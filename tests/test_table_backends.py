"""The table backend protocol: one lookup and one update across the groups of an embedding, in feature order, every
group's checks before any group writes (`tf_embed_ops.backends`)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tiered_support import step, table_pair, tiered_state

import tf_embed_ops as te
from tf_embed_ops import distribute as ted
from tf_embed_ops import keras as te_keras
from tf_embed_ops.backends import protocol, walk

_emb = tf.tpu.experimental.embedding
V, DIM, CACHE_ROWS = 40, 4, 8


class _Recorder:
    """A group of one kind for the walk: records what the walk asks of it, in one log shared by every group."""

    prefetches = False

    def __init__(self, kind: str, positions: list, log: list, refuse: bool = False):
        self.kind, self.positions, self.features, self.table_configs = kind, positions, [], []
        self._log, self._refuse = log, refuse

    def build(self, owner):
        del owner

    @property
    def tables(self):
        return {}

    def normalize_input(self, feature, x, weights, max_sequence_length, name):
        return x

    def xla_refusal(self):
        return None

    def lookup(self, inputs, training):
        self._log.append(("lookup", self.kind, list(inputs)))
        return [f"{self.kind}:{x}" for x in inputs]

    def check_trainable(self):
        self._log.append(("check_trainable", self.kind))

    def evaluate_learning_rates(self):
        self._log.append(("rates", self.kind))
        return [self.kind]

    def validate_send(self, gradients, inputs, learning_rates):
        self._log.append(("validate", self.kind, list(gradients), learning_rates))
        if self._refuse:
            raise ValueError(f"{self.kind} refuses")
        return []

    def send_gradients(self, gradients, inputs, learning_rates):
        self._log.append(("send", self.kind, list(gradients), list(inputs), learning_rates))
        return self.kind

    def probe(self, sent):
        return None

    def prefetch(self, inputs):
        return []

    def lookup_and_update(self, inputs, trigger):
        return self.lookup(inputs, True)

    def serving_group(self, context):
        return self

    def check_prune(self, name, prune):
        del name, prune

    def export_form(self, config, table, mode, prune):
        return protocol.ExportForm()

    def tracking_view(self, config, table):
        return None

    def chain_state(self, config, view):
        return None

    def restore_checks(self):
        return {}

    keras_weights_prefix = None

    def save_keras_weights(self, store):
        del store

    def check_keras_weights(self, store):
        del store
        return []


def test_the_groups_are_of_the_protocol():
    table = te.TableConfig(V, DIM, name="s", optimizer=te.optimizers.SGD(0.1))
    emb = te.TPUEmbedding({"s": _emb.FeatureConfig(table), "d": _emb.FeatureConfig(te.DynamicTableConfig("d", DIM))})
    assert [g.kind for g in emb.groups] == ["in-memory", "dynamic"]
    assert all(isinstance(g, protocol.TableGroup) for g in emb.groups)
    assert isinstance(_Recorder("x", [], []), protocol.TableGroup)


def test_the_walk_puts_each_groups_activations_back_in_feature_order():
    log: list = []
    groups = [_Recorder("a", [1, 3], log), _Recorder("b", [0, 2], log)]
    assert walk.lookup(groups, ["x0", "x1", "x2", "x3"], False) == ["b:x0", "a:x1", "b:x2", "a:x3"]
    assert [entry[2] for entry in log] == [["x1", "x3"], ["x0", "x2"]]


def test_every_group_is_checked_before_any_group_writes():
    log: list = []
    groups = [_Recorder("first", [0], log), _Recorder("second", [2], log), _Recorder("third", [1], log)]
    sent = walk.send(groups, [tf.constant(0.0), tf.constant(1.0), tf.constant(2.0)], ["i0", "i1", "i2"])
    assert sent == ["first", "second", "third"]
    verbs = [(entry[0], entry[1]) for entry in log]
    assert verbs == [
        ("check_trainable", "first"),
        ("check_trainable", "second"),
        ("check_trainable", "third"),
        ("rates", "first"),
        ("rates", "second"),
        ("rates", "third"),
        # The first group validates inside its own update, before its first write: it is never asked.
        ("validate", "second"),
        ("validate", "third"),
        ("send", "first"),
        ("send", "second"),
        ("send", "third"),
    ]
    sends = {entry[1]: entry for entry in log if entry[0] == "send"}
    assert float(sends["second"][2][0]) == 2.0 and sends["second"][3] == ["i2"] and sends["second"][4] == ["second"]
    assert float(sends["third"][2][0]) == 1.0 and sends["third"][3] == ["i1"]


def test_a_group_that_refuses_stops_the_step_before_any_write():
    log: list = []
    groups = [_Recorder("first", [0], log), _Recorder("second", [1], log, refuse=True), _Recorder("third", [2], log)]
    with pytest.raises(ValueError, match="second refuses"):
        walk.send(groups, [tf.constant(0.0)] * 3, ["i0", "i1", "i2"])
    assert not [entry for entry in log if entry[0] == "send"]


def _three_kinds(tmp_path, rate):
    """An embedding with a table of each kind: static in memory, dynamic, static tiered (a small cache)."""
    static = te.TableConfig(V, DIM, name="s", optimizer=te.optimizers.SGD(0.5))
    dynamic = te.DynamicTableConfig("d", DIM, optimizer=te.optimizers.SGD(lambda: rate))
    _, tiered = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS, name="t")
    features = {"s": _emb.FeatureConfig(static), "d": _emb.FeatureConfig(dynamic), "t": _emb.FeatureConfig(tiered)}
    emb = te.TPUEmbedding(features)
    emb.build()
    return emb, static, dynamic, tiered


def _state(emb, static, dynamic, tiered):
    exported = emb.dynamic_tables[dynamic].export()
    return [
        emb.embedding_tables[static].numpy(),
        exported["keys"].numpy(),
        exported["weights"].numpy(),
        exported["slots"].numpy(),
        *tiered_state(emb, tiered)[:1],
        *tiered_state(emb, tiered)[1].values(),
    ]


@pytest.mark.parametrize("in_function", [False, True])
@pytest.mark.parametrize("refused_by", ["tiered", "dynamic"])
def test_a_step_one_kind_refuses_changes_no_table_of_any_kind(tmp_path, in_function, refused_by):
    rate = tf.Variable(0.25)
    emb, static, dynamic, tiered = _three_kinds(tmp_path, rate)
    assert [g.kind for g in emb.groups] == ["in-memory", "tiered", "dynamic"]
    ids = tf.constant([1, 2, 3], tf.int64)
    run = tf.function(step) if in_function else step
    run(emb, {"s": ids, "d": ids, "t": ids})
    before = _state(emb, static, dynamic, tiered)
    if refused_by == "tiered":
        bad = {"s": ids, "d": ids, "t": tf.range(CACHE_ROWS + 1, dtype=tf.int64)}  # more rows than its cache holds
        message = r"'t'[\s\S]*cache_bytes"
    else:
        rate.assign(float("nan"))  # only the dynamic op reads its learning rate
        bad = {"s": ids, "d": ids, "t": ids}
        message = "must be finite and >= 0"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        run(emb, bad)
    for got, want in zip(_state(emb, static, dynamic, tiered), before, strict=True):
        np.testing.assert_array_equal(got, want)
    rate.assign(0.25)
    run(emb, {"s": ids, "d": ids, "t": ids})  # a good step still trains every kind
    assert not np.array_equal(emb.embedding_tables[static].numpy(), before[0])


def test_each_kind_gives_a_chain_state_of_the_protocol(tmp_path):
    """An incremental checkpoint asks each table's kind (`TableGroup.chain_state`), never the table's class."""
    emb, *_ = _three_kinds(tmp_path, 0.1)
    tracker = te.tracking.Tracker(emb)
    states = {}
    for name in tracker.table_names:
        group, config = tracker.source(name)
        assert config.name == name
        states[name] = group.chain_state(config, tracker.table(name))
    assert all(isinstance(s, protocol.ChainState) for s in states.values())
    got = {n: (s.delta_kind, s.streamed, s.table is not None) for n, s in states.items()}
    assert got == {"s": ("static", False, False), "d": ("dynamic", False, True), "t": ("static", True, True)}
    assert states["t"].table.streams_checkpoint and not states["d"].table.streams_checkpoint
    assert list(states["t"].dense_variables()) == ["tiered_table_step/t"]
    assert states["s"].variables() and not states["t"].variables() and not states["d"].variables()
    with pytest.raises(ValueError, match="no tracked table named 'x'"):
        tracker.source("x")
    # A restore's checks come from the groups too, one kind each (the in-memory group's: every variable child).
    checks = {}
    for group in emb.groups:
        checks.update(group.restore_checks())
    kinds = {name: type(check).__name__ for name, check in checks.items() if "/" not in name}
    assert kinds == {"s": "VariableCheck", "d": "DynamicCheck", "t": "RestoreCheck"}


def test_nothing_branches_on_a_groups_kind_name(tmp_path, monkeypatch):
    """The front end, the tracker and the exporter ask the groups (`prefetches`, `normalize_input`, `tracking_view`,
    `check_prune`, `export_form`): renamed kinds change nothing they do."""
    emb, static, dynamic, tiered = _three_kinds(tmp_path, 0.1)
    for group in emb.groups:
        monkeypatch.setattr(group, "kind", "renamed " + group.kind)
    ids = tf.constant([1, 2, 3], tf.int64)
    step(emb, {"s": ids, "d": ids, "t": ids})
    table = emb.tiered_tables[tiered]
    before = int(table.stats()["rows_read"])
    assert emb.prefetch({"s": ids, "d": ids, "t": tf.constant([20, 21], tf.int64)}) == []  # eager: it has run
    assert int(table.stats()["rows_read"]) - before == 2
    tracker = te.tracking.Tracker(emb)
    assert {n: (tracker.kind(n), tracker.table(n).tiered) for n in "sdt"} == {
        "s": ("static", False),
        "d": ("dynamic", False),
        "t": ("static", True),
    }
    assert set(tracker.changed_since(None).tables["s"].rows) == set(range(V))  # before tracking: full
    # Each table's serving form for an export, as its group gives it.
    forms = {c.name: (g, g.export_form(c, t, None, None)) for g in emb.groups for c, t in g.tables.items()}
    assert forms["s"][1].served is None and forms["s"][1].metadata["rows_exported"] == V
    assert forms["d"][1] == protocol.ExportForm(freeze=(None, None))
    assert forms["t"][1].streamed and forms["t"][1].metadata["rows_trained"] == V
    group, trained = forms["s"][0], emb.embedding_tables[static].numpy()
    encoded = group.export_form(static, group.tables[static], "int8", None)
    assert encoded.served.gather_rows(tf.constant([0])).shape == [1, DIM] and not encoded.streamed
    assert encoded.metadata["quantization"] == "int8"
    np.testing.assert_array_equal(emb.embedding_tables[static].numpy(), trained)  # the training table is only read
    with pytest.raises(ValueError, match="'t' is tiered"):
        forms["t"][0].check_prune("t", te.serving.Prune(min_l2_norm=0.1))
    with pytest.raises(ValueError, match="min_count"):
        group.check_prune("s", te.serving.Prune(min_count=2))
    forms["d"][0].check_prune("d", te.serving.Prune(min_count=2))  # a dynamic table tracks counts


def _keras_three_kinds(tmp_path, directory):
    """A Keras model over a layer with a table of each kind ("s", "d", "t"; the tiered rows in `directory`) and a
    Dense head, trained one step; returns (model, layer, the three configs)."""
    static = te.TableConfig(V, DIM, name="s", optimizer=te.optimizers.SGD(0.5))
    dynamic = te.DynamicTableConfig("d", DIM, optimizer=te.optimizers.SGD(0.3))
    _, tiered = table_pair(tmp_path / directory, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS, name="t")
    configs = {"s": static, "d": dynamic, "t": tiered}
    layer = te_keras.TPUEmbedding({n: _emb.FeatureConfig(c, name=n) for n, c in configs.items()}, name="embedding")
    inputs = {n: keras.Input(shape=(), dtype="int64", name=n) for n in configs}
    acts = layer(inputs)
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(seed=7), name="head")
    model = keras.Model(inputs, head(keras.layers.Concatenate()([acts[n] for n in configs])))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    ids = np.array([1, 2, 3, 5], np.int64)
    model.fit({n: ids for n in configs}, np.ones([4, 1], np.float32), batch_size=4, verbose=0)
    return model, layer, configs


def _keras_tables(layer, configs):
    """Every table's rows as numpy: the in-memory table, the dynamic table's keys and rows, the tiered rows."""
    exported = layer.dynamic_tables[configs["d"]].export()
    rows, slots = layer.tiered_tables[configs["t"]].read_all()
    return (
        [layer.embedding_tables[configs["s"]].numpy(), exported["keys"].numpy(), exported["weights"].numpy()]
        + [np.asarray(rows)]
        + [np.asarray(v) for v in slots.values()]
    )


def _by_name(layer):
    """`{table name: config}` of a layer's tables of every kind."""
    tables = {**layer.embedding_tables, **layer.dynamic_tables, **layer.tiered_tables}
    return {c.name: c for c in tables}


def test_model_save_and_load_of_every_kind_never_ask_a_kind_name(tmp_path, monkeypatch):
    """`model.save` / `load_model` of a layer with a table of each kind ask the groups (`save_keras_weights`,
    `check_keras_weights`, the kinds' `keras_weights_prefix`): renamed kinds change nothing; a store holding every
    kind's entries loads into a layer without those kinds (their keys are filtered out of Keras' own load)."""
    for kind in te.TPUEmbedding.table_kinds():
        monkeypatch.setattr(kind, "kind", "renamed " + kind.kind)
    model, layer, configs = _keras_three_kinds(tmp_path, "rows")
    saved = _keras_tables(layer, configs)
    path = str(tmp_path / "model.keras")
    model.save(path)
    with te_keras.tiered_storage(lambda name, old: te.Tiered(**{**old.get_config(), "directory": str(tmp_path / "l")})):
        loaded = keras.models.load_model(path)
    loaded_layer = loaded.get_layer("embedding")
    assert {g.kind for g in loaded_layer.embedding.groups} == {"renamed in-memory", "renamed dynamic", "renamed tiered"}
    for got, want in zip(_keras_tables(loaded_layer, _by_name(loaded_layer)), saved, strict=True):
        np.testing.assert_array_equal(got, want)

    store: dict = {}
    layer.save_own_variables(store)
    assert any(k.startswith("dynamic.d.") for k in store) and any(k.startswith("tiered.t.") for k in store)
    only_static = te_keras.TPUEmbedding(
        {"s": _emb.FeatureConfig(te.TableConfig(V, DIM, name="s"), name="s")}, optimizer=te.optimizers.SGD(0.5)
    )
    only_static.load_own_variables(store)
    np.testing.assert_array_equal(next(iter(only_static.embedding_tables.values())).numpy(), saved[0])
    # The sharded class's kinds own the same store keys (its tiered kind refuses tiered tables, not their entries).
    prefixes = {k.keras_weights_prefix for k in te.TPUEmbedding.table_kinds()}
    assert prefixes == {None, "dynamic.", "tiered."}
    assert {k.keras_weights_prefix for k in ted.ShardedTPUEmbedding.table_kinds()} == prefixes


def test_prefetch_without_a_group_that_prefetches_does_nothing():
    """No group prefetches (in-memory and dynamic tables): `prefetch` returns before it reads the batch."""
    table = te.TableConfig(V, DIM, name="s", optimizer=te.optimizers.SGD(0.1))
    emb = te.TPUEmbedding({"s": _emb.FeatureConfig(table), "d": _emb.FeatureConfig(te.DynamicTableConfig("d", DIM))})
    assert not any(g.prefetches for g in emb.groups)
    assert emb.prefetch({"s": tf.constant([1]), "d": tf.constant(["a string key"])}) == []
    assert not emb.built
    with pytest.raises(ValueError, match="Feature d: table 'd' has key_dtype int64"):
        emb.normalize_inputs({"s": tf.constant([1]), "d": tf.constant(["a string key"])}, None)
