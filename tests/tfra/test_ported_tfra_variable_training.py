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
# ruff: noqa - TFRA's test bodies, kept as they are
"""TFRA's own tests of `de.Variable` (the hash-table variable) in training: checkpoints of a trained variable and
its slots (TensorFlow 1 `Saver`, meta graphs, `tf.train.Checkpoint`), restrict policies, slot variables, run
against tf_embed_ops.tfra (`de`).

Ported from TFRA's dynamic_embedding_variable_test.py with the changes `test_ported_tfra_variable.py` lists.
"""

import itertools
import numpy as np
import os
import tempfile

import tf_embed_ops.tfra as de
from keras import initializers as kinit
from tensorflow.python.checkpoint.checkpoint import Checkpoint
from tensorflow.python.eager import context
from tensorflow.python.framework import constant_op
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import ops
from tensorflow.python.framework import test_util
from tensorflow.python.module import module
from tensorflow.python.ops import init_ops
from tensorflow.python.ops import math_ops
from tensorflow.python.ops import script_ops
from tensorflow.python.ops import variables
from tensorflow.python.platform import test
from tensorflow.python.trackable import data_structures
from tensorflow.python.training import adam
from tensorflow.python.training import saver

from tests.tfra.tfra_port_support import (
    KERAS3_MINIMIZE,
    TF1_OPTIMIZER,
    TestGraph,
    _create_dynamic_shape_tensor,
    _get_meta_file,
    _write_checkpoint,
    data_fn,
    default_config,
    eager_execution_restored,
    mark_by_design,
    model_fn,
    optimizer_v2,
)


def _guarded_variables(embed_dim, **kwargs):
    """The two variables TFRA's restrict tests train: one under a timestamp, one under a frequency restrict policy."""
    return tuple(
        de.get_variable(
            name,
            key_dtype=dtypes.int64,
            value_dtype=dtypes.float32,
            initializer=-1.0,
            dim=embed_dim,
            restrict_policy=policy,
            **kwargs,
        )
        for name, policy in (("tstp_guard", de.TimestampRestrictPolicy), ("freq_guard", de.FrequencyRestrictPolicy))
    )


# TFRA's restrict tests: (data_len, maxval, num_reserved, trigger, embed_dim).
_RESTRICT_TEST_SIZES = (32, 256, 100, 150, 8)


def _slot_params(sparse_vars, optmz):
    """The slot variables of `sparse_vars` under `optmz`, each once."""
    slot_params = []
    for spv in sparse_vars:
        slot_params += spv.get_slot_variables(optmz)
    return list(set(slot_params))


