"""te.TPUEmbeddingV2 (SparseCore): training against the numpy reference with SparseCore's optimizer settings,
lookups against TensorFlow's serving class, the capacity limits and id dropping (expected values derived by hand
from SparseCore's host algorithm), the stats helper, and the constructor's errors."""

from __future__ import annotations

import numpy as np
import numpy_reference as ref
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import _tf_compat

emb_api = tf.tpu.experimental.embedding
SC_CONFIG = emb_api.SparseCoreEmbeddingConfig(max_ids_per_chip_per_sample=64)
RTOL, ATOL = 2e-5, 2e-6  # float32 engine against the float64 reference, as in test_tpu_embedding.py


def _optimizers():
    return {
        "sgd": lambda: emb_api.SGD(0.1, clipvalue=0.05, clip_weight_max=0.01),
        "adagrad": lambda: emb_api.Adagrad(0.2, initial_accumulator_value=0.3, clipvalue=(-0.02, 0.02)),
        "adagrad_momentum": lambda: emb_api.AdagradMomentum(0.1, momentum=0.4, beta2=0.9, epsilon=1e-3),
        "adam": lambda: emb_api.Adam(0.05, lazy_adam=False, clip_weight_min=-0.01),
        "ftrl": lambda: emb_api.FTRL(0.1, l1_regularization_strength=0.01, beta=0.1),
    }


def _config(optimizer_name, combiner):
    make = _optimizers()[optimizer_name]
    video = emb_api.TableConfig(24, 4, name="video", optimizer=make(), combiner=combiner)
    user = emb_api.TableConfig(12, 4, name="user", optimizer=make(), combiner=combiner)
    return {
        "watched": emb_api.FeatureConfig(table=video, output_shape=[8]),
        "liked": emb_api.FeatureConfig(table=video, output_shape=[2, 4]),
        "user": emb_api.FeatureConfig(table=user, output_shape=[8]),
    }


def _rows(rng, vocab, batch, max_len=4):
    return [list(rng.integers(0, vocab, size=int(rng.integers(0, max_len + 1)))) for _ in range(batch)]


def _as_input(rows, kind, weights=None):
    lengths = [len(r) for r in rows]
    ragged = tf.RaggedTensor.from_row_lengths(
        tf.constant([i for r in rows for i in r], tf.int64, [sum(lengths)]), lengths
    )
    w = (
        None
        if weights is None
        else ragged.with_values(tf.constant([x for r in weights for x in r], tf.float32, [sum(lengths)]))
    )
    if kind == "sparse":
        return ragged.to_sparse(), None if w is None else w.to_sparse()
    return ragged, w


def _sc_spec(optimizer):
    """The reference's settings for SparseCore's update: no clipping at all, lazy Adam (see the class docs)."""
    spec = ref.spec_from_optimizer(optimizer)
    spec.pop("gradient_clip", None)
    spec.pop("weight_clip", None)
    if spec["name"] == "adam":
        spec["use_non_lazy_adam"] = False
    return spec


@pytest.mark.parametrize("optimizer_name", sorted(_optimizers()))
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("kind", ["ragged", "sparse"])
def test_training_matches_numpy_reference(optimizer_name, combiner, kind):
    fc = _config(optimizer_name, combiner)
    emb = te.TPUEmbeddingV2(fc, sparse_core_embedding_config=SC_CONFIG)
    emb.build()
    rng = np.random.default_rng(11)
    tables = {name: emb.variables[name]["parameters"].numpy() for name in ("video", "user")}
    slots = {
        name: [emb.variables[name][s].numpy() for s in ref.SLOTS[_sc_spec(fc["user"].table.optimizer)["name"]]]
        for name in ("video", "user")
    }
    for step in range(2):
        # Each step is checked from the engine's state before it, so float32 drift does not compound.
        slot_names = ref.SLOTS[_sc_spec(fc["user"].table.optimizer)["name"]]
        tables = {name: emb.variables[name]["parameters"].numpy() for name in ("video", "user")}
        slots = {name: [emb.variables[name][s].numpy() for s in slot_names] for name in ("video", "user")}
        rows = {"watched": _rows(rng, 24, 8), "liked": _rows(rng, 24, 8), "user": _rows(rng, 12, 8)}
        weights = {k: [list(rng.uniform(0.5, 2.0, size=len(r))) for r in v] for k, v in rows.items()}
        features, wts = {}, {}
        for k in rows:
            features[k], wts[k] = _as_input(rows[k], kind, weights[k])
        with tf.GradientTape() as tape:
            acts, batch = emb(features, wts)
            tape.watch(acts)
            loss = sum(tf.reduce_sum(a * a * (i + 1)) for i, a in enumerate(tf.nest.flatten(acts)))
        grads = tape.gradient(loss, acts)
        # Forward against the reference (before the update).
        for key, table in (("watched", "video"), ("liked", "video"), ("user", "user")):
            entries, _ = ref.entries_from_rows(rows[key], weights[key])
            want = ref.forward(tables[table], entries, (8,), combiner)
            np.testing.assert_allclose(tf.reshape(acts[key], [8, 4]).numpy(), want, rtol=RTOL, atol=ATOL)
        emb.apply_gradients(grads, batch)
        for table, keys in (("video", ("watched", "liked")), ("user", ("user",))):
            features_ref = []
            for key in keys:
                entries, _ = ref.entries_from_rows(rows[key], weights[key])
                features_ref.append((entries, combiner, tf.reshape(grads[key], [8, 4]).numpy()))
            row_grads = ref.row_gradients(features_ref, tables[table].shape[0])
            spec = _sc_spec(fc["user"].table.optimizer)
            lr = fc["user"].table.optimizer.learning_rate
            tables[table], slots[table] = ref.apply_step(spec, lr, tables[table], slots[table], row_grads)
            np.testing.assert_allclose(
                emb.variables[table]["parameters"].numpy(), tables[table], rtol=RTOL, atol=ATOL, err_msg=f"step {step}"
            )


