"""from_feature_config / to_feature_config against TensorFlow's own TPUEmbedding._create_config_proto.

The reference is TensorFlow's real builder, run on CPU by making its TPUStrategy check see a stand-in strategy
(num_hosts, num_replicas_in_sync are all it reads).  Its protobuf-7 crash (a bool assigned to the
low_dimensional_packing_status enum) is worked around only here, by turning that attribute into an
int before the build.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import google.protobuf as protobuf
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.util import nest

import tf_embed_ops.config as tec

E = tf.tpu.experimental.embedding


class _StandInTPUStrategy:
    def __init__(self, num_hosts: int, num_replicas: int):
        self.extended = SimpleNamespace(num_hosts=num_hosts)
        self.num_replicas_in_sync = num_replicas


def tf_reference(
    feature_config,
    optimizer=None,
    *,
    num_hosts=1,
    num_tensor_cores=1,
    pipeline_execution_with_tensor_core=False,
    output_shapes=None,
):
    """TensorFlow's TPUEmbedding(...)._create_config_proto() for the same arguments."""
    strategy = _StandInTPUStrategy(num_hosts, num_tensor_cores)
    fake_module = SimpleNamespace(TPUStrategy=_StandInTPUStrategy, TPUStrategyV2=_StandInTPUStrategy)
    hosts = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(num_hosts)]
    with (
        mock.patch.object(tpu_embedding_v2.distribute_lib, "get_strategy", return_value=strategy),
        mock.patch.object(tpu_embedding_v2, "tpu_strategy", fake_module),
        mock.patch.object(tpu_embedding_v2.tpu_embedding_v2_utils, "get_list_of_hosts", return_value=hosts),
    ):
        emb = tpu_embedding_v2.TPUEmbedding(feature_config, optimizer, pipeline_execution_with_tensor_core)
        if isinstance(output_shapes, int):
            emb._get_and_update_output_shapes_from_input(per_replica_batch_size=output_shapes)
        elif output_shapes is not None:
            flat = [tf.TensorShape(s) for s in nest.flatten_up_to(feature_config, output_shapes)]
            emb._check_output_shapes(flat)
            emb._update_output_shapes(flat)
        for table in emb._table_config:  # the protobuf-7 workaround (reference path only)
            table.optimizer.low_dimensional_packing_status = int(table.optimizer.low_dimensional_packing_status)
        return emb._create_config_proto()


def assert_same_proto(actual, expected):
    assert text_format.MessageToString(actual) == text_format.MessageToString(expected)
    assert actual == expected
    assert actual.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


# ---- cases: each returns fresh objects (TF's builder mutates TableConfigs) ----


def case_sgd_unnamed():
    t = E.TableConfig(vocabulary_size=10, dim=4)
    return [E.FeatureConfig(t, output_shape=[8])], E.SGD(learning_rate=0.5), {}


def case_adagrad_weight_and_gradient_clipping():
    t = E.TableConfig(20, 3, name="t")
    opt = E.Adagrad(0.2, initial_accumulator_value=0.1, clip_weight_min=-1.5, clip_weight_max=2.0, clipvalue=0.25)
    return {"f": E.FeatureConfig(t, output_shape=[4], name="f")}, opt, {}


def case_adagrad_momentum_one_sided_clip():
    t = E.TableConfig(7, 2, name="am")
    opt = E.AdagradMomentum(
        0.01,
        momentum=0.9,
        use_nesterov=True,
        exponent=3.0,
        beta2=0.99,
        epsilon=1e-6,
        clipvalue=(None, 2.0),
        clip_weight_max=5.0,
    )
    return (E.FeatureConfig(t, output_shape=[2, 3]),), opt, {}


def case_adam_non_lazy_weight_decay_multiply():
    t = E.TableConfig(30, 8, name="adam")
    opt = E.Adam(
        0.001,
        beta_1=0.8,
        beta_2=0.95,
        epsilon=1e-5,
        lazy_adam=False,
        sum_inside_sqrt=False,
        weight_decay_factor=0.01,
        multiply_weight_decay_factor_by_learning_rate=True,
    )
    return [E.FeatureConfig(t, output_shape=[16])], opt, {}