@test_util.run_all_in_graph_and_eager_modes
class VariableTest(test.TestCase):
    def test_training_save_restore(self):
        if context.executing_eagerly():
            self.skipTest("skip eager test when using legacy Saver.")
        opt = de.DynamicEmbeddingOptimizer(adam.AdamOptimizer(0.3))
        id = 0
        if test_util.is_gpu_available():
            dim_list = [1, 2, 4, 8, 10, 16, 32, 64, 100, 200]
        else:
            dim_list = [10]
        for key_dtype, value_dtype, dim, step in itertools.product(
            [dtypes.int64],
            [dtypes.float32],
            dim_list,
            [10],
        ):
            id += 1
            save_dir = os.path.join(self.get_temp_dir(), "save_restore")
            save_path = os.path.join(tempfile.mkdtemp(prefix=save_dir), "hash")

            ids = script_ops.py_func(_create_dynamic_shape_tensor(), inp=[], Tout=key_dtype, stateful=True)

            params = de.get_variable(
                name="params-test-0915-" + str(id),
                key_dtype=key_dtype,
                value_dtype=value_dtype,
                initializer=init_ops.random_normal_initializer(0.0, 0.01),
                dim=dim,
            )
            _, var0 = de.embedding_lookup(params, ids, return_trainable=True, name="ff9800")

            def loss():
                return var0 * var0

            params_keys, params_vals = params.export()
            mini = opt.minimize(loss, var_list=[var0])
            opt_slots = params.get_slot_variables(opt)
            saveable_tables = []
            saveable_tables.extend(params.tables)
            for _s in opt_slots:
                saveable_tables.extend(_s.tables)
            _saver = saver.Saver(saveable_tables)

            with self.session(config=default_config, use_gpu=test_util.is_gpu_available()) as sess:
                self.evaluate(variables.global_variables_initializer())
                for _i in range(step):
                    self.evaluate([mini])
                size_before_saved = self.evaluate(params.size())
                np_params_keys_before_saved = self.evaluate(params_keys)
                np_params_vals_before_saved = self.evaluate(params_vals)
                opt_slots_kv_pairs = [_s.export() for _s in opt_slots]
                np_slots_kv_pairs_before_saved = [self.evaluate(_kv) for _kv in opt_slots_kv_pairs]
                _saver.save(sess, save_path)

            with self.session(config=default_config, use_gpu=test_util.is_gpu_available()) as sess:
                self.evaluate(variables.global_variables_initializer())
                self.assertAllEqual(0, self.evaluate(params.size()))

                _saver.restore(sess, save_path)
                params_keys_restored, params_vals_restored = params.export()
                size_after_restored = self.evaluate(params.size())
                np_params_keys_after_restored = self.evaluate(params_keys_restored)
                np_params_vals_after_restored = self.evaluate(params_vals_restored)

                opt_slots_kv_pairs_restored = [_s.export() for _s in opt_slots]
                np_slots_kv_pairs_after_restored = [self.evaluate(_kv) for _kv in opt_slots_kv_pairs_restored]
                self.assertAllEqual(size_before_saved, size_after_restored)
                self.assertAllEqual(
                    np.sort(np_params_keys_before_saved),
                    np.sort(np_params_keys_after_restored),
                )
                self.assertAllEqual(
                    np.sort(np_params_vals_before_saved, axis=0),
                    np.sort(np_params_vals_after_restored, axis=0),
                )
                for pairs_before, pairs_after in zip(np_slots_kv_pairs_before_saved, np_slots_kv_pairs_after_restored):
                    self.assertAllEqual(
                        np.sort(pairs_before[0], axis=0),
                        np.sort(pairs_after[0], axis=0),
                    )
                    self.assertAllEqual(
                        np.sort(pairs_before[1], axis=0),
                        np.sort(pairs_after[1], axis=0),
                    )
                if test_util.is_gpu_available():
                    self.assertTrue("GPU" in params.tables[0].resource_handle.device)

    def test_import_meta_graph_from_checkpoint(self):
        ops.disable_eager_execution()
        keys_dtype_list = [dtypes.int64]
        values_dtype_list = [dtypes.float32]

        run_id = 0
        for num_shards, k_dtype, d_dtype, init_mode, dim, run_step in itertools.product(
            [2],
            keys_dtype_list,
            values_dtype_list,
            ["constant"],
            [1, 10],
            [10],
        ):
            run_id += 1
            with ops.Graph().as_default() as g:
                with self.session(graph=g, config=default_config, use_gpu=test_util.is_gpu_available()) as sess:
                    test_graph = TestGraph(k_dtype, d_dtype, dim, num_shards, "var", "dvar", run_id)
                    self.evaluate(variables.global_variables_initializer())
                    sess.run([test_graph.devar_init_op])
                    for _ in range(run_step):
                        sess.run([test_graph.var_opt_op, test_graph.devar_opt_op])
                    var_loss_name = test_graph.var_loss.name
                    devar_loss_name = test_graph.devar_loss.name
                    prev_var_loss, prev_devar_loss = sess.run([var_loss_name, devar_loss_name])
                    check_de_keys_op_name = test_graph.check_de_keys.name
                    prev_keys = sorted(sess.run(check_de_keys_op_name))

                    self.assertAllCloseAccordingToType(
                        prev_var_loss,
                        prev_devar_loss,
                        msg="Cond:{},{},{},{},{},{}".format(num_shards, k_dtype, d_dtype, init_mode, dim, run_step),
                    )
                    _write_checkpoint(self, sess)
            with ops.Graph().as_default() as g:
                with self.session(graph=g, config=default_config, use_gpu=test_util.is_gpu_available()) as sess:
                    ckpt_dir = self.get_temp_dir()
                    save = saver.import_meta_graph(_get_meta_file(ckpt_dir))
                    save.restore(sess, saver.latest_checkpoint(ckpt_dir))

                    keys = sorted(sess.run(check_de_keys_op_name))
                    var_loss, devar_loss = sess.run([var_loss_name, devar_loss_name])

            self.assertAllEqual(prev_keys, keys)
            self.assertAllCloseAccordingToType(
                var_loss,
                prev_var_loss,
                msg="Cond:{},{},{},{},{},{}".format(num_shards, k_dtype, d_dtype, init_mode, dim, run_step),
            )
            self.assertAllCloseAccordingToType(
                devar_loss,
                prev_devar_loss,
                msg="Cond:{},{},{},{},{},{}".format(num_shards, k_dtype, d_dtype, init_mode, dim, run_step),
            )

    def test_fail_to_write_checkpoint_for_loaded_meta_graph(self):
        run_id = 0
        for num_shards, k_dtype, d_dtype, init_mode, dim, run_step in itertools.product(
            [2],
            [dtypes.int64],
            [dtypes.float32],
            ["constant"],
            [1, 10],
            [10],
        ):
            run_id += 1
        with ops.Graph().as_default() as g:
            with self.session(graph=g, use_gpu=test_util.is_gpu_available(), config=default_config) as sess:
                graph = TestGraph(k_dtype, d_dtype, dim, num_shards, "var", "devar", run_id)
                self.evaluate(variables.global_variables_initializer())
                sess.run([graph.devar_init_op])
                sess.run([graph.var_opt_op, graph.devar_opt_op])
                _write_checkpoint(self, sess)

        with ops.Graph().as_default() as g:
            with self.session(graph=g, use_gpu=test_util.is_gpu_available(), config=default_config) as sess:
                ckpt_dir = self.get_temp_dir()
                save = saver.import_meta_graph(_get_meta_file(ckpt_dir))
                save.restore(sess, saver.latest_checkpoint(ckpt_dir))
                with self.assertRaises(TypeError) as te:
                    _write_checkpoint(self, sess)
                    self.assertStartsWith(te.exception, "Can't convert Operation")

    def test_object_oriented_checkpoint(self):
        if not context.executing_eagerly():
            self.skipTest("Skip legacy mode for object oriented checkpoint.")

        class TestModel(module.Module):
            def __init__(self):
                self.devar_name = "_devar"
                self.devar = de.get_variable(self.devar_name, dim=2, initializer=kinit.RandomNormal(-1, 1))
                self.trainables = data_structures.NoDependency([])
                self.optmz = de.DynamicEmbeddingOptimizer(optimizer_v2.adam.Adam(0.1))
                self.slot_vars = []

            def __call__(self, x):
                embed, tw = de.embedding_lookup(self.devar, x, return_trainable=True, name="ojo2021")
                if not self.trainables:
                    self.trainables.append(tw)
                loss = math_ops.reduce_sum(embed)
                return loss

            def train(self, x):

                def _loss_fn():
                    return self(x)

                self.optmz.minimize(_loss_fn, var_list=self.trainables)
                if not self.slot_vars:
                    self.slot_vars += self.devar.get_slot_variables(self.optmz)

        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            model1 = TestModel()
            features = constant_op.constant([1, 2, 3], dtype=dtypes.int64)
            for _ in range(5):
                model1.train(features)
            loss1 = model1(features)
            keys1, vals1 = model1.devar.export()
            keys1, vals1 = zip(*sorted(zip(keys1, vals1), key=lambda x: x[0], reverse=False))
            slot_keys_and_vals1 = [sv.export() for sv in model1.slot_vars]

            ckpt1 = Checkpoint(model=model1, optimizer=model1.optmz)
            ckpt_dir = self.get_temp_dir()
            model_path = ckpt1.save(ckpt_dir)
            del model1

            model2 = TestModel()
            ckpt2 = Checkpoint(model=model2, optimizer=model2.optmz)
            model2.train(features)  # Pre-build trace before restore.
            ckpt2.restore(model_path)
            loss2 = model2(features)
            keys2, vals2 = model2.devar.export()
            keys2, vals2 = zip(*sorted(zip(keys2, vals2), key=lambda x: x[0], reverse=False))
            slot_keys_and_vals2 = [sv.export() for sv in model2.slot_vars]
            del model2

            self.assertAllEqual(loss1, loss2)
            self.assertAllEqual(keys1, keys2)
            self.assertAllEqual(vals1, vals2)

            for i in range(len(slot_keys_and_vals1)):
                ont_slot_kvs1 = list(
                    zip(
                        *sorted(
                            zip(slot_keys_and_vals1[i][0], slot_keys_and_vals1[i][1]), key=lambda x: x[0], reverse=False
                        )
                    )
                )
                ont_slot_kvs2 = list(
                    zip(
                        *sorted(
                            zip(slot_keys_and_vals2[i][0], slot_keys_and_vals2[i][1]), key=lambda x: x[0], reverse=False
                        )
                    )
                )
                self.assertAllEqual(ont_slot_kvs1[0], ont_slot_kvs2[0])
                self.assertAllEqual(ont_slot_kvs1[1], ont_slot_kvs2[1])

    def test_dynamic_embedding_variable_with_restrict_v1(self):
        if context.executing_eagerly():
            self.skipTest("skip eager test when using legacy optimizers.")

        optmz = de.DynamicEmbeddingOptimizer(adam.AdamOptimizer(0.1))
        data_len, maxval, num_reserved, trigger, embed_dim = _RESTRICT_TEST_SIZES

        var_guard_by_tstp, var_guard_by_freq = _guarded_variables(embed_dim, init_size=256)

        sparse_vars = [var_guard_by_tstp, var_guard_by_freq]

        indices = [data_fn((data_len, 1), maxval) for _ in range(3)]
        _, trainables, loss = model_fn(sparse_vars, embed_dim, indices)
        train_op = optmz.minimize(loss, var_list=trainables)

        var_sizes = [0, 0]
        self.evaluate(variables.global_variables_initializer())

        while not all(sz > trigger for sz in var_sizes):
            self.evaluate(train_op)
            var_sizes = self.evaluate([spv.size() for spv in sparse_vars])

        self.assertTrue(all(sz >= trigger for sz in var_sizes))
        tstp_restrict_op = var_guard_by_tstp.restrict(num_reserved, trigger=trigger)
        if tstp_restrict_op != None:
            self.evaluate(tstp_restrict_op)
        freq_restrict_op = var_guard_by_freq.restrict(num_reserved, trigger=trigger)
        if freq_restrict_op != None:
            self.evaluate(freq_restrict_op)
        var_sizes = self.evaluate([spv.size() for spv in sparse_vars])
        self.assertAllEqual(var_sizes, [num_reserved, num_reserved])

        slot_params = _slot_params(sparse_vars, optmz)

        for sp in slot_params:
            self.assertAllEqual(self.evaluate(sp.size()), num_reserved)
        tstp_size = self.evaluate(var_guard_by_tstp.restrict_policy.status.size())
        self.assertAllEqual(tstp_size, num_reserved)
        freq_size = self.evaluate(var_guard_by_freq.restrict_policy.status.size())
        self.assertAllEqual(freq_size, num_reserved)

    def test_dynamic_embedding_variable_with_restrict_v2(self):
        if not context.executing_eagerly():
            self.skipTest("Test in eager mode only.")

        optmz = de.DynamicEmbeddingOptimizer(optimizer_v2.adam.Adam(0.1))
        data_len, maxval, num_reserved, trigger, embed_dim = _RESTRICT_TEST_SIZES
        trainables = []

        var_guard_by_tstp, var_guard_by_freq = _guarded_variables(embed_dim)

        sparse_vars = [var_guard_by_tstp, var_guard_by_freq]

        def loss_fn(sparse_vars, trainables):
            indices = [data_fn((data_len, 1), maxval) for _ in range(3)]
            _, tws, loss = model_fn(sparse_vars, embed_dim, indices)
            trainables.clear()
            trainables.extend(tws)
            return loss

        def var_fn():
            return trainables

        var_sizes = [0, 0]

        while not all(sz > trigger for sz in var_sizes):
            optmz.minimize(lambda: loss_fn(sparse_vars, trainables), var_fn)
            var_sizes = [spv.size() for spv in sparse_vars]

        self.assertTrue(all(sz >= trigger for sz in var_sizes))
        var_guard_by_tstp.restrict(num_reserved, trigger=trigger)
        var_guard_by_freq.restrict(num_reserved, trigger=trigger)
        var_sizes = [spv.size() for spv in sparse_vars]
        self.assertAllEqual(var_sizes, [num_reserved, num_reserved])

        slot_params = _slot_params(sparse_vars, optmz)

        for sp in slot_params:
            self.assertAllEqual(sp.size(), num_reserved)
        self.assertAllEqual(var_guard_by_tstp.restrict_policy.status.size(), num_reserved)
        self.assertAllEqual(var_guard_by_freq.restrict_policy.status.size(), num_reserved)

    def test_get_slot_variables(self):
        var = de.get_variable(
            "trl4397", key_dtype=dtypes.int64, value_dtype=dtypes.float32, restrict_policy=de.TimestampRestrictPolicy
        )
        ids = constant_op.constant([1, 2, 3], dtype=dtypes.int64)

        def loss_fn(name, tws=[]):
            embed, tw = de.embedding_lookup(var, ids, return_trainable=True, name=name)
            tws.clear()
            tws.append(tw)
            loss = math_ops.reduce_sum(embed)
            return loss

        opt1 = de.DynamicEmbeddingOptimizer(adam.AdamOptimizer(0.1))
        opt2 = de.DynamicEmbeddingOptimizer(optimizer_v2.adam.Adam(0.1))

        tws = []
        if context.executing_eagerly():
            opt1.minimize(lambda: loss_fn("g1", tws), var_list=tws)
            opt2.minimize(lambda: loss_fn("g2", tws), var_list=tws)
        else:
            opt1.minimize(loss_fn("g1", tws), var_list=tws)
            opt2.minimize(lambda: loss_fn("g2", tws), var_list=tws)

        result = [v.name for v in var.get_slot_variables(opt1)]
        expect = sorted(
            [v.params.name for v in list(opt1._slots["m"].values())]
            + [v.params.name for v in list(opt1._slots["v"].values())]
        )
        self.assertAllEqual(result, expect)

        result = [v.name for v in var.get_slot_variables(opt2)]
        expect = sorted(
            [v["m"].params.name for v in list(opt2._slots.values())]
            + [v["v"].params.name for v in list(opt2._slots.values())]
        )
        self.assertAllEqual(result, expect)


# The tests that fail by design, each with its reason.
BY_DESIGN = {
    "VariableTest.test_get_slot_variables": TF1_OPTIMIZER,
    "VariableTest.test_import_meta_graph_from_checkpoint": TF1_OPTIMIZER,
    "VariableTest.test_training_save_restore": TF1_OPTIMIZER,
    "VariableTest.test_fail_to_write_checkpoint_for_loaded_meta_graph": TF1_OPTIMIZER,
    "VariableTest.test_dynamic_embedding_variable_with_restrict_v1": TF1_OPTIMIZER,
    "VariableTest.test_object_oriented_checkpoint": KERAS3_MINIMIZE,
    "VariableTest.test_dynamic_embedding_variable_with_restrict_v2": KERAS3_MINIMIZE,
}
mark_by_design(globals(), BY_DESIGN)