def test_in_tf_function_and_dense_input_with_weights_match_eager():
    """TensorFlow's SparseCore enqueue takes dense ids with dense weights; tf.function gives the eager result."""

    def make():
        table = emb_api.TableConfig(
            16,
            4,
            name="t",
            optimizer=emb_api.Adagrad(0.1),
            combiner="mean",
            initializer=tf.constant_initializer(np.arange(64).reshape(16, 4) / 64.0),
        )
        return {"f": emb_api.FeatureConfig(table=table, output_shape=[8])}

    ids = tf.constant([1, 2, 3, 4, 5, 6, 7, 15], tf.int64)
    weights = tf.constant([0.5] * 8)
    eager = te.TPUEmbeddingV2(make(), sparse_core_embedding_config=SC_CONFIG)
    traced = te.TPUEmbeddingV2(make(), sparse_core_embedding_config=SC_CONFIG)

    def step(emb):
        with tf.GradientTape() as tape:
            acts, batch = emb({"f": ids}, {"f": weights})
            tape.watch(acts)
            loss = tf.reduce_sum(acts["f"] ** 2)
        emb.apply_gradients(tape.gradient(loss, acts), batch)
        return acts["f"]

    a = step(eager)
    b = tf.function(lambda: step(traced))()
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    # mean of one id with weight 0.5 is the row itself.
    np.testing.assert_allclose(a.numpy(), np.arange(64).reshape(16, 4)[ids.numpy()] / 64.0, rtol=1e-6)
    np.testing.assert_array_equal(
        eager.variables["t"]["parameters"].numpy(), traced.variables["t"]["parameters"].numpy()
    )


def test_lookup_matches_tensorflow_serving_class():
    def fc():
        video = emb_api.TableConfig(24, 4, name="video", combiner="sqrtn")
        return {
            "watched": emb_api.FeatureConfig(table=video, output_shape=[8]),
            "liked": emb_api.FeatureConfig(table=video, output_shape=[8]),
        }

    ours = te.TPUEmbeddingV2(fc(), emb_api.SGD(0.1), sparse_core_embedding_config=SC_CONFIG)
    theirs = emb_api.TPUEmbeddingForServing(fc(), emb_api.SGD(0.1))
    ours.build()
    theirs.build()
    value = np.random.default_rng(2).normal(size=(24, 4)).astype(np.float32)
    ours.variables["video"]["parameters"].assign(value)
    theirs.variables["video"]["parameters"].assign(value)
    rng = np.random.default_rng(5)
    features = {k: tf.ragged.constant(_rows(rng, 24, 8, 6), dtype=tf.int64) for k in ("watched", "liked")}
    got, _ = ours(features)
    want = theirs(features)
    for k in features:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-6, atol=1e-6)


def _one_table(combiner="sum", **config):
    table = emb_api.TableConfig(
        64,
        2,
        name="t",
        optimizer=emb_api.SGD(1.0),
        combiner=combiner,
        initializer=tf.constant_initializer(np.arange(128).reshape(64, 2)),
    )
    fc = {"f": emb_api.FeatureConfig(table=table, output_shape=[8])}
    return te.TPUEmbeddingV2(fc, sparse_core_embedding_config=emb_api.SparseCoreEmbeddingConfig(**config))


