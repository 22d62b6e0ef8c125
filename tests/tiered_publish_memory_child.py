"""Child process of test_tiered_publisher's memory test: how much the publishing process grows while
`te.serving.Publisher` publishes a tiered table much larger than one chunk.

`python tiered_publish_memory_child.py <directory> tiered|memory|tiered_dynamic|memory_dynamic [large|one_chunk]`:
builds a Keras model over a table of 393,216 x 64 float32 rows (96 MiB, SGD: no slots), or a dynamic table of
65,536 keys x 256 (64 MiB of rows, SGD; filled through the streamed restore's ops, or `import_` in memory; its full
versions get 1,024 free slots), tiered (a cache of 1 MiB, chunks of 2 MiB) or kept in memory; `one_chunk` makes
the table one chunk (8,192 rows, 2,048 keys) and changes nothing else. It publishes two full versions (the first
also traces and saves for the first time), trains one batch and publishes a delta. Before each publish it resets
the kernel's peak-RSS mark (`/proc/self/clear_refs`, "5"); after it, it reads the peak (`VmHWM`). It prints, as
one JSON line, each publish's peak growth over the RSS before it, the process's peak RSS during the second full
version, and its RSS before the model was built (TensorFlow imported), beside the table's bytes: run once per kind
and size, the peaks compare the processes. A save's cost that does not depend on the table (tracing and
serializing the servable's functions, tens of MiB) is the same at both sizes, so the difference of two sizes is
what the table costs.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf
from tiered_support import peak_rss_growth, status_kib

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras
from tf_embed_ops.dynamic import ops as dynamic_ops

DIM, DYNAMIC_DIM = 64, 256
# The table's rows (static) and keys (dynamic), by size.
SIZES = {"large": (393216, 65536), "one_chunk": (8192, 2048)}


def _model(table: te.TableConfig) -> keras.Model:
    layer = te_keras.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(table, name="f")})
    inputs = {"f": keras.Input(shape=(), dtype="int64", name="f")}
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)["f"]))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _publish(model: keras.Model, directory: str, kind: str, report: dict, ids: np.ndarray) -> None:
    signature = {"f": tf.TensorSpec([None], tf.int64)}
    pub = te.serving.Publisher(model, directory, signature, dynamic_headroom=0.0)
    report[f"{kind}_full_1"] = peak_rss_growth(pub.publish_full)
    report[f"{kind}_full_2"] = peak_rss_growth(pub.publish_full)
    report[f"{kind}_full_2_peak"] = status_kib("VmHWM") * 1024
    model.fit({"f": ids}, np.ones([256, 1], np.float32), batch_size=256, verbose=0)
    report[f"{kind}_delta"] = peak_rss_growth(pub.publish_delta)
    entry = te.serving.read_manifest(directory)["chain"][-1]
    report[f"{kind}_delta_kind"], report[f"{kind}_delta_rows"] = entry["kind"], entry.get("rows", {}).get("big")


def _dynamic_model(directory: str, tiered: bool, num_keys: int) -> keras.Model:
    storage = te.Tiered(cache_bytes=1 << 20, directory=os.path.join(directory, "rows"), chunk_bytes=2 << 20)
    config = te.DynamicTableConfig(
        "big", DYNAMIC_DIM, optimizer=te.optimizers.SGD(0.1), storage=storage if tiered else None
    )
    model = _model(config)
    layer = [x for x in model.layers if isinstance(x, te_keras.TPUEmbedding)][0]
    table = next(iter(layer.dynamic_tables.values()))
    keys = np.arange(num_keys, dtype=np.int64) * 1000003 - 77
    rng = np.random.default_rng(0)
    if tiered:
        ones, none = np.ones(num_keys, np.int64), np.zeros(0, np.int64)
        dynamic_ops.dynamic_table_tiered_import_keys(table.handle, keys, ones, ones, none, none, none)
        rows = (2 << 20) // (4 * DYNAMIC_DIM)
        for start in range(0, num_keys, rows):
            weights = rng.normal(size=(min(rows, num_keys - start), DYNAMIC_DIM)).astype(np.float32)
            dynamic_ops.dynamic_table_tiered_write_rows(table.handle, keys[start : start + rows], weights, [])
    else:
        table.import_(keys, rng.normal(size=(num_keys, DYNAMIC_DIM)).astype(np.float32))
    return model, keys


def main(directory: str, kind: str, size: str = "large") -> None:
    rows, num_keys = SIZES[size]
    report = {"rss_before": status_kib("VmRSS") * 1024}
    if kind.endswith("_dynamic"):
        report.update(table_bytes=num_keys * DYNAMIC_DIM * 4, chunk_bytes=2 << 20)
        model, keys = _dynamic_model(directory, kind == "tiered_dynamic", num_keys)
        ids = np.random.default_rng(1).choice(keys, size=256, replace=False)
    else:
        report.update(table_bytes=rows * DIM * 4, chunk_bytes=2 << 20)
        storage = te.Tiered(cache_bytes=1 << 20, directory=os.path.join(directory, "rows"), chunk_bytes=2 << 20)
        options = dict(optimizer=te.optimizers.SGD(0.1), initializer=tf.zeros_initializer())
        if kind == "tiered":
            model = _model(te.TableConfig(rows, DIM, name="big", storage=storage, **options))
        else:
            model = _model(te.TableConfig(rows, DIM, name="big", **options))
        ids = np.random.default_rng(0).integers(0, rows, size=256).astype(np.int64)
    _publish(model, os.path.join(directory, kind), kind, report, ids)
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
