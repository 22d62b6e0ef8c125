"""Checkpoints in TPUEmbeddingV2's SparseCore layout, checked against TensorFlow's own layout code (its stacker,
its CPU-to-SparseCore resharding and its SparseCore-to-CPU unsharding) and TensorFlow's serving class, bit for
bit."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
from tensorflow.python.tpu import tpu_embedding_v3_checkpoint_adapter as tf_adapter
from tensorflow.python.tpu import tpu_embedding_v3_utils as tf_utils

import tf_embed_ops as te
from tf_embed_ops import _tf_compat
from tf_embed_ops.sparse_core import layout as layout_lib

# TensorFlow's resharding functions this file compares with came with a later minor than the module (_tf_compat).
TF_RESHARDING = "TensorFlow's SparseCore checkpoint resharding"

emb_api = tf.tpu.experimental.embedding


def _feature_config(optimizer=True):
    """Two tables that stack (same width and optimizer, one with a rotation) and one on its own."""
    adagrad = emb_api.Adagrad(0.1) if optimizer else None
    video = emb_api.TableConfig(37, 6, name="video", optimizer=adagrad)
    user = emb_api.TableConfig(21, 6, name="user", optimizer=adagrad)
    item = emb_api.TableConfig(50, 3, name="item", optimizer=emb_api.Adam(0.1) if optimizer else None)
    return {
        "watched": emb_api.FeatureConfig(table=video, output_shape=[8]),
        "user": emb_api.FeatureConfig(table=user, output_shape=[8]),
        "item": emb_api.FeatureConfig(table=item, output_shape=[16]),
    }


TOPOLOGIES = [(1, 4), (2, 4), (4, 2)]  # (num_replicas, num_sc_per_chip)


def _random_fill(emb, seed=3):
    rng = np.random.default_rng(seed)
    values = {}
    for name, slots in emb.variables.items():
        for slot, var in slots.items():
            values[(name, slot)] = rng.normal(size=var.shape).astype(np.float32)
            var.assign(values[(name, slot)])
    return values


@pytest.mark.parametrize("num_replicas,num_sc_per_chip", TOPOLOGIES)
def test_stacking_matches_tensorflows_resharding_both_ways(num_replicas, num_sc_per_chip):
    _tf_compat.require_reference(TF_RESHARDING)
    emb = te.TPUEmbeddingV2(_feature_config(), num_replicas=num_replicas, num_sc_per_chip=num_sc_per_chip)
    emb.build()
    values = _random_fill(emb)
    layouts = emb.embedding_layouts
    # The stacker rotates a stacked table's shards by its SparseCores per chip: visible with several chips.
    assert any(layouts[n].sparse_core_shard_rotation for n in layouts) == (num_replicas > 1)
    for stack, names in emb._stacking.stacked_table_to_tables.items():
        ours = emb.stacked_tables()[stack].numpy()
        # TensorFlow's CPU -> SparseCore resharding of the whole stacked variable.
        ordered = sorted(names, key=lambda n: layouts[n].sparse_core_shard_row_offset)
        full = [ours.shape[0], ours.shape[1]]
        slice_spec = f"{full[0]} {full[1]} 0,{full[0]}:0,{full[1]}"
        theirs = tf_adapter._shard_from_cpu_to_sc(
            [tf.constant(values[(n, "parameters")]) for n in ordered], slice_spec, [layouts[n] for n in ordered]
        ).numpy()
        np.testing.assert_array_equal(ours, theirs)
        # And back with TensorFlow's unsharding.
        for name in names:
            lay = layouts[name]
            back = tf_utils.remove_padding_from_sc(
                tf_utils.unshuffle_from_sc_to_cpu(
                    tf.constant(ours),
                    lay.num_sparse_cores,
                    lay.sparse_core_shard_row_offset,
                    lay.unsharded_padded_shape[0] // lay.num_sparse_cores,
                    lay.sparse_core_shard_rotation,
                ),
                tuple(lay.unsharded_shape),
            ).numpy()
            np.testing.assert_array_equal(back, values[(name, "parameters")])
            np.testing.assert_array_equal(layout_lib.unstack_value(ours, lay).numpy(), values[(name, "parameters")])


def _tensorflow_written_checkpoint(path, num_replicas, num_sc_per_chip, seed=9):
    _tf_compat.require_reference(TF_RESHARDING)
    """A checkpoint as TPUEmbeddingV2 writes it, built with TensorFlow's stacker and resharding code only:
    `embedding/<stack>`, `embedding/<stack>/<slot>` and `embedding/_sparse_core_table_layouts`."""
    probe = te.TPUEmbeddingV2(_feature_config(), num_replicas=num_replicas, num_sc_per_chip=num_sc_per_chip)
    layouts = probe.embedding_layouts  # computed by TensorFlow's own stacker
    by_stack = {}
    for lay in layouts.values():
        by_stack.setdefault(lay.stacked_table_name, []).append(lay)
    slots = {"video": ["accumulators"], "user": ["accumulators"], "item": ["momenta", "velocities"]}
    shapes = {"video": (37, 6), "user": (21, 6), "item": (50, 3)}
    rng = np.random.default_rng(seed)
    values = {(n, s): rng.normal(size=shapes[n]).astype(np.float32) for n in shapes for s in ["parameters", *slots[n]]}
    root = tf.Module()
    for stack, lays in by_stack.items():
        lays = sorted(lays, key=lambda lay: lay.sparse_core_shard_row_offset)
        for slot in ["parameters", *slots[lays[0].table_name]]:
            rows = lays[0].total_rows_per_sparse_core_shard * lays[0].num_sparse_cores
            spec = f"{rows} {lays[0].unsharded_padded_shape[1]} 0,{rows}:0,{lays[0].unsharded_padded_shape[1]}"
            stacked = tf_adapter._shard_from_cpu_to_sc(
                [tf.constant(values[(lay.table_name, slot)]) for lay in lays], spec, lays
            )
            root._track_trackable(tf.Variable(stacked), stack if slot == "parameters" else f"{stack}/{slot}")
    proto = sparse_core_layout_pb2.SparseCoreTableLayouts()
    proto.tables.extend(layouts[n] for n in sorted(layouts))
    root._track_trackable(
        tf_utils.SparseCoreLayoutsTrackable(tf.constant(proto.SerializeToString())),
        tf_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY,
    )
    return tf.train.Checkpoint(embedding=root).write(path), values


@pytest.mark.parametrize("num_replicas,num_sc_per_chip", TOPOLOGIES)
@pytest.mark.parametrize("restore_before_build", [True, False])
def test_restores_a_tensorflow_sparsecore_checkpoint_bit_for_bit(
    tmp_path, num_replicas, num_sc_per_chip, restore_before_build
):
    path, values = _tensorflow_written_checkpoint(str(tmp_path / "ck"), num_replicas, num_sc_per_chip)
    emb = te.TPUEmbeddingV2(_feature_config(), num_replicas=num_replicas, num_sc_per_chip=num_sc_per_chip)
    if not restore_before_build:
        emb.build()
    tf.train.Checkpoint(embedding=emb).read(path).assert_consumed()
    for (name, slot), value in values.items():
        np.testing.assert_array_equal(emb.variables[name][slot].numpy(), value, err_msg=f"{name}/{slot}")


def _tensorflow_unshard(stacked, layout):
    """TensorFlow's SparseCore -> CPU conversion of one stacked value. Before TensorFlow 2.21 it takes the checkpoint's
    values as a list (its reshard callback's argument), from 2.21 on the tensor."""
    value = tf.constant(stacked)
    return tf_adapter._unshard_from_sc_to_cpu(value if _tf_compat.TENSORFLOW_MINOR >= (2, 21) else [value], [layout])


@pytest.mark.parametrize("num_replicas,num_sc_per_chip", TOPOLOGIES)
def test_written_checkpoint_is_tensorflows_layout_and_serving_restores_it(tmp_path, num_replicas, num_sc_per_chip):
    _tf_compat.require_reference(TF_RESHARDING)
    emb = te.TPUEmbeddingV2(_feature_config(), num_replicas=num_replicas, num_sc_per_chip=num_sc_per_chip)
    emb.build()
    values = _random_fill(emb, seed=4)
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ck"))
    reader = tf.train.load_checkpoint(path)
    layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
    layouts.ParseFromString(reader.get_tensor("embedding/_sparse_core_table_layouts/.ATTRIBUTES/VARIABLE_VALUE"))
    assert {lay.table_name: lay for lay in layouts.tables} == emb.embedding_layouts
    for lay in layouts.tables:
        for slot in ["parameters"] + (["accumulators"] if lay.table_name != "item" else ["momenta", "velocities"]):
            key = lay.stacked_table_name + ("" if slot == "parameters" else f".S{slot}")
            stacked = reader.get_tensor(f"embedding/{key}/.ATTRIBUTES/VARIABLE_VALUE")
            # TensorFlow's own SparseCore -> CPU conversion of what we wrote.
            (table,) = _tensorflow_unshard(stacked, lay)
            np.testing.assert_array_equal(table.numpy(), values[(lay.table_name, slot)])
    # TensorFlow's serving class restores the tables from the stacked entries (it reads the layouts first).
    serving = emb_api.TPUEmbeddingForServing(_feature_config(optimizer=False), None)
    tf.train.Checkpoint(embedding=serving).read(path).expect_partial()
    serving.build()
    for name in ("video", "user", "item"):
        np.testing.assert_array_equal(serving.variables[name]["parameters"].numpy(), values[(name, "parameters")])


def test_round_trip_after_training_is_bit_exact(tmp_path):
    emb = te.TPUEmbeddingV2(_feature_config())
    features = {
        "watched": tf.ragged.constant([[1, 2], [36], [], [0, 0], [5], [6], [7], [8]], dtype=tf.int64),
        "user": tf.constant([0, 1, 2, 3, 4, 5, 6, 20], tf.int64),
        "item": tf.ragged.constant([[i % 50, (7 * i) % 50] for i in range(16)], dtype=tf.int64),
    }
    with tf.GradientTape() as tape:
        acts, batch = emb(features)
        tape.watch(acts)
        loss = sum(tf.reduce_sum(a**2) for a in tf.nest.flatten(acts))
    emb.apply_gradients(tape.gradient(loss, acts), batch)
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ck"))
    other = te.TPUEmbeddingV2(_feature_config())
    tf.train.Checkpoint(embedding=other).read(path).assert_consumed()
    for name, slots in emb.variables.items():
        for slot, var in slots.items():
            np.testing.assert_array_equal(other.variables[name][slot].numpy(), var.numpy(), err_msg=f"{name}/{slot}")
    np.testing.assert_array_equal(other(features)[0]["watched"].numpy(), emb(features)[0]["watched"].numpy())


def test_unstack_rejects_a_value_that_does_not_fit_the_layout():
    emb = te.TPUEmbeddingV2(_feature_config())
    lay = emb.embedding_layouts["video"]
    with pytest.raises(ValueError, match="not a multiple of the"):
        layout_lib.unstack_value(tf.zeros([lay.num_sparse_cores * 3 + 1, 8]), lay)
    with pytest.raises(ValueError, match="does not fit its layout"):
        layout_lib.unstack_value(tf.zeros([lay.num_sparse_cores, 8]), lay)


@pytest.mark.parametrize("written,read", [((2, 4), (4, 2)), ((2, 4), (1, 4)), ((1, 4), (4, 2))])
def test_checkpoint_of_another_topology_restores_with_its_own_layouts(tmp_path, written, read):
    path, values = _tensorflow_written_checkpoint(str(tmp_path / "ck"), *written)
    emb = te.TPUEmbeddingV2(_feature_config(), num_replicas=read[0], num_sc_per_chip=read[1])
    assert (
        emb.embedding_layouts
        != te.TPUEmbeddingV2(_feature_config(), num_replicas=written[0], num_sc_per_chip=written[1]).embedding_layouts
    )
    tf.train.Checkpoint(embedding=emb).read(path).assert_consumed()
    for (name, slot), value in values.items():
        np.testing.assert_array_equal(emb.variables[name][slot].numpy(), value, err_msg=f"{name}/{slot}")
    # Written back in this object's own layouts.
    again = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "again"))
    other = te.TPUEmbeddingV2(_feature_config(), num_replicas=read[0], num_sc_per_chip=read[1])
    tf.train.Checkpoint(embedding=other).read(again).assert_consumed()
    for (name, slot), value in values.items():
        np.testing.assert_array_equal(other.variables[name][slot].numpy(), value)