def test_max_ids_per_table_is_a_capacity_limit_with_tensorflows_message():
    # One chip, 4 SparseCores: SparseCore sc sees samples 2sc, 2sc+1; id i goes to partition i % 4.
    # Samples 0, 1 hold ids 0, 4, 8 and 12 (partition 0 of SparseCore 0): 4 ids, 4 unique.
    rows = [[0, 4], [8, 12], [], [], [], [], [], []]
    emb = _one_table(max_ids_per_table={"t": 3}, max_unique_ids_per_table={"t": 8})
    emb.build()
    before = emb.variables["t"]["parameters"].numpy()
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="Sparse core 0 gets 4 ids while the max ids per sparse core is set to be 3 for table t",
    ):
        emb({"f": tf.ragged.constant(rows, dtype=tf.int64)})
    emb_u = _one_table(max_ids_per_table={"t": 8}, max_unique_ids_per_table={"t": 2})
    with pytest.raises(tf.errors.InvalidArgumentError, match="gets 4 unique ids while the max unique ids"):
        emb_u({"f": tf.ragged.constant(rows, dtype=tf.int64)})
    # Repeats of an id in one sample count once; the same id in two samples counts twice but once as unique.
    ok = _one_table(max_ids_per_table={"t": 4}, max_unique_ids_per_table={"t": 1})
    acts, _ = ok({"f": tf.ragged.constant([[4, 4, 4], [4], [4], [4], [], [], [], []], dtype=tf.int64)})
    np.testing.assert_array_equal(acts["f"].numpy()[0], 3 * np.array([8, 9]))
    np.testing.assert_array_equal(emb.variables["t"]["parameters"].numpy(), before)


def test_max_ids_per_chip_per_sample_raises_or_drops_where_sparsecore_drops():
    # Capacity 1 x 8 samples = 8 slots. SparseCore 0's partition 0 gets (s0, 0), (s0, 4), (s1, 8): 3 ids, then the
    # partition is padded to 8 slots, so every later id (partition 1's id 1, SparseCore 1's ids) is dropped.
    rows = [[0, 4, 1], [8], [5], [], [], [], [], [2]]
    features = {"f": tf.ragged.constant(rows, dtype=tf.int64)}
    strict = _one_table(combiner="mean", max_ids_per_chip_per_sample=1)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="The max_ids_per_chip is set to be 8 which is not going to fit all ids. The remaining id count is 3",
    ):
        strict(features)
    dropping = _one_table(combiner="mean", max_ids_per_chip_per_sample=1, allow_id_dropping=True)
    table = np.arange(128, dtype=np.float32).reshape(64, 2)
    acts, batch = dropping(features)
    want = np.zeros((8, 2), np.float32)
    want[0] = (table[0] + table[4]) / 3  # the mean's gains keep the dropped id's share
    want[1] = table[8]
    np.testing.assert_allclose(acts["f"].numpy(), want, rtol=1e-6)
    assert int(batch.dropped["t"]) == 3
    # The dropped ids get no update either.
    dropping.apply_gradients({"f": tf.ones([8, 2])}, batch)
    touched = dropping.variables["t"]["parameters"].numpy() != table
    assert sorted(set(np.nonzero(touched)[0])) == [0, 4, 8]


def _reference_stats(rows_by_sample, num_sc=4, samples=8):
    """One table, one chip: per (SparseCore, partition) the distinct (sample, id) pairs and distinct ids."""
    per_sc = samples // num_sc
    ids, unique = {}, {}
    for s, row in enumerate(rows_by_sample):
        for i in set(row):
            key = (s // per_sc, i % num_sc)
            ids[key] = ids.get(key, 0) + 1
            unique.setdefault(key, set()).add(i)
    return max(ids.values()), max(len(u) for u in unique.values())


def test_compute_sparse_core_stats_and_its_limits_agree():
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(0, 64, size=5)) for _ in range(8)]
    table = emb_api.TableConfig(64, 2, name="t", optimizer=emb_api.SGD(1.0))
    fc = {"f": emb_api.FeatureConfig(table=table, output_shape=[8])}
    features = {"f": tf.ragged.constant(rows, dtype=tf.int64)}
    max_ids, max_unique = te.TPUEmbeddingV2.compute_sparse_core_stats(features, fc, num_tpu_chips=1)
    assert (int(max_ids["t"]), int(max_unique["t"])) == _reference_stats(rows)
    sized = emb_api.SparseCoreEmbeddingConfig(
        max_ids_per_table={"t": int(max_ids["t"])}, max_unique_ids_per_table={"t": int(max_unique["t"])}
    )
    te.TPUEmbeddingV2(fc, sparse_core_embedding_config=sized)(features)  # fits exactly
    tight = emb_api.SparseCoreEmbeddingConfig(max_ids_per_table={"t": int(max_ids["t"]) - 1})
    with pytest.raises(tf.errors.InvalidArgumentError, match="max ids per sparse core"):
        te.TPUEmbeddingV2(fc, sparse_core_embedding_config=tight)(features)
    assert table.vocabulary_size == 64 and table.dim == 2  # the user's objects are not padded


