"""Child process of test_tiered_serving's memory test: how much the exporting process grows while it exports a
tiered table much larger than one chunk.

`python tiered_export_memory_child.py <directory>`: builds a Keras model over a tiered table of 393,216 x 64 float32
rows (96 MiB, SGD: no slots; a cache of 1 MiB; chunks of 2 MiB), then exports it twice (float32, int8). Before
each export it resets the kernel's peak-RSS mark (`/proc/self/clear_refs`, "5"); after it, it reads the peak
(`VmHWM`) and prints, as one JSON line, the peak's growth over the RSS before the export, beside the table's bytes.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras

ROWS, DIM = 393216, 64


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main(directory: str) -> None:
    storage = te.Tiered(cache_bytes=1 << 20, directory=os.path.join(directory, "rows"), chunk_bytes=2 << 20)
    table = te.TableConfig(
        ROWS, DIM, name="big", optimizer=te.optimizers.SGD(0.1), storage=storage, initializer=tf.zeros_initializer()
    )
    layer = te_keras.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(table, name="f")})
    inputs = {"f": keras.Input(shape=(), dtype="int64", name="f")}
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)["f"]))
    signature = {"f": tf.TensorSpec([None], tf.int64)}
    # A first export warms TensorFlow's tracing and saving code, which is not what is measured.
    te_keras.export_for_serving(model, os.path.join(directory, "warm"), signature)
    report = {"table_bytes": ROWS * DIM * 4, "chunk_bytes": 2 << 20}
    for mode in (None, "int8"):
        before = _status_kib("VmRSS")
        _reset_peak()
        te_keras.export_for_serving(model, os.path.join(directory, f"export_{mode}"), signature, quantization=mode)
        report[f"export_peak_growth_{mode or 'none'}"] = (_status_kib("VmHWM") - before) * 1024
        report[f"rss_before_{mode or 'none'}"] = before * 1024
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
