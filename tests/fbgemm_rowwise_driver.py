"""Runs FBGEMM's EXACT_ROWWISE_ADAGRAD on given inputs; used by tests/test_rowwise_adagrad_fbgemm.py.

Runs in the FBGEMM peer's interpreter (torch + fbgemm-gpu-cpu, made by benchmarks/peers/setup_fbgemm.sh), never
beside TensorFlow: ``<fbgemm-python> fbgemm_rowwise_driver.py JOB_DIR``.  JOB_DIR holds ``job.json``::

    {"rows": V, "dim": D, "num_features": F, "learning_rate": lr, "eps": e, "weight_decay": wd,
     "weight_decay_mode": "NONE" | "L2" | "DECOUPLE", "steps": S, "momentum0": value}

and ``w0.npy`` [V, D] float32, and per step s and feature f ``ids_{s}_{f}.npy`` (int64), ``off_{s}_{f}.npy``
(int64 bag offsets, B + 1) and ``grad_{s}_{f}.npy`` [B, D] float32 (the gradient of the feature's sum-pooled
output).  All F features look up the one table (F > 1 makes FBGEMM treat it as a shared table).  Writes
``w.npy`` [V, D] and ``momentum1.npy`` [V] after the S steps, and prints FBGEMM's version.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def main(job_dir: str) -> None:
    import fbgemm_gpu
    import torch
    from fbgemm_gpu import split_embedding_configs as cfg
    from fbgemm_gpu import split_table_batched_embeddings_ops_common as common
    from fbgemm_gpu import split_table_batched_embeddings_ops_training as tbe

    optim_type = getattr(cfg, "EmbOptimType", None) or cfg.OptimType
    with open(os.path.join(job_dir, "job.json")) as f:
        job = json.load(f)
    rows, dim, num_features = job["rows"], job["dim"], job["num_features"]
    torch.set_num_threads(1)
    emb = tbe.SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, dim, common.EmbeddingLocation.HOST, common.ComputeDevice.CPU)],
        feature_table_map=[0] * num_features,
        optimizer=optim_type.EXACT_ROWWISE_ADAGRAD,
        learning_rate=job["learning_rate"],
        eps=job["eps"],
        weight_decay=job["weight_decay"],
        weight_decay_mode=getattr(tbe.WeightDecayMode, job["weight_decay_mode"]),
        pooling_mode=common.PoolingMode.SUM,
        device=torch.device("cpu"),
        weights_precision=cfg.SparseType.FP32,
        output_dtype=cfg.SparseType.FP32,
    )
    with torch.no_grad():
        emb.split_embedding_weights()[0].copy_(torch.from_numpy(np.load(os.path.join(job_dir, "w0.npy"))))
        emb.split_optimizer_states()[0][0].fill_(job["momentum0"])
    load = lambda name: np.load(os.path.join(job_dir, name))
    for s in range(job["steps"]):
        ids, offsets, grads, last = [], [0], [], 0
        for f in range(num_features):
            ids.append(load(f"ids_{s}_{f}.npy"))
            off = load(f"off_{s}_{f}.npy")
            offsets.extend((off[1:] + last).tolist())
            last += int(off[-1])
            grads.append(load(f"grad_{s}_{f}.npy"))
        out = emb(torch.from_numpy(np.concatenate(ids)), torch.tensor(offsets, dtype=torch.int64))
        # The output is [B, F * D], features side by side.
        out.backward(torch.from_numpy(np.concatenate(grads, axis=1)))
    np.save(os.path.join(job_dir, "w.npy"), emb.split_embedding_weights()[0].detach().numpy())
    np.save(os.path.join(job_dir, "momentum1.npy"), emb.split_optimizer_states()[0][0].detach().numpy())
    print(json.dumps({"torch": torch.__version__, "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "?")}))


if __name__ == "__main__":
    main(sys.argv[1])
