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
"""TFRA's own tests of `de.Variable` (the hash-table variable) as one table: lookups, upserts and removes at
several ranks, run against tf_embed_ops.tfra (`de`).

Ported from TFRA's dynamic_embedding_variable_test.py with the changes `test_ported_tfra_variable.py` lists.
"""

import numpy as np

import tf_embed_ops.tfra as de
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.framework import constant_op
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import test_util
from tensorflow.python.ops import init_ops
from tensorflow.python.ops import variables
from tensorflow.python.platform import test

from tests.tfra.tfra_port_support import (
    GRAPH_MODE,
    VALUE_DTYPE,
    default_config,
    eager_execution_restored,
    mark_by_design,
)


@test_util.run_all_in_graph_and_eager_modes
class VariableTest(test.TestCase):
    def test_dynamic_embedding_variable(self):
        with self.session(config=default_config, use_gpu=test_util.is_gpu_available()):
            default_val = constant_op.constant([-1, -2], dtypes.int64)
            keys = constant_op.constant([0, 1, 2, 3], dtypes.int64)
            values = constant_op.constant([[0, 1], [2, 3], [4, 5], [6, 7]], dtypes.int32)
            table = de.get_variable("t10", dtypes.int64, dtypes.int32, initializer=default_val, dim=2)
            self.assertAllEqual(0, self.evaluate(table.size()))

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(4, self.evaluate(table.size()))

            remove_keys = constant_op.constant([3, 4], dtypes.int64)
            self.evaluate(table.remove(remove_keys))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys = constant_op.constant([0, 1, 4], dtypes.int64)
            output = table.lookup(remove_keys)
            self.assertAllEqual([3, 2], output.get_shape())

            result = self.evaluate(output)
            self.assertAllEqual([[0, 1], [2, 3], [-1, -2]], result)

            exported_keys, exported_values = table.export()
            # exported data is in the order of the internal map, i.e. undefined
            sorted_keys = np.sort(self.evaluate(exported_keys))
            sorted_values = np.sort(self.evaluate(exported_values), axis=0)
            self.assertAllEqual([0, 1, 2], sorted_keys)
            sorted_expected_values = np.sort([[4, 5], [2, 3], [0, 1]], axis=0)
            self.assertAllEqual(sorted_expected_values, sorted_values)

            del table

    def test_dynamic_embedding_variable_export_insert(self):
        with self.session(config=default_config, use_gpu=test_util.is_gpu_available()):
            default_val = constant_op.constant([-1, -1], dtypes.int64)
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0, 1], [2, 3], [4, 5]], dtypes.int32)
            table1 = de.get_variable("t101", dtypes.int64, dtypes.int32, initializer=default_val, dim=2)
            self.assertAllEqual(0, self.evaluate(table1.size()))
            self.evaluate(table1.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table1.size()))

            input_keys = constant_op.constant([0, 1, 3], dtypes.int64)
            expected_output = [[0, 1], [2, 3], [-1, -1]]
            output1 = table1.lookup(input_keys)
            self.assertAllEqual(expected_output, self.evaluate(output1))

            exported_keys, exported_values = table1.export()
            self.assertAllEqual(3, self.evaluate(exported_keys).size)
            self.assertAllEqual(6, self.evaluate(exported_values).size)

            # Populate a second table from the exported data
            table2 = de.get_variable("t102", dtypes.int64, dtypes.int32, initializer=default_val, dim=2)
            self.assertAllEqual(0, self.evaluate(table2.size()))
            self.evaluate(table2.upsert(exported_keys, exported_values))
            self.assertAllEqual(3, self.evaluate(table2.size()))

            # Verify lookup result is still the same
            output2 = table2.lookup(input_keys)
            self.assertAllEqual(expected_output, self.evaluate(output2))

    def test_dynamic_embedding_variable_invalid_shape(self):
        with self.session(config=default_config, use_gpu=test_util.is_gpu_available()):
            default_val = constant_op.constant([-1, -1], dtypes.int64)
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            table = de.get_variable("t110", dtypes.int64, dtypes.int32, initializer=default_val, dim=2)

            # Shape [6] instead of [3, 2]
            values = constant_op.constant([0, 1, 2, 3, 4, 5], dtypes.int32)
            with self.assertRaisesOpError("Expected shape"):
                self.evaluate(table.upsert(keys, values))

            # Shape [2,3] instead of [3, 2]
            values = constant_op.constant([[0, 1, 2], [3, 4, 5]], dtypes.int32)
            with self.assertRaisesOpError("Expected shape"):
                self.evaluate(table.upsert(keys, values))

            # Shape [2, 2] instead of [3, 2]
            values = constant_op.constant([[0, 1], [2, 3]], dtypes.int32)
            with self.assertRaisesOpError("Expected shape"):
                self.evaluate(table.upsert(keys, values))

            # Shape [3, 1] instead of [3, 2]
            values = constant_op.constant([[0], [2], [4]], dtypes.int32)
            with self.assertRaisesOpError("Expected shape"):
                self.evaluate(table.upsert(keys, values))

            # Valid Insert
            values = constant_op.constant([[0, 1], [2, 3], [4, 5]], dtypes.int32)
            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

    def test_dynamic_embedding_variable_find_high_rank(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            default_val = -1
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0], [1], [2]], dtypes.int32)
            table = de.get_variable("t140", dtypes.int64, dtypes.int32, initializer=default_val)

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

            input_keys = constant_op.constant([[0, 1], [2, 4]], dtypes.int64)
            output = table.lookup(input_keys)
            self.assertAllEqual([2, 2, 1], output.get_shape())

            result = self.evaluate(output)
            self.assertAllEqual([[[0], [1]], [[2], [-1]]], result)

    def test_dynamic_embedding_variable_insert_low_rank(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            default_val = -1
            keys = constant_op.constant([[0, 1], [2, 3]], dtypes.int64)
            values = constant_op.constant([[[0], [1]], [[2], [3]]], dtypes.int32)
            table = de.get_variable("t150", dtypes.int64, dtypes.int32, initializer=default_val)

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(4, self.evaluate(table.size()))

            remove_keys = constant_op.constant([0, 1, 3, 4], dtypes.int64)
            output = table.lookup(remove_keys)

            result = self.evaluate(output)
            self.assertAllEqual([[0], [1], [3], [-1]], result)

    def test_dynamic_embedding_variable_remove_low_rank(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            default_val = -1
            keys = constant_op.constant([[0, 1], [2, 3]], dtypes.int64)
            values = constant_op.constant([[[0], [1]], [[2], [3]]], dtypes.int32)
            table = de.get_variable("t160", dtypes.int64, dtypes.int32, initializer=default_val)

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(4, self.evaluate(table.size()))

            remove_keys = constant_op.constant([1, 4], dtypes.int64)
            self.evaluate(table.remove(remove_keys))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys = constant_op.constant([0, 1, 3, 4], dtypes.int64)
            output = table.lookup(remove_keys)

            result = self.evaluate(output)
            self.assertAllEqual([[0], [-1], [3], [-1]], result)

    def test_dynamic_embedding_variable_insert_high_rank(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            default_val = constant_op.constant([-1, -1, -1], dtypes.int32)
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0, 1, 2], [2, 3, 4], [4, 5, 6]], dtypes.int32)
            table = de.get_variable("t170", dtypes.int64, dtypes.int32, initializer=default_val, dim=3)

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys = constant_op.constant([[0, 1], [3, 4]], dtypes.int64)
            output = table.lookup(remove_keys)
            self.assertAllEqual([2, 2, 3], output.get_shape())

            result = self.evaluate(output)
            self.assertAllEqual([[[0, 1, 2], [2, 3, 4]], [[-1, -1, -1], [-1, -1, -1]]], result)

    def test_dynamic_embedding_variable_remove_high_rank(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            default_val = constant_op.constant([-1, -1, -1], dtypes.int32)
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0, 1, 2], [2, 3, 4], [4, 5, 6]], dtypes.int32)
            table = de.get_variable("t180", dtypes.int64, dtypes.int32, initializer=default_val, dim=3)

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys = constant_op.constant([[0, 3]], dtypes.int64)
            self.evaluate(table.remove(remove_keys))
            self.assertAllEqual(2, self.evaluate(table.size()))

            remove_keys = constant_op.constant([[0, 1], [2, 3]], dtypes.int64)
            output = table.lookup(remove_keys)
            self.assertAllEqual([2, 2, 3], output.get_shape())

            result = self.evaluate(output)
            self.assertAllEqual([[[-1, -1, -1], [2, 3, 4]], [[4, 5, 6], [-1, -1, -1]]], result)

    def test_dynamic_embedding_variables(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            default_val = -1
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0], [1], [2]], dtypes.int32)

            table1 = de.get_variable("t191", dtypes.int64, dtypes.int32, initializer=default_val)
            table2 = de.get_variable("t192", dtypes.int64, dtypes.int32, initializer=default_val)
            table3 = de.get_variable("t193", dtypes.int64, dtypes.int32, initializer=default_val)
            self.evaluate(table1.upsert(keys, values))
            self.evaluate(table2.upsert(keys, values))
            self.evaluate(table3.upsert(keys, values))

            self.assertAllEqual(3, self.evaluate(table1.size()))
            self.assertAllEqual(3, self.evaluate(table2.size()))
            self.assertAllEqual(3, self.evaluate(table3.size()))

            remove_keys = constant_op.constant([0, 1, 3], dtypes.int64)
            output1 = table1.lookup(remove_keys)
            output2 = table2.lookup(remove_keys)
            output3 = table3.lookup(remove_keys)

            out1, out2, out3 = self.evaluate([output1, output2, output3])
            self.assertAllEqual([[0], [1], [-1]], out1)
            self.assertAllEqual([[0], [1], [-1]], out2)
            self.assertAllEqual([[0], [1], [-1]], out3)

    def test_dynamic_embedding_variable_with_tensor_default(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            default_val = constant_op.constant(-1, dtypes.int32)
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0], [1], [2]], dtypes.int32)
            table = de.get_variable("t200", dtypes.int64, dtypes.int32, initializer=default_val)

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys = constant_op.constant([0, 1, 3], dtypes.int64)
            output = table.lookup(remove_keys)

            result = self.evaluate(output)
            self.assertAllEqual([[0], [1], [-1]], result)

    def test_signature_mismatch(self):
        config = config_pb2.ConfigProto()
        config.allow_soft_placement = True
        config.gpu_options.allow_growth = True
        with self.session(config=config, use_gpu=test_util.is_gpu_available()):
            default_val = -1
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0], [1], [2]], dtypes.int32)
            table = de.get_variable("t210", dtypes.int64, dtypes.int32, initializer=default_val)

            # upsert with keys of the wrong type
            with self.assertRaises(ValueError):
                self.evaluate(table.upsert(constant_op.constant([4.0, 5.0, 6.0], dtypes.float32), values))

            # upsert with values of the wrong type
            with self.assertRaises(ValueError):
                self.evaluate(table.upsert(keys, constant_op.constant(["a", "b", "c"])))

            self.assertAllEqual(0, self.evaluate(table.size()))

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys_ref = variables.Variable(0, dtype=dtypes.int64)
            input_int64_ref = variables.Variable([-1], dtype=dtypes.int32)
            self.evaluate(variables.global_variables_initializer())

            # Ref types do not produce an upsert signature mismatch.
            self.evaluate(table.upsert(remove_keys_ref, input_int64_ref))
            self.assertAllEqual(3, self.evaluate(table.size()))

            # Ref types do not produce a lookup signature mismatch.
            self.assertEqual([-1], self.evaluate(table.lookup(remove_keys_ref)))

            # lookup with keys of the wrong type
            remove_keys = constant_op.constant([1, 2, 3], dtypes.int32)
            with self.assertRaises(ValueError):
                self.evaluate(table.lookup(remove_keys))

    def test_dynamic_embedding_variable_int_float(self):
        with self.session(config=default_config, use_gpu=test_util.is_gpu_available()):
            default_val = -1.0
            keys = constant_op.constant([3, 7, 0], dtypes.int64)
            values = constant_op.constant([[7.5], [-1.2], [9.9]], dtypes.float32)
            table = de.get_variable("t220", dtypes.int64, dtypes.float32, initializer=default_val)
            self.assertAllEqual(0, self.evaluate(table.size()))

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys = constant_op.constant([7, 0, 11], dtypes.int64)
            output = table.lookup(remove_keys)

            result = self.evaluate(output)
            self.assertAllClose([[-1.2], [9.9], [default_val]], result)

    def test_dynamic_embedding_variable_with_random_init(self):
        with self.session(use_gpu=test_util.is_gpu_available(), config=default_config):
            keys = constant_op.constant([0, 1, 2], dtypes.int64)
            values = constant_op.constant([[0.0], [1.0], [2.0]], dtypes.float32)
            default_val = init_ops.random_uniform_initializer()
            table = de.get_variable("t230", dtypes.int64, dtypes.float32, initializer=default_val)

            self.evaluate(table.upsert(keys, values))
            self.assertAllEqual(3, self.evaluate(table.size()))

            remove_keys = constant_op.constant([0, 1, 3], dtypes.int64)
            output = table.lookup(remove_keys)

            result = self.evaluate(output)
            self.assertNotEqual([-1.0], result[2])


# The tests that fail by design, each with its reason.
BY_DESIGN = {
    "VariableTest.test_dynamic_embedding_variable": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_export_insert": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_find_high_rank": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_invalid_shape": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variables": VALUE_DTYPE,
    "VariableTest.test_signature_mismatch": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_with_tensor_default": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_insert_high_rank": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_insert_low_rank": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_remove_high_rank": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_remove_low_rank": VALUE_DTYPE,
    "VariableTest.test_dynamic_embedding_variable_int_float": GRAPH_MODE,
    "VariableTest.test_dynamic_embedding_variable_with_random_init": GRAPH_MODE,
}
mark_by_design(globals(), BY_DESIGN)
