"""FBGEMM's int-N inference lookup (`IntNBitTableBatchedEmbeddingBagsCodegen`, CPU) on the serving_quant workload.

Runs in FBGEMM's interpreter (torch + fbgemm-gpu-cpu, no TensorFlow): ``python fbgemm_serving_peer.py SPEC_JSON
THREADS``. SPEC_JSON holds the two tables ({"user": [rows, dim, "sum"], "item": [rows, dim, "mean"]}), the batch
(`feed`: user ids, item ids and row splits, as the TensorFlow signature takes them) and the timing plan; it prints
{mode: [per-call milliseconds per block]} for fp32, int8 and int4 weights (random rows: the kernels' speed does not
depend on the values), float32 output, the modes alternating block by block.
"""

import json
import sys
import time

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen

spec = json.loads(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
feed = spec["feed"]
user_ids = torch.tensor(feed["user"], dtype=torch.int32)
user_offsets = torch.arange(0, user_ids.numel() + 1, dtype=torch.int32)
item_ids = torch.tensor(feed["items_values"], dtype=torch.int32)
item_offsets = torch.tensor(feed["items_row_splits"], dtype=torch.int32)
POOLING = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}


def module(table, sparse_type):
    rows, dim, combiner = table
    emb = IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[("t", rows, dim, sparse_type, EmbeddingLocation.HOST)],
        device="cpu",
        pooling_mode=POOLING[combiner],
        output_dtype=SparseType.FP32,
    )
    emb.fill_random_weights()
    return emb


modes = {"fp32": SparseType.FP32, "int8": SparseType.INT8, "int4": SparseType.INT4}
mods = {m: (module(spec["tables"]["user"], t), module(spec["tables"]["item"], t)) for m, t in modes.items()}


def call(pair):
    user, item = pair
    return user(user_ids, user_offsets), item(item_ids, item_offsets)


with torch.inference_mode():
    for pair in mods.values():
        for _ in range(spec["warmup"]):
            call(pair)
    times = {m: [] for m in mods}
    for _ in range(spec["blocks"]):
        for m, pair in mods.items():
            t0 = time.perf_counter()
            for _ in range(spec["calls"]):
                call(pair)
            times[m].append((time.perf_counter() - t0) / spec["calls"] * 1e3)
print(json.dumps(times))
