"""Child process of test_tiered_dynamic_serving's SIGKILL test: exports a tiered dynamic table for serving, then
exports it again after changing its rows and stops in the middle of writing the rows, for the parent to kill.

`python tiered_dynamic_serving_kill_child.py <directory> <export path>`: a tiered dynamic table of 1,000 keys x 8
(SGD) with every row 1.0 is exported to the export path (prints "exported"); then its rows become 2.0 and it is
exported to the same path again, each chunk of rows slowed: after the second chunk is written it prints "writing"
and sleeps (the parent SIGKILLs it there).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.dynamic import serving as dynamic_serving
from tf_embed_ops.dynamic import streamed_serving

KEYS, DIM = 1000, 8
CHUNK_ROWS = 100


def _export(table: te.dynamic.DynamicTable, path: str) -> None:
    form = dynamic_serving.freeze_streamed(table)
    root = tf.Module()
    root.table = form
    root.serve = tf.function(form.lookup, input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    te.serving.save_streamed(root, path, signatures={"serving_default": root.serve})


def _write_rows(table: te.dynamic.DynamicTable, keys: np.ndarray, value: float) -> None:
    dynamic_ops.dynamic_table_tiered_write_rows(table.handle, keys, np.full([KEYS, DIM], value, np.float32), [])


def main(directory: str, path: str) -> None:
    rows = os.path.join(directory, "rows")
    storage = te.Tiered(cache_bytes=1 << 16, directory=rows, chunk_bytes=CHUNK_ROWS * 4 * DIM)
    config = te.DynamicTableConfig("t", DIM, optimizer=te.optimizers.SGD(0.1), storage=storage)
    table = te.dynamic.DynamicTable(config)
    keys = np.arange(KEYS, dtype=np.int64) * 7 + 3
    ones, none = np.ones(KEYS, np.int64), np.zeros(0, np.int64)
    dynamic_ops.dynamic_table_tiered_import_keys(table.handle, keys, ones, ones, none, none, none)
    _write_rows(table, keys, 1.0)
    _export(table, path)
    print("exported", flush=True)
    _write_rows(table, keys, 2.0)
    chunks = streamed_serving.StreamedDynamicTable.streamed_chunks

    def slowed(self):
        for i, chunk in enumerate(chunks(self)):
            yield chunk
            if i == 1:  # two chunks written into the temporary export
                print("writing", flush=True)
                time.sleep(600)

    streamed_serving.StreamedDynamicTable.streamed_chunks = slowed
    _export(table, path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
