"""te.TPUEmbeddingV2.embedding_tables: keyed by stacked table name as TensorFlow's, holding each stack's values
in the stacked (row-sharded) SparseCore layout; `table_variables` keeps the per-TableConfig variables.

The stacked layout is rebuilt here in numpy from each table's `SparseCoreTableLayout` fields (TensorFlow's
layout: row r of a table goes to SparseCore r % num_sparse_cores, at row r // num_sparse_cores of the table's
block there, after `sparse_core_shard_row_offset` rows of the stack; its columns are `[0, dim)` of the padded
width, rotated by `sparse_core_shard_rotation` shards).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te

emb_api = tf.tpu.experimental.embedding


def _emb(num_replicas=2):
    video = emb_api.TableConfig(24, 4, name="video", optimizer=emb_api.Adagrad(0.2))
    user = emb_api.TableConfig(12, 4, name="user", optimizer=emb_api.Adagrad(0.2))
    wide = emb_api.TableConfig(10, 8, name="wide", optimizer=emb_api.SGD(0.1))
    fc = {
        "watched": emb_api.FeatureConfig(table=video, output_shape=[8]),
        "user": emb_api.FeatureConfig(table=user, output_shape=[8]),
        "wide": emb_api.FeatureConfig(table=wide, output_shape=[8]),
    }
    emb = te.TPUEmbeddingV2(fc, num_replicas=num_replicas)
    emb.build()
    for i, var in enumerate(emb.table_variables.values()):
        var.assign(tf.reshape(tf.range(var.shape.num_elements(), dtype=tf.float32) + 1000 * (i + 1), var.shape))
    return emb


def _numpy_stack(emb, stack):
    """The stacked value from the layouts' fields alone."""
    layouts = [lay for lay in emb.embedding_layouts.values() if lay.stacked_table_name == stack]
    first = layouts[0]
    n_sc = first.num_sparse_cores
    rows_per_sc = first.total_rows_per_sparse_core_shard
    width = first.unsharded_padded_shape[1]
    out = np.zeros((n_sc, rows_per_sc, width), np.float32)
    per_table = {t.name: v.numpy() for t, v in emb.table_variables.items()}
    for layout in layouts:
        values = per_table[layout.table_name]
        vocab, dim = layout.unsharded_shape
        for r in range(vocab):
            sc = (r % n_sc + layout.sparse_core_shard_rotation) % n_sc
            out[sc, layout.sparse_core_shard_row_offset + r // n_sc, :dim] = values[r]
    return out.reshape(n_sc * rows_per_sc, width)


def test_embedding_tables_are_keyed_by_stacked_table_name_and_hold_the_stacked_values():
    emb = _emb()
    stacks = {lay.stacked_table_name for lay in emb.embedding_layouts.values()}
    assert set(emb.embedding_tables) == stacks
    assert len(stacks) < len(emb.table_variables)  # video and user share a stack
    for name, var in emb.embedding_tables.items():
        expected = _numpy_stack(emb, name)
        assert tuple(var.shape) == expected.shape and var.dtype == tf.float32
        np.testing.assert_array_equal(var.numpy(), expected, err_msg=name)
        np.testing.assert_array_equal(tf.convert_to_tensor(var).numpy(), expected)
        np.testing.assert_array_equal(tf.function(var.read_value)().numpy(), expected)
        np.testing.assert_array_equal(np.concatenate([s.numpy() for s in var.shards]), expected)
        assert len(var.shards) == 2


def test_table_variables_are_the_per_table_config_view():
    emb = _emb()
    assert [t.name for t in emb.table_variables] == [t.name for t in emb._table_config]
    for table, var in emb.table_variables.items():
        assert isinstance(table, emb_api.TableConfig) and tuple(var.shape) == (table.vocabulary_size, table.dim)
        assert var is emb.variables[table.name]["parameters"]


def test_assigning_a_stacked_variable_writes_its_tables_and_a_bad_shape_changes_nothing():
    emb = _emb()
    name = next(n for n in emb.embedding_tables if len(_tables_of(emb, n)) == 2)
    var = emb.embedding_tables[name]
    rng = np.random.default_rng(0)
    new = rng.normal(size=var.shape).astype(np.float32)
    var.assign(new)
    # Each table holds its rows of `new` (the padding rows of the stack are not stored).
    for layout in _tables_of(emb, name):
        n_sc, rows_per_sc = layout.num_sparse_cores, layout.total_rows_per_sparse_core_shard
        vocab, dim = layout.unsharded_shape
        table = emb.variables[layout.table_name]["parameters"].numpy()
        for r in range(vocab):
            sc = (r % n_sc + layout.sparse_core_shard_rotation) % n_sc
            np.testing.assert_array_equal(
                table[r], new[sc * rows_per_sc + layout.sparse_core_shard_row_offset + r // n_sc, :dim]
            )
    before = {t.name: v.numpy() for t, v in emb.table_variables.items()}
    with pytest.raises(ValueError, match=rf"Stacked table {name!r}: cannot assign a value of shape"):
        var.assign(np.zeros((3, 3), np.float32))
    for t, v in emb.table_variables.items():
        np.testing.assert_array_equal(v.numpy(), before[t.name])


def _tables_of(emb, stack):
    return [lay for lay in emb.embedding_layouts.values() if lay.stacked_table_name == stack]


def _tf_sharded_like(var):
    """TensorFlow's own sharded variable over the same row blocks: the reference for the members both have."""
    blocks = np.split(var.numpy(), len(var.values))
    return tf.__internal__.distribute.ShardedVariable([tf.Variable(b) for b in blocks], name="reference")


def test_stacked_variable_has_tensorflows_sharded_variable_surface():
    """`values` (TensorFlow's name for the per-chip shards; `shards` stays), `variables`, iteration, slicing, the
    tensor operators, `numpy`, and `assign`/`assign_add`/`assign_sub` returning the variable: each against
    `tf.__internal__.distribute.ShardedVariable` holding the same blocks."""
    emb = _emb()
    var = emb.embedding_tables[next(iter(emb.embedding_tables))]
    reference = _tf_sharded_like(var)
    assert isinstance(var.values, tuple) and len(var.values) == 2
    for ours, theirs in zip(var.values, reference.variables, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    for ours, theirs in zip(var.shards, var.values, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert [v.shape for v in var.variables] == [v.shape for v in reference.variables]
    assert [b.numpy().tolist() for b in var] == [v.numpy().tolist() for v in reference]
    assert var.shape == reference.shape and var.dtype == reference.dtype
    np.testing.assert_array_equal(var.numpy(), reference.numpy())
    rows = var.shape[0]
    for spec in (3, -1, rows - 1, slice(None), slice(1, rows - 2), slice(None, None, 3), slice(rows - 1, 0, -2),
                 (slice(2, 9), 1), (Ellipsis, 0), np.arange(rows) % 3 == 0):  # fmt: skip
        np.testing.assert_array_equal(var[spec].numpy(), reference[spec].numpy(), err_msg=str(spec))
    with pytest.raises((IndexError, tf.errors.InvalidArgumentError)):
        var[rows]
    with pytest.raises(IndexError):
        reference[rows]
    ones = tf.ones([var.shape[1], 1])
    for op in (lambda v: v + 1.0, lambda v: 2.0 * v, lambda v: -v, lambda v: v - v, lambda v: v / 4.0,
               lambda v: v**2, lambda v: abs(v), lambda v: v > 1000.0, lambda v: v @ ones):  # fmt: skip
        np.testing.assert_array_equal(op(var).numpy(), op(reference).numpy())
    # The stack's padding (rows and columns past each table's) is not stored: it reads 0 after any write.
    stored = _stored_mask(var.name)
    delta = np.full(var.shape, 0.5, np.float32)
    assert var.assign_add(delta) is var and reference.assign_add(delta) is reference
    assert var.assign_sub(2 * delta) is var and reference.assign_sub(2 * delta) is reference
    np.testing.assert_array_equal(var.numpy()[stored], reference.numpy()[stored])
    assert not var.numpy()[~stored].any()
    new = np.arange(np.prod(var.shape), dtype=np.float32).reshape(var.shape)
    assert var.assign(new, read_value=False) is var
    reference.assign(new)
    np.testing.assert_array_equal(var.numpy()[stored], reference.numpy()[stored])


def _stored_mask(stack):
    """Where the stacked value holds a table's row (not padding): the stack of tables that are all ones."""
    emb = _emb()
    for v in emb.table_variables.values():
        v.assign(tf.ones_like(v))
    return emb.embedding_tables[stack].numpy() != 0


def test_stacked_variable_assign_add_of_a_bad_shape_changes_nothing():
    emb = _emb()
    name = next(iter(emb.embedding_tables))
    var = emb.embedding_tables[name]
    before = {t.name: v.numpy() for t, v in emb.table_variables.items()}
    for method in ("assign_add", "assign_sub"):
        with pytest.raises(ValueError, match=rf"Stacked table {name!r}: cannot {method} a value of shape"):
            getattr(var, method)(np.zeros((3, 3), np.float32))
    for t, v in emb.table_variables.items():
        np.testing.assert_array_equal(v.numpy(), before[t.name])


# ---------------------------------------------------------------- TensorFlow's backward tests, through `values`
# tensorflow/python/tpu/tpu_embedding_v3_test.py's three backward-pass tests read the trained stacked table through
# `embedding_tables[...].values` and recover each table with `_recover_same_sized_tables` (below as written there,
# for one chip: `strategy.num_replicas_in_sync` = 1); their goldens are compared as TensorFlow compares them
# (`assertAllClose`: rtol = atol = 1e-6).
_VOCAB, _DIM = 16384, 127


def _recover_same_sized_tables(table, num_replicas=1, num_tables=1):
    def unshuffle_from_sc_to_cpu(num_sc_devices, t):
        old_shape = t.shape
        assert t.shape[0] % num_sc_devices == 0
        t = np.reshape(t, (num_sc_devices, t.shape[0] // num_sc_devices, t.shape[1]))
        return np.reshape(np.transpose(t, (1, 0, 2)), old_shape)

    table_partitions = [shard.numpy()[:, :_DIM] for shard in table.values]
    full_table = unshuffle_from_sc_to_cpu(num_replicas * 4, np.concatenate(table_partitions, axis=0))
    slice_size = full_table.shape[0] // num_tables
    tables = []
    for i in range(num_tables):
        t = full_table[i * slice_size : i * slice_size + _VOCAB, :]
        t = np.reshape(t, (4 * num_replicas, -1, t.shape[-1]))
        t = np.roll(t, -4 * i, axis=0)
        tables.append(np.reshape(t, (-1, t.shape[-1])))
    return tables[0] if num_tables == 1 else tables


def _v3_tables():
    video = emb_api.TableConfig(_VOCAB, _DIM, initializer=tf.constant_initializer(1.0), combiner="sum", name="video")
    user = emb_api.TableConfig(_VOCAB, _DIM, initializer=tf.constant_initializer(2.0), combiner="sum", name="user")
    return video, user


def _csr(n):
    return tf.sparse.reorder(tf.SparseTensor([[i % 16, i] for i in range(n)], np.arange(n), [16, n]))


def _train_once(feature_config, data, grads, **kwargs):
    emb = te.TPUEmbeddingV2(feature_config, emb_api.SGD(learning_rate=1.0), num_replicas=1, **kwargs)
    emb.build()
    _, preserved = emb(data)
    emb.apply_gradients(tf.nest.map_structure(tf.constant, grads), preserved)
    return emb


def test_tensorflow_single_feature_single_table_backwards_pass():
    video, _ = _v3_tables()
    random = np.random.default_rng(1).uniform(size=(16, _DIM)).astype(np.float32)
    emb = _train_once(emb_api.FeatureConfig(table=video, name="watched", output_shape=[16]), _csr(1024), random)
    golden = np.ones([_VOCAB, _DIM], np.float32)
    for i in range(1024):
        golden[i, :] -= random[i % 16]
    np.testing.assert_allclose(_recover_same_sized_tables(emb.embedding_tables["video"]), golden, 1e-6, 1e-6)


def _two_features(first, second, seed, **kwargs):
    """TensorFlow's two-feature tests: `watched` on `first`, `watched2` on `second`, each over the 512 ids,
    trained once with a random gradient per feature; returns (embedding, random1, random2)."""
    rng = np.random.default_rng(seed)
    random1, random2 = (rng.uniform(size=(16, _DIM)).astype(np.float32) for _ in range(2))
    fc = [
        emb_api.FeatureConfig(table=first, name="watched", output_shape=[16]),
        emb_api.FeatureConfig(table=second, name="watched2", output_shape=[16]),
    ]
    data = _csr(512)
    return _train_once(fc, [data, data], [random1, random2], **kwargs), random1, random2


def test_tensorflow_two_feature_single_table_backwards_pass():
    video, _ = _v3_tables()
    emb, random1, random2 = _two_features(video, video, seed=2)
    golden = np.ones([_VOCAB, _DIM], np.float32)
    for i in range(512):
        golden[i, :] = golden[i, :] - random1[i % 16] - random2[i % 16]
    np.testing.assert_allclose(_recover_same_sized_tables(emb.embedding_tables["video"]), golden, 1e-6, 1e-6)


def test_tensorflow_two_feature_two_tables_stacked_backwards_pass():
    video, user = _v3_tables()
    sc = emb_api.SparseCoreEmbeddingConfig(
        disable_table_stacking=False, max_ids_per_chip_per_sample=64, allow_id_dropping=False
    )
    emb, random1, random2 = _two_features(video, user, seed=3, sparse_core_embedding_config=sc)
    goldens = [np.full([_VOCAB, _DIM], 2, np.float32), np.ones([_VOCAB, _DIM], np.float32)]
    for i in range(512):
        goldens[0][i, :] = goldens[0][i, :] - random2[i % 16]
        goldens[1][i, :] = goldens[1][i, :] - random1[i % 16]
    got = _recover_same_sized_tables(emb.embedding_tables["user_video"], num_tables=2)
    np.testing.assert_allclose(got, goldens, 1e-6, 1e-6)