def test_checkpoint_of_another_stacking_is_refused_before_anything_changes(tmp_path):
    path, _ = _tensorflow_written_checkpoint(str(tmp_path / "ck"), num_replicas=2, num_sc_per_chip=4)
    config = emb_api.SparseCoreEmbeddingConfig(disable_table_stacking=True)
    emb = te.TPUEmbeddingV2(_feature_config(), sparse_core_embedding_config=config, num_replicas=2)
    emb.build()
    before = {(n, s): v.numpy() for n, slots in emb.variables.items() for s, v in slots.items()}
    with pytest.raises(ValueError, match="stacks its tables differently"):
        tf.train.Checkpoint(embedding=emb).read(path)
    for (name, slot), value in before.items():
        np.testing.assert_array_equal(emb.variables[name][slot].numpy(), value)


def test_disable_table_stacking_gives_one_stack_per_table_and_still_restores_in_serving(tmp_path):
    config = emb_api.SparseCoreEmbeddingConfig(disable_table_stacking=True)
    emb = te.TPUEmbeddingV2(_feature_config(), sparse_core_embedding_config=config)
    emb.build()
    assert {lay.stacked_table_name for lay in emb.embedding_layouts.values()} == {"video", "user", "item"}
    values = _random_fill(emb, seed=8)
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ck"))
    serving = emb_api.TPUEmbeddingForServing(_feature_config(optimizer=False), None)
    tf.train.Checkpoint(embedding=serving).read(path).expect_partial()
    serving.build()
    for name in ("video", "user", "item"):
        np.testing.assert_array_equal(serving.variables[name]["parameters"].numpy(), values[(name, "parameters")])


