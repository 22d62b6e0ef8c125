"""Table order, table names and learning-rate tags: one resolver, the same answer from every front end.

Expected values are written by hand from TensorFlow's rules (first appearance in ``tf.nest.flatten`` order by
identity, ``table_{i}`` for unnamed tables, one tag per distinct callable compared with ``==`` in table order).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tf_embed_ops as te
import tf_embed_ops.config as tec
from tf_embed_ops.config._resolve import first_appearance, resolve_tables

E = tf.tpu.experimental.embedding


class _Rate:
    """A learning-rate callable equal to any other with the same value (TensorFlow dedups with ==)."""

    def __init__(self, value: float):
        self.value = value

    def __call__(self) -> float:
        return self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rate) and other.value == self.value

    __hash__ = None


def _features():
    # Tables by first appearance in flatten order (dict keys sorted: "a", "b", "c", "d"):
    #   "a" -> unnamed U (id 0, "table_0"), "b" -> named "x" (id 1), "c" -> U again, "d" -> unnamed V (id 2).
    # Learning rates: U constant, x _Rate(0.5), V another _Rate(0.5) equal to x's -> both tag 0.
    u = E.TableConfig(vocabulary_size=8, dim=2, optimizer=E.SGD(learning_rate=0.1))
    x = E.TableConfig(vocabulary_size=8, dim=2, name="x", optimizer=E.Adagrad(learning_rate=_Rate(0.5)))
    v = E.TableConfig(vocabulary_size=8, dim=2, optimizer=E.SGD(learning_rate=_Rate(0.5)))
    features = {
        "c": E.FeatureConfig(u, name="c", output_shape=[2]),
        "b": E.FeatureConfig(x, name="b", output_shape=[2]),
        "a": E.FeatureConfig(u, name="a", output_shape=[2]),
        "d": E.FeatureConfig(v, name="d", output_shape=[2]),
    }
    return features, (u, x, v)


def test_resolver_orders_names_and_tags_as_tensorflow():
    features, (u, x, v) = _features()
    resolved = resolve_tables(tf.nest.flatten(features))
    assert resolved.tables == (u, x, v)
    assert resolved.names == ("table_0", "x", "table_2")
    assert [resolved.tag(i) for i in range(3)] == [None, 0, 0]
    assert len(resolved.learning_rates) == 1
    assert [resolved.table_id(t) for t in (v, u, x)] == [2, 0, 1]


def test_every_front_end_gets_the_same_numbering():
    features, _ = _features()
    built = tec.from_feature_config(features)
    assert [t.name for t in built.table_descriptor] == ["table_0", "x", "table_2"]
    assert [f.table_id for f in built.feature_descriptor] == [0, 1, 0, 2]
    lrs = [t.optimization_parameters.learning_rate for t in built.table_descriptor]
    assert [lr.WhichOneof("learning_rate") for lr in lrs] == ["constant", "dynamic", "dynamic"]
    assert [lr.dynamic.tag for lr in lrs[1:]] == [0, 0]
    assert built.table_descriptor[0].optimization_parameters.learning_rate.constant == pytest.approx(0.1)

    # TPUEmbedding (and the Keras layers built on it) on fresh objects: same proto, names written into the tables.
    features, (u, x, v) = _features()
    embedding = te.TPUEmbedding(features)
    assert [u.name, x.name, v.name] == ["table_0", "x", "table_2"]
    assert embedding.config_proto == built


def test_duplicate_names_are_refused_by_every_front_end():
    def features():
        a = E.TableConfig(vocabulary_size=8, dim=2, name="t", optimizer=E.SGD(0.1))
        b = E.TableConfig(vocabulary_size=8, dim=2, name="t", optimizer=E.SGD(0.1))
        return [E.FeatureConfig(a), E.FeatureConfig(b)]

    with pytest.raises(ValueError, match="Multiple tables with name t found"):
        tec.from_feature_config(features())
    with pytest.raises(ValueError, match="Multiple tables with name t found"):
        te.TPUEmbedding(features())


def test_first_appearance_uses_in_semantics_by_default():
    a, b = _Rate(1.0), _Rate(1.0)
    assert first_appearance([a, b, 3, 3, a]) == [a, 3]
    assert first_appearance([a, b], lambda p, q: p is q) == [a, b]