def case_adam_weight_decay_without_multiply():
    t = E.TableConfig(30, 8, name="adam")
    opt = E.Adam(0.001, weight_decay_factor=0.5, multiply_weight_decay_factor_by_learning_rate=False)
    return [E.FeatureConfig(t, output_shape=[16])], opt, {}


def case_ftrl_all_fields():
    t = E.TableConfig(12, 5, name="ftrl")
    opt = E.FTRL(
        0.05,
        learning_rate_power=-0.25,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
        beta=0.5,
        multiply_linear_by_learning_rate=True,
        allow_zero_accumulator=True,
    )
    return [E.FeatureConfig(t, output_shape=[4])], opt, {}


def case_accumulation_disabled():
    a = E.TableConfig(5, 2, name="a", optimizer=E.SGD(0.1, use_gradient_accumulation=False))
    b = E.TableConfig(5, 2, name="b", optimizer=E.Adagrad(0.1, use_gradient_accumulation=False))
    c = E.TableConfig(5, 2, name="c", optimizer=E.Adam(0.1, use_gradient_accumulation=False, lazy_adam=True))
    return [E.FeatureConfig(x, output_shape=[3]) for x in (a, b, c)], None, {}


def case_quantization():
    t = E.TableConfig(9, 4, name="q", quantization_config=E.QuantizationConfig(num_buckets=16, lower=-2.0, upper=3.0))
    return [E.FeatureConfig(t, output_shape=[5])], E.SGD(0.1), {}


def case_dynamic_learning_rates_shared_and_distinct():
    # docs/semantics.md's example: tables [C(f1), A(f2), B(0.5), D(f2)] -> tags C=0, A=1, D=1; two equal-bodied
    # lambdas differ.
    f1 = lambda: 0.1
    f2 = lambda: 0.2
    f3 = lambda: 0.2
    tc = E.TableConfig(4, 2, name="C", optimizer=E.Adagrad(f1))
    ta = E.TableConfig(4, 2, name="A", optimizer=E.Adam(f2))
    tb = E.TableConfig(4, 2, name="B", optimizer=E.SGD(0.5))
    td = E.TableConfig(4, 2, name="D", optimizer=E.FTRL(f2))
    te = E.TableConfig(4, 2, name="E")  # global optimizer, its own callable
    features = [E.FeatureConfig(t, output_shape=[2]) for t in (tc, ta, tb, td, te)]
    return features, E.SGD(f3), {}


def case_multiple_unnamed_tables_dict_order():
    shared = E.TableConfig(11, 3)
    other = E.TableConfig(13, 6, name="named")
    third = E.TableConfig(17, 2)
    features = {
        "zz": E.FeatureConfig(third, output_shape=[4]),
        "aa": E.FeatureConfig(shared, output_shape=[4], name="aa"),
        "mm": E.FeatureConfig(other, output_shape=[4, 2]),
        "bb": E.FeatureConfig(shared, output_shape=[4]),
    }
    return features, E.Adagrad(0.3), {}


def case_num_hosts_padding_and_cluster():
    small = E.TableConfig(3, 4, name="small")  # padded to num_hosts
    big = E.TableConfig(100, 4, name="big")
    features = [E.FeatureConfig(small, output_shape=[8]), E.FeatureConfig(big, output_shape=[8])]
    kwargs = {"num_hosts": 8, "num_tensor_cores": 32, "pipeline_execution_with_tensor_core": True}
    return features, E.SGD(0.1), kwargs


def case_sequence_features_from_batch_size():
    t = E.TableConfig(50, 4, name="seq")
    features = [E.FeatureConfig(t, max_sequence_length=6), E.FeatureConfig(t), E.FeatureConfig(t, output_shape=[16, 2])]
    return features, E.Adagrad(0.1), {"output_shapes": 16}


def case_output_shapes_nest():
    t = E.TableConfig(50, 4, name="t")
    features = {"a": E.FeatureConfig(t), "b": [E.FeatureConfig(t), E.FeatureConfig(t, output_shape=[3, 3])]}
    return features, E.Adagrad(0.1), {"output_shapes": {"a": [5], "b": [[5, 2], None]}}


