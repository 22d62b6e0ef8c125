# Copyright 2020 The TensorFlow Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""What the ported TFRA tests (`test_ported_tfra_*.py`) share: TFRA's test helpers, and the `BY_DESIGN` marking.

The helpers are TFRA v0.8.1's (commit bfd611e716a48065b1574c9fcea6e3807e62a086), from
dynamic_embedding_variable_test.py and keras/layers/embedding_test.py, under the Apache-2.0 license above, with the
same changes as the test files say. TFRA's helpers that no ported test calls are left out. Two are new and only
name a loop TFRA's tests wrote out several times: `fit_growing_batches` and `check_layer_creation`.
"""

import itertools
import os
import platform
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import Sequential, layers
from keras.initializers import RandomNormal, RandomUniform
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.framework import constant_op, dtypes, ops, test_util
from tensorflow.python.ops import array_ops, embedding_ops, math_ops, nn, random_ops, resource_variable_ops
from tensorflow.python.training import adam, saver

import tf_embed_ops.tfra as de

default_config = config_pb2.ConfigProto(allow_soft_placement=True, gpu_options=config_pb2.GPUOptions(allow_growth=True))

# TensorFlow 2.21 has neither tf.estimator nor Keras 2's optimizer_v2: the Keras 3 Adam stands for Keras 2's, and
# the Estimator test fails (BY_DESIGN).
optimizer_v2 = types.SimpleNamespace(adam=types.SimpleNamespace(Adam=keras.optimizers.Adam))
estimator = estimator_lib = None


# Why a ported test fails by design (docs/migrating.md lists what tf_embed_ops.tfra refuses and why); each test
# module's BY_DESIGN maps its failing tests to these.
VALUE_DTYPE = (
    "de.Variable as a key-value map of int32 / float64 / ... values (the dtypes the test loops over): dynamic tables "
    "hold float32 embedding rows; other value dtypes are refused, naming the variable"
)
TF1_OPTIMIZER = (
    "a TensorFlow 1 optimizer (tf.compat.v1.train.AdamOptimizer, minimize in a graph) is refused: tables train with "
    "the fused optimizer of a Keras optimizer's family"
)
FILE_SAVER = (
    "de.CuckooHashTableCreator(saver=de.FileSystemSaver()) and TFRA's per-shard tables (`var.tables`) are refused: one "
    "table per variable, saved in the checkpoint"
)
GRAPH_MODE = (
    "its TensorFlow 1 graph-mode run (a Session, no global_variables_initializer): the table's step counter is a "
    "tf.Variable, which a TensorFlow 1 session must initialize; its eager run passes"
)
KERAS3_MINIMIZE = (
    "optimizer.minimize(loss_fn, var_list): Keras 3 optimizers have no minimize (use a GradientTape and "
    "apply_gradients)"
)
AMSGRAD = "Adam(amsgrad=True): the fused Adam has no AMSGrad variant; refused, naming the option"
FLOAT64 = "value_dtype=tf.float64 (in the product of options): dynamic tables hold float32 rows; refused, naming it"
LAYER_FILE_SAVER = (
    "de.CuckooHashTableCreator(saver=de.FileSystemSaver()): TFRA's per-table files are refused; tables are saved in "
    "the checkpoint (tf.train.Checkpoint, model.save)"
)


def mark_by_design(namespace: dict, by_design: dict[str, str]) -> None:
    """Marks each `Class.test` of `by_design` (a test module's globals) `xfail` with its reason."""
    for qualified, reason in by_design.items():
        cls_name, method = qualified.split(".")
        cls = namespace[cls_name]
        if not hasattr(cls, method):  # a stale entry would otherwise pass unnoticed
            raise KeyError(f"BY_DESIGN names {qualified}, which this module does not define")
        # Not strict: TensorFlow's run_all_in_graph_and_eager_modes runs each mode as a subtest, and the failing
        # subtest is what xfails (the test around it then reports XPASS).
        setattr(cls, method, pytest.mark.xfail(strict=False, reason=reason)(getattr(cls, method)))


@pytest.fixture(autouse=True)
def eager_execution_restored():
    """Some of TFRA's tests turn eager execution off for the whole process (TFRA ran each file in its own process);
    it is turned back on after every test, so the tests after it run as they would alone. Autouse in each module
    that imports it."""
    yield
    if not tf.executing_eagerly():
        ops.enable_eager_execution()


# --- keras/layers/embedding_test.py


def get_sequential_model(emb_t, *args, **kwargs):
    l0 = layers.InputLayer(input_shape=(None,), dtype=dtypes.int64)
    l1 = emb_t(*args, **kwargs)
    l2 = layers.Dense(8, "relu")
    l3 = layers.Dense(1, "sigmoid")
    if emb_t == de.keras.layers.Embedding:
        model = Sequential([l0, l1, l2, l3])
    elif emb_t == de.keras.layers.FieldWiseEmbedding:
        model = Sequential([l0, l1, layers.Flatten(), l2, l3])
    else:
        raise TypeError(f"Unsupported embedding layer {emb_t}")
    return model


def fit_growing_batches(model, after_fit=None):
    """TFRA's training loop: nine `fit`s of 10 rows of new ids (10, 20, ... 90 ids); `after_fit(ids_so_far)` after
    each."""
    start = 0
    batch_size = 10
    for i in range(1, 10):
        x = math_ops.range(start, start + batch_size * i, dtype=dtypes.int64)
        x = tf.reshape(x, (batch_size, -1))
        start += batch_size * i
        y = tf.zeros((batch_size, 1), dtype=dtypes.float32)
        model.fit(x, y, verbose=0)
        if after_fit is not None:
            after_fit(start)


def check_layer_creation(test, make_layer):
    """TFRA's `test_create`: `make_layer(dim, **options)` for each of its product of options (dim, key and value
    dtype, initializer, trainable, bp_v2, restrict policy) makes a layer of that name and no rows."""
    dims = [1, 4]
    key_dtypes = [dtypes.int32, dtypes.int64]
    if test_util.is_gpu_available():
        key_dtypes = [dtypes.int64]

    value_dtypes = [dtypes.float32, dtypes.float64]
    if test_util.is_gpu_available():
        value_dtypes = [dtypes.float32]
    initializers = [RandomNormal(), RandomUniform()]
    trainable_options = [True, False]
    bp_options = [True, False]
    restrict_policies = [None, de.TimestampRestrictPolicy, de.FrequencyRestrictPolicy]

    rnd = 0

    with test.session(use_gpu=test_util.is_gpu_available(), config=default_config):
        for comb in itertools.product(
            dims, key_dtypes, value_dtypes, initializers, trainable_options, bp_options, restrict_policies
        ):
            name = "test_creation" + str(rnd)
            embedding = make_layer(
                comb[0],
                key_dtype=comb[1],
                value_dtype=comb[2],
                initializer=comb[3]((1,), dtype=comb[2]),
                trainable=comb[4],
                bp_v2=comb[5],
                restrict_policy=comb[6],
                init_capacity=64,
                name=name,
            )
            rnd += 1
            test.assertAllEqual(embedding.name, name)
            test.assertAllEqual(test.evaluate(embedding.params.size()), 0)


# --- dynamic_embedding_variable_test.py


def is_macos():
    return platform.system() == "Darwin"


def is_arm64():
    return platform.machine() in ("arm64", "aarch64")


def _type_converter(tf_type):
    mapper = {
        dtypes.int32: np.int32,
        dtypes.int64: np.int64,
        dtypes.float32: float,
        dtypes.float64: np.float64,
        dtypes.string: str,
        dtypes.half: np.float16,
        dtypes.bfloat16: dtypes.bfloat16.as_numpy_dtype,
        dtypes.int8: np.int8,
        dtypes.bool: bool,
    }
    return mapper[tf_type]


def _get_devices():
    return ["/gpu:0" if test_util.is_gpu_available() else "/cpu:0"]


def data_fn(shape, maxval):
    return random_ops.random_uniform(shape, maxval=maxval, dtype=dtypes.int64)


def model_fn(sparse_vars, embed_dim, feature_inputs):
    embedding_weights = []
    embedding_trainables = []
    for sp in sparse_vars:
        for inp_tensor in feature_inputs:
            embed_w, trainable = de.embedding_lookup(sp, inp_tensor, return_trainable=True, name="nt9527")
            embedding_weights.append(embed_w)
            embedding_trainables.append(trainable)

    def layer_fn(entry, dimension, activation=False):
        entry = array_ops.reshape(entry, (-1, dimension, embed_dim))
        dnn_fn = layers.Dense(dimension, use_bias=False)
        batch_normal_fn = layers.BatchNormalization()
        dnn_result = dnn_fn(entry)
        if activation:
            return batch_normal_fn(nn.selu(dnn_result))
        return dnn_result

    def dnn_fn(entry, dimension, activation=False):
        hidden = layer_fn(entry, dimension, activation)
        output = layer_fn(hidden, 1)
        logits = math_ops.reduce_mean(output)
        return logits

    logits_sum = sum(dnn_fn(w, 16, activation=True) for w in embedding_weights)
    labels = 0.0
    err_prob = nn.sigmoid_cross_entropy_with_logits(logits=logits_sum, labels=labels)
    loss = math_ops.reduce_mean(err_prob)
    return labels, embedding_trainables, loss


def _create_dynamic_shape_tensor(
    max_len=100,
    min_len=2,
    min_val=0x0000F00000000001,
    max_val=0x0000F00000000020,
    dtype=np.int64,
):
    def _func():
        length = np.random.randint(min_len, max_len)
        tensor = np.random.randint(min_val, max_val, max_len, dtype=dtype)
        tensor = np.array(tensor[0:length], dtype=dtype)
        return tensor

    return _func


class TestGraph:
    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(self, key_dtype, value_dtype, dim, num_shards, var_name, devar_name, run_id, x=None):
        self.key_dtype = key_dtype
        self.value_dtype = value_dtype
        self.dim = dim

        # common define
        init_ids = [0, 1, 2]
        self.init_vals = np.random.rand(3, self.dim)
        raw_ids = [1]
        if x is None:
            self.x = constant_op.constant(np.random.rand(self.dim, len(raw_ids)), dtype=self.value_dtype)
        else:
            self.x = ops.convert_to_tensor(x, dtype=self.value_dtype)

        # variable graph
        self.var = resource_variable_ops.ResourceVariable(
            name="t2021-" + var_name + str(run_id), initial_value=self.init_vals, dtype=self.value_dtype
        )
        ids = constant_op.constant(raw_ids, dtype=self.key_dtype)
        self.var_lookup = embedding_ops.embedding_lookup([self.var], ids)
        self.var_pred = math_ops.matmul(self.var_lookup, self.x)
        self.var_loss = self.var_pred * self.var_pred
        self.var_opt_op = adam.AdamOptimizer(0.1).minimize(self.var_loss)

        # deo variable graph
        self.devar = de.get_variable(
            name="t2021-" + devar_name + str(run_id),
            key_dtype=self.key_dtype,
            value_dtype=self.value_dtype,
            devices=_get_devices() * num_shards,
            initializer=1.0,
            dim=dim,
        )
        self.devar_init_op = self.devar.upsert(
            constant_op.constant(init_ids, dtype=self.key_dtype),
            constant_op.constant(self.init_vals, dtype=self.value_dtype),
        )
        self.devar_lookup, self.detw = de.embedding_lookup([self.devar], ids, return_trainable=True)
        self.devar_pred = math_ops.matmul(self.devar_lookup, self.x)
        self.devar_loss = self.devar_pred * self.devar_pred
        optmz = de.DynamicEmbeddingOptimizer(adam.AdamOptimizer(0.1))
        self.devar_opt_op = optmz.minimize(self.devar_loss)
        self.check_de_keys, self.check_de_values = self.devar.export()


def _write_checkpoint(test, session):
    save = saver.Saver()
    ckpt_prefix = os.path.join(test.get_temp_dir(), "model")
    save.save(session, ckpt_prefix, global_step=0)


def _get_meta_file(ckpt_dir):
    for fname in os.listdir(ckpt_dir):
        if fname.endswith(".meta"):
            return os.path.join(ckpt_dir, fname)
    raise ValueError(f"No meta file found in {ckpt_dir}.")