@pytest.mark.parametrize("writer", ["te.TPUEmbedding", "TPUEmbeddingForServing"])
def test_restores_a_per_table_checkpoint(tmp_path, writer):
    """A CPU-trained (per-table) checkpoint comes to the SparseCore class table by table, slots included; even a
    single-table stack whose name is the table's (`item`) is read as the per-table value it is."""
    if writer == "te.TPUEmbedding":
        source = te.TPUEmbedding(_feature_config())
    else:
        source = emb_api.TPUEmbeddingForServing(_feature_config(), None)
    source.build()
    values = _random_fill(source, seed=12)
    path = tf.train.Checkpoint(embedding=source).write(str(tmp_path / "ck"))
    emb = te.TPUEmbeddingV2(_feature_config(), num_replicas=2)
    emb.build()
    status = tf.train.Checkpoint(embedding=emb).read(path)
    for (name, slot), value in values.items():
        np.testing.assert_array_equal(emb.variables[name][slot].numpy(), value, err_msg=f"{name}/{slot}")
    status.expect_partial()  # the stacked entries of this object have no counterpart in a per-table checkpoint
    # Written back, it is a SparseCore checkpoint.
    again = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "again"))
    assert "embedding/_sparse_core_table_layouts/.ATTRIBUTES/VARIABLE_VALUE" in dict(tf.train.list_variables(again))


def test_embedding_table_shards_are_even_row_blocks_per_chip_of_the_stacked_value():
    emb = te.TPUEmbeddingV2(_feature_config(), num_replicas=2)
    emb.build()
    _random_fill(emb, seed=2)
    for name, shards in emb.embedding_table_shards.items():
        stacked = emb.stacked_tables()[name].numpy()
        assert [device for device, _ in shards] == ["TPU:0", "TPU:1"]
        np.testing.assert_array_equal(np.concatenate([s.numpy() for _, s in shards]), stacked)
        # Chip c holds SparseCores [c * 4, c * 4 + 4): its rows are those the layouts put on them.
        lay = next(v for v in emb.embedding_layouts.values() if v.stacked_table_name == name)
        assert shards[0][1].shape[0] == 4 * lay.total_rows_per_sparse_core_shard
