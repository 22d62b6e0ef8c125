"""A dynamic table's restore checks its lifecycle policies' checkpoint state before it writes the first row: a
checkpoint of another Bloom filter size, of corrupted DecayedLFU counts, or of another admission or eviction
policy (a Bloom table's checkpoint into a `FrequencyAdmission` table, or the reverse) is refused naming the table
and both policies, and every key, row, slot, count, the filter and the step stay as they were."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.dynamic.state_util import DynamicTable, ShardedDynamicTable, config, content, train_lookup


def _table(shards, **kwargs):
    cfg = config(name="users", **kwargs)
    return DynamicTable(cfg) if shards == 1 else ShardedDynamicTable(cfg, shards)


def _parts(table):
    return list(getattr(table, "shards", None) or [table])


def _everything(table):
    out = []
    for part in _parts(table):
        state = {**content(part), "step": part.step.numpy()}
        state.update({f"policy/{k}": v.numpy() for k, v in part.export_policy_state().items()})
        out.append(state)
    return out


def _assert_unchanged(table, before):
    after = _everything(table)
    assert len(after) == len(before)
    for got, want in zip(after, before, strict=True):
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _trained(shards, **kwargs):
    table = _table(shards, **kwargs)
    for part in _parts(table):
        train_lookup(part, [1, 1, 2, 3, 3, 3, 40, 41], 0)
        train_lookup(part, [1, 2, 3, 50], 1)
        part.step.assign(7)
    return table


def _saved_tensors(path):
    """The tensors the table `t` wrote into the checkpoint at `path`, by name."""
    reader = tf.train.load_checkpoint(path)
    prefix = "t/.ATTRIBUTES/"
    return {k[len(prefix) :]: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith(prefix)}


def _bloom(num_counters):
    return te.dynamic.BloomAdmission(2, num_counters, num_hashes=2, counter_bits=8)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_bloom_filter_of_another_size_is_refused_before_any_row(tmp_path, shards):
    source = _trained(1, admission=_bloom(4096))
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "c"))
    target = _trained(shards, admission=_bloom(1024))
    before = _everything(target)
    with pytest.raises(ValueError, match=r"DynamicTable 'users'.*bloom_counters is uint8 \[1, 4096\].*\[parts, 1024\]"):
        tf.train.Checkpoint(t=target).read(path)
    _assert_unchanged(target, before)
    # The same tensors handed to the restore itself (no checkpoint position: a SavedModel's restore, a caller).
    restored = {k: tf.constant(v) for k, v in _saved_tensors(path).items()}
    with pytest.raises(ValueError, match=r"bloom_counters is uint8 \[1, 4096\]"):
        target._restore_from_tensors(restored)
    _assert_unchanged(target, before)


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
def test_corrupted_decayed_counts_are_refused_before_any_row(tmp_path, shards, bad):
    policy = te.dynamic.DecayedLFU(100, 0.5)
    source = _trained(1, eviction=policy)
    source.evict(step=1)
    real = source.export_policy_state

    def corrupted():
        out = real()
        counts = out["decayed_counts"].numpy().copy()
        counts[-1] = bad
        return {**out, "decayed_counts": tf.constant(counts)}

    source.export_policy_state = corrupted
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "c"))
    target = _trained(shards, eviction=policy)
    for part in _parts(target):
        part.evict(step=1)
    before = _everything(target)
    with pytest.raises(
        ValueError, match=r"DynamicTable 'users'.*decayed_counts\[\d+\] \(key \d+\) is .*finite and >= 0"
    ):
        tf.train.Checkpoint(t=target).read(path)
    _assert_unchanged(target, before)


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize(
    "saved, restored, match",
    [
        (
            {"admission": _bloom(4096)},
            {"admission": te.dynamic.FrequencyAdmission(2, max_pending_keys=100)},
            r"saved by a table with te.dynamic.BloomAdmission .*this table's admission is "
            r"te.dynamic.FrequencyAdmission\(min_count=2\)",
        ),
        (
            {"admission": te.dynamic.FrequencyAdmission(2, max_pending_keys=100)},
            {"admission": _bloom(4096)},
            r"saved by a table with te.dynamic.FrequencyAdmission or no admission .*this table's admission is "
            r"te.dynamic.BloomAdmission\(num_counters=4096, counter_bits=8\)",
        ),
        (
            {"eviction": te.dynamic.DecayedLFU(100, 0.5)},
            {"eviction": te.dynamic.LFU(100)},
            r"saved by a table with DecayedLFU eviction, this table has another eviction than DecayedLFU",
        ),
    ],
    ids=["bloom_into_frequency", "frequency_into_bloom", "decayed_into_lfu"],
)
def test_a_checkpoint_of_another_policy_is_refused_naming_both(tmp_path, shards, saved, restored, match):
    source = _trained(1, **saved)
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "c"))
    target = _trained(shards, **restored)
    before = _everything(target)
    with pytest.raises(ValueError, match=rf"DynamicTable 'users': restore: the checkpoint .*{match}"):
        tf.train.Checkpoint(t=target).read(path)
    _assert_unchanged(target, before)


def test_a_tpu_embedding_refuses_a_bloom_checkpoint_into_its_frequency_table(tmp_path):
    def emb(admission):
        table = te.DynamicTableConfig("users", 4, max_rows=100, admission=admission)
        out = te.TPUEmbedding(
            {"f": tf.tpu.experimental.embedding.FeatureConfig(table, name="f")}, te.optimizers.SGD(0.1)
        )
        out.build()
        return out, table

    source, table = emb(_bloom(4096))
    train_lookup(source.dynamic_tables[table], [1, 1, 2], 0)
    path = tf.train.Checkpoint(embedding=source).write(str(tmp_path / "c"))
    target, target_table = emb(te.dynamic.FrequencyAdmission(2, max_pending_keys=10))
    train_lookup(target.dynamic_tables[target_table], [5, 5, 6], 0)
    before = _everything(target.dynamic_tables[target_table])
    with pytest.raises(ValueError, match=r"te.dynamic.BloomAdmission.*te.dynamic.FrequencyAdmission\(min_count=2\)"):
        tf.train.Checkpoint(embedding=target).read(path)
    _assert_unchanged(target.dynamic_tables[target_table], before)


def test_the_same_policies_still_restore(tmp_path):
    source = _trained(1, admission=_bloom(4096), eviction=te.dynamic.DecayedLFU(100, 0.5))
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "c"))
    target = _table(2, admission=_bloom(4096), eviction=te.dynamic.DecayedLFU(100, 0.5))
    tf.train.Checkpoint(t=target).read(path).assert_consumed()
    np.testing.assert_array_equal(np.sort(target.export()["keys"].numpy()), content(source)["keys"])


def test_in_a_graph_the_policy_state_is_asserted_before_the_rows(tmp_path):
    """A restore traced into a function (a SavedModel's restore): the assertions run before the rows' import."""
    source = _trained(1, admission=_bloom(4096))
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "c"))
    saved = _saved_tensors(path)
    target = _trained(1, admission=_bloom(1024))
    before = _everything(target)

    @tf.function
    def restore():
        return target._restore_from_tensors({k: tf.constant(v) for k, v in saved.items()})

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bloom_counters must be \[parts, 1024\]"):
        restore()
    _assert_unchanged(target, before)