@pytest.mark.parametrize(
    "optimizer",
    [emb_api.SGD(0.1, weight_decay_factor=0.1), emb_api.Adam(0.1, multiply_weight_decay_factor_by_learning_rate=False)],
)
def test_weight_decay_is_not_implemented_as_in_tensorflow(optimizer):
    fc = {"f": emb_api.FeatureConfig(table=emb_api.TableConfig(8, 2, name="t"), output_shape=[4])}
    with pytest.raises(
        NotImplementedError,
        match="weight_decay_factor and multiply_weight_decay_factor_by_learning_"
        "rate are not supported yet. But found in table t setting.",
    ):
        te.TPUEmbeddingV2(fc, optimizer)


@pytest.mark.parametrize(
    "table_kwargs,feature_kwargs,emb_kwargs,match",
    [
        ({"dtype": tf.int32}, {"output_shape": [4]}, {}, "float32 tables only"),
        ({}, {}, {}, "has no output_shape"),
        ({}, {"output_shape": [6]}, {}, "not divisible by the number of sparsecores per chip 4"),
        ({"optimizer": te.optimizers.Lion(0.1)}, {"output_shape": [4]}, {}, "has no SparseCore update"),
        ({}, {"output_shape": [4]}, {"num_replicas": 3}, "power of two"),
        (
            {},
            {"output_shape": [4]},
            {"sparse_core_embedding_config": emb_api.SparseCoreEmbeddingConfig(max_ids_per_table={"nope": 4})},
            "not a stacked table",
        ),
    ],
)
def test_constructor_errors(table_kwargs, feature_kwargs, emb_kwargs, match):
    if "dtype" in table_kwargs:  # TableConfig's dtype came with TensorFlow 2.20 (refused before, naming it)
        others = {k: v for k, v in table_kwargs.items() if k != "dtype"}
        table_kwargs = dict(others, **_tf_compat.table_config_dtype_kwargs(table_kwargs["dtype"]))
    table = emb_api.TableConfig(8, 2, name="t", **table_kwargs)
    fc = {"f": emb_api.FeatureConfig(table=table, **feature_kwargs)}
    with pytest.raises(ValueError, match=match):
        te.TPUEmbeddingV2(fc, emb_api.SGD(0.1), **emb_kwargs)


@pytest.mark.parametrize(
    "rows,match",
    [([[1], [2], [3]], "must have 4 rows"), ([[1], [2], [3], [8]], r"id 8 is outside table 't' \(vocabulary_size 8\)")],
)
def test_bad_batches_raise_and_change_nothing(rows, match):
    table = emb_api.TableConfig(8, 2, name="t", optimizer=emb_api.SGD(0.1))
    emb = te.TPUEmbeddingV2({"f": emb_api.FeatureConfig(table=table, output_shape=[4])})
    emb.build()
    before = emb.variables["t"]["parameters"].numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        emb({"f": tf.ragged.constant(rows, dtype=tf.int64)})
    np.testing.assert_array_equal(emb.variables["t"]["parameters"].numpy(), before)


def test_row_id_initializer_and_gradient_shape_errors():
    table = emb_api.TableConfig(8, 2, name="t", optimizer=emb_api.SGD(0.1), initializer=emb_api.RowIdInitializer(3))
    emb = te.TPUEmbeddingV2({"f": emb_api.FeatureConfig(table=table, output_shape=[4])})
    acts, batch = emb({"f": tf.constant([0, 1, 7, 7], tf.int64)})
    np.testing.assert_array_equal(acts["f"].numpy(), [[3, 3], [4, 4], [10, 10], [10, 10]])
    with pytest.raises(ValueError, match=r"Found gradient of shape \(4, 3\) at path f. Expected shape \[4, 2\]"):
        emb.apply_gradients({"f": tf.zeros([4, 3])}, batch)
    with pytest.raises(ValueError):
        emb.enqueue({"g": tf.constant([0, 1, 2, 3])})  # every feature is needed, as in TensorFlow


