"""Child process of test_tiered_serving's memory test: how much the exporting process grows while it exports a
tiered table much larger than one chunk.

`python tiered_export_memory_child.py <directory>`: builds a Keras model over a tiered table of 393,216 x 64 float32
rows (96 MiB, SGD: no slots; a cache of 1 MiB; chunks of 2 MiB) and exports it twice (float32, then int8), then the
same table kept in memory (int8). Before each export it resets the kernel's peak-RSS mark (`/proc/self/clear_refs`,
"5"); after it, it reads the peak (`VmHWM`). It prints, as one JSON line, each export's peak growth over the RSS
before it, beside the table's bytes.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import tensorflow as tf
from tiered_support import peak_rss_growth, status_kib

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras

ROWS, DIM = 393216, 64


def _model(table: te.TableConfig) -> keras.Model:
    layer = te_keras.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(table, name="f")})
    inputs = {"f": keras.Input(shape=(), dtype="int64", name="f")}
    return keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)["f"]))


def main(directory: str) -> None:
    signature = {"f": tf.TensorSpec([None], tf.int64)}
    storage = te.Tiered(cache_bytes=1 << 20, directory=os.path.join(directory, "rows"), chunk_bytes=2 << 20)
    options = dict(optimizer=te.optimizers.SGD(0.1), initializer=tf.zeros_initializer())
    tiered = _model(te.TableConfig(ROWS, DIM, name="big", storage=storage, **options))
    report = {"table_bytes": ROWS * DIM * 4, "chunk_bytes": 2 << 20, "rss_before": status_kib("VmRSS") * 1024}
    for mode in (None, "int8"):  # the first export also traces and saves for the first time
        path = os.path.join(directory, f"tiered_{mode}")
        report[f"tiered_{mode or 'none'}"] = peak_rss_growth(
            lambda path=path, mode=mode: te_keras.export_for_serving(tiered, path, signature, quantization=mode)
        )
    # The same table in memory, for scale: its int8 export encodes a copy of the whole table.
    memory = _model(te.TableConfig(ROWS, DIM, name="big", **options))
    path = os.path.join(directory, "memory_int8")
    report["memory_int8"] = peak_rss_growth(
        lambda: te_keras.export_for_serving(memory, path, signature, quantization="int8")
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