def case_low_dimensional_packing():
    t = E.TableConfig(64, 2, name="packed", optimizer=E.Adagrad(0.1, low_dimensional_packing_status=True))
    u = E.TableConfig(64, 2, name="plain", optimizer=E.Adagrad(0.1, low_dimensional_packing_status=False))
    return [E.FeatureConfig(t, output_shape=[2]), E.FeatureConfig(u, output_shape=[2])], None, {}


CASES = [v for k, v in sorted(globals().items()) if k.startswith("case_")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
def test_from_feature_config_matches_tensorflow(case):
    features, optimizer, kwargs = case()
    ours = tec.from_feature_config(features, optimizer, **kwargs)
    features, optimizer, kwargs = case()
    assert_same_proto(ours, tf_reference(features, optimizer, **kwargs))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
def test_to_feature_config_round_trips(case):
    features, optimizer, kwargs = case()
    cluster = {k: v for k, v in kwargs.items() if k != "output_shapes"}
    original = tec.from_feature_config(features, optimizer, **kwargs)
    cfg = tec.load(original)  # also: everything TF builds passes the C++ validator
    back_features, back_optimizer = tec.to_feature_config(cfg)
    assert_same_proto(tec.from_feature_config(back_features, back_optimizer, **cluster), original)
    # TensorFlow's own builder maps the reconstructed objects back to the same proto too.
    back_features, back_optimizer = tec.to_feature_config(cfg)
    assert_same_proto(tf_reference(back_features, back_optimizer, **cluster), original)


def _protobuf_refuses_a_bool_in_an_enum() -> bool:
    try:
        tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration().mode = False
    except TypeError:
        return True
    return False


def test_tensorflow_builder_really_crashes_without_the_workaround():
    # Why the reference needs its workaround (and why from_feature_config exists): docs/semantics.md, "Python
    # behaviour we do not copy". The crash is TensorFlow's bool meeting a protobuf that refuses it: the protobuf
    # TensorFlow 2.16 to 2.19 install (below 6) takes the bool as 0.
    if not _protobuf_refuses_a_bool_in_an_enum():
        pytest.skip(
            f"protobuf {protobuf.__version__} (as TensorFlow {tf.__version__} installs it) takes a bool in an enum "
            "field: TensorFlow's builder does not crash on low_dimensional_packing_status there"
        )
    t = E.TableConfig(4, 2, name="t")
    emb_args = ([E.FeatureConfig(t, output_shape=[2])], E.SGD(0.1))
    strategy = _StandInTPUStrategy(1, 1)
    fake_module = SimpleNamespace(TPUStrategy=_StandInTPUStrategy, TPUStrategyV2=_StandInTPUStrategy)
    with (
        mock.patch.object(tpu_embedding_v2.distribute_lib, "get_strategy", return_value=strategy),
        mock.patch.object(tpu_embedding_v2, "tpu_strategy", fake_module),
        mock.patch.object(tpu_embedding_v2.tpu_embedding_v2_utils, "get_list_of_hosts", return_value=["h"]),
    ):
        emb = tpu_embedding_v2.TPUEmbedding(*emb_args)
        with pytest.raises(TypeError, match="low_dimensional_packing_status"):
            emb._create_config_proto()


def test_from_feature_config_does_not_modify_the_tables():
    t = E.TableConfig(4, 2)
    global_opt = E.SGD(0.1)
    tec.from_feature_config([E.FeatureConfig(t, output_shape=[2])], global_opt)
    assert t.name is None and t.optimizer is None
    assert global_opt.low_dimensional_packing_status is False


def test_unknown_shapes_leave_input_shape_empty():
    t = E.TableConfig(4, 2, name="t")
    proto = tec.from_feature_config(
        [E.FeatureConfig(t), E.FeatureConfig(t, output_shape=[3])], E.SGD(0.1), output_shapes=[[None, 2], None]
    )
    assert [list(f.input_shape) for f in proto.feature_descriptor] == [[], [3]]
    assert tec.load(proto).features[0].input_shape == ()


def test_dynamic_learning_rate_placeholder():
    t = E.TableConfig(4, 2, name="t", optimizer=E.SGD(lambda: 0.3))
    u = E.TableConfig(4, 2, name="u", optimizer=E.Adagrad(lambda: 0.3))
    features, optimizer = tec.to_feature_config(
        tec.from_feature_config([E.FeatureConfig(t, name="a"), E.FeatureConfig(u, name="b")])
    )
    assert optimizer is None
    lr_t, lr_u = features["a"].table.optimizer.learning_rate, features["b"].table.optimizer.learning_rate
    assert isinstance(lr_t, tec.DynamicLearningRate) and (lr_t.tag, lr_u.tag) == (0, 1)
    with pytest.raises(RuntimeError, match="tag=0"):
        lr_t()
    lr_t.set(0.25)
    lr_u.set(lambda: 0.125)
    assert (lr_t(), lr_u()) == (0.25, 0.125)


def test_to_feature_config_shared_optimizer_and_defaults():
    cfg = tec.load(tec.example_config_path())
    features, optimizer = tec.to_feature_config(
        cfg, combiner={"video": "sum", "user": "sqrtn", "query": "mean", "item": "sum", "category": "mean"}
    )
    assert optimizer is None  # the example's tables use different optimizers
    assert isinstance(features, tuple)  # names not in sorted order, so a dict would reorder features
    tables = {f.table.name: f.table for f in features}
    assert tables["video"].combiner == "sum" and tables["user"].combiner == "sqrtn"
    assert tables["user"].optimizer.initial_accumulator_value == pytest.approx(0.1)
    assert tables["query"].optimizer.initial_accumulator_value == pytest.approx(0.1)
    assert tables["video"].optimizer.learning_rate is tables["user"].optimizer.learning_rate  # shared tag 0
    with pytest.raises(ValueError, match="combiner: no entry for table 'video'"):
        tec.to_feature_config(cfg, combiner={})

    shared, opt = tec.to_feature_config(
        tec.from_feature_config(case_multiple_unnamed_tables_dict_order()[0], E.Adagrad(0.3))
    )
    assert isinstance(opt, E.Adagrad) and all(f.table.optimizer is None for f in tf.nest.flatten(shared))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ([E.FeatureConfig(E.TableConfig(4, 2, name="x"))], None), "table 'x' has no optimizer"),
        (lambda: ([E.FeatureConfig(E.TableConfig(4, 2, name="x", optimizer=object()))], None), "not supported"),
        (
            lambda: (
                [E.FeatureConfig(E.TableConfig(4, 2, name="x")), E.FeatureConfig(E.TableConfig(4, 2, name="x"))],
                E.SGD(0.1),
            ),
            "Multiple tables with name x",
        ),
        (
            lambda: (
                [E.FeatureConfig(E.TableConfig(4, 2)), E.FeatureConfig(E.TableConfig(4, 2, name="table_0"))],
                E.SGD(0.1),
            ),
            "Multiple tables with name table_0",
        ),
        (lambda: ([E.TableConfig(4, 2)], E.SGD(0.1)), "entry 0 of the flattened nest is a TableConfig"),
        (lambda: ([], E.SGD(0.1)), "no FeatureConfig"),
    ],
)
def test_from_feature_config_rejects_misuse(make, message):
    features, optimizer = make()
    with pytest.raises(ValueError, match=message):
        tec.from_feature_config(features, optimizer)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_hosts": 0}, "num_hosts: must be an int >= 1"),
        ({"num_tensor_cores": True}, "num_tensor_cores: must be an int >= 1"),
        ({"output_shapes": [[4], [4]]}, "output_shapes: must have the structure"),
        ({"output_shapes": [[5]]}, r"contradicts the given output shape \(5,\)"),
        ({"output_shapes": 0}, "batch size must be >= 1"),
    ],
)
def test_from_feature_config_rejects_bad_arguments(kwargs, message):
    features = [E.FeatureConfig(E.TableConfig(4, 2, name="t"), output_shape=[4])]
    with pytest.raises(ValueError, match=message):
        tec.from_feature_config(features, E.SGD(0.1), **kwargs)