def test_stats_of_stacked_tables_use_tensorflows_id_to_sparsecore_mapping():
    """Two stacked tables on 2 chips x 4 SparseCores: an id's partition is the shard TensorFlow's
    `map_indices_in_shard` places its row in (the stack's rotation included), counted per table."""
    from tensorflow.python.tpu import tpu_embedding_v3_utils as tf_utils

    def fc():
        sgd = emb_api.SGD(0.1)
        video = emb_api.TableConfig(40, 4, name="video", optimizer=sgd)
        user = emb_api.TableConfig(24, 4, name="user", optimizer=sgd)
        return {
            "watched": emb_api.FeatureConfig(table=video, output_shape=[8]),
            "user": emb_api.FeatureConfig(table=user, output_shape=[8]),
        }

    rng = np.random.default_rng(4)
    rows = {
        "watched": [list(rng.integers(0, 40, size=6)) for _ in range(8)],
        "user": [list(rng.integers(0, 24, size=3)) for _ in range(8)],
    }
    features = {k: tf.ragged.constant(v, dtype=tf.int64) for k, v in rows.items()}
    layouts = te.TPUEmbeddingV2(fc(), num_replicas=2, num_sc_per_chip=4).embedding_layouts
    assert layouts["user"].stacked_table_name == layouts["video"].stacked_table_name == "user_video"
    ids, unique = {}, {}
    for key, table in (("watched", "video"), ("user", "user")):
        lay = layouts[table]
        for sample, row in enumerate(rows[key]):
            for i in set(row):
                shard, _ = tf_utils.map_indices_in_shard(
                    8, lay.sparse_core_shard_row_offset, lay.sparse_core_shard_rotation, i
                )
                cell = (sample // 2, int(shard))
                ids[cell] = ids.get(cell, 0) + 1
                unique.setdefault(cell, set()).add((table, i))
    max_ids, max_unique = te.TPUEmbeddingV2.compute_sparse_core_stats(features, fc(), num_tpu_chips=2)
    assert int(max_ids["user_video"]) == max(ids.values())
    assert int(max_unique["user_video"]) == max(len(u) for u in unique.values())


def test_dense_batch_must_hold_one_id_per_sample_or_none():
    table = emb_api.TableConfig(8, 2, name="t", optimizer=emb_api.SGD(0.1))
    emb = te.TPUEmbeddingV2({"f": emb_api.FeatureConfig(table=table, output_shape=[4])})
    with pytest.raises(ValueError, match=r"Sample count \(product of output_shape\): 4. Got 3 elements"):
        emb({"f": tf.constant([1, 2, 3], tf.int64)})
    acts, _ = emb({"f": tf.zeros([0], tf.int64)})  # an empty dense batch is valid, as in TensorFlow
    np.testing.assert_array_equal(acts["f"].numpy(), np.zeros((4, 2)))
    traced = tf.function(lambda ids: emb({"f": ids})[0]["f"], input_signature=[tf.TensorSpec([None], tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="should have values elements number the same"):
        traced(tf.constant([1, 2, 3], tf.int64))


def test_dropping_cuts_inside_a_partition_in_column_order():
    # All ten ids are on SparseCore 0 (samples 0, 1), partition 0 (multiples of 4); the 8-slot buffer keeps the
    # first eight in column order (0 ... 28) and drops 32 and 36, both of sample 1, whatever their input order.
    rows = [[16, 0, 12, 4, 8], [36, 20, 32, 24, 28], [], [], [], [], [], []]
    emb = _one_table(
        max_ids_per_chip_per_sample=1,
        allow_id_dropping=True,
        max_ids_per_table={"t": 16},
        max_unique_ids_per_table={"t": 16},
    )
    acts, batch = emb({"f": tf.ragged.constant(rows, dtype=tf.int64)})
    table = np.arange(128, dtype=np.float32).reshape(64, 2)
    np.testing.assert_array_equal(acts["f"].numpy()[0], table[[0, 4, 8, 12, 16]].sum(axis=0))
    np.testing.assert_array_equal(acts["f"].numpy()[1], table[[20, 24, 28]].sum(axis=0))
    assert int(batch.dropped["t"]) == 2
