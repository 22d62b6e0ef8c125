"""FBGEMM peer: times FBGEMM's CPU table-batched embedding (TBE) on ids the suite generated.

Runs in its own interpreter (torch + fbgemm-gpu-cpu, see ``setup_fbgemm.sh``), never beside TensorFlow. The suite
writes a job (JSON) and the ids (``.npy``), calls ``<fbgemm-python> fbgemm_peer.py JOB.json`` and reads one JSON
object from stdout. One step is what our fused step is: forward (gather + pooling), backward and the optimizer
update, which FBGEMM fuses into the backward of ``SplitTableBatchedEmbeddingBagsCodegen`` (rows on the host,
``EmbeddingLocation.HOST``, ``ComputeDevice.CPU``).

Job format::

    {"tables": [{"rows": V, "dim": D}, ...],          # one entry per table
     "features": [{"table": t, "ids": "f0.npy", "offsets": "f0_off.npy" | null, "pooling": "sum"|"mean"|"none"}],
     "optimizers": ["sgd", "adagrad", ...], "learning_rate": 0.01,
     "steps": 10, "blocks": 5, "warmup": 3, "threads": 1, "block_ms": 150}   # steps 0: sized to block_ms

All features of one TBE must share one pooling mode (FBGEMM's constraint), so the suite sends one pooling per job.
Optimizer names map to FBGEMM's exact (de-duplicating) variants; the ones FBGEMM has no CPU kernel for are reported
as ``{"error": ...}`` per optimizer rather than dropped.

Output: ``{"peer": "fbgemm", "torch": ver, "fbgemm_gpu": ver, "results": {opt: {"block_ms": [...]} | {"error": s}}}``
where each block figure is the mean ms/step over that block's steps (the suite takes the median over blocks).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

# Our optimizer name -> (FBGEMM OptimType name, what it computes). Row-wise Adagrad keeps one accumulator per row,
# element-wise (EXACT_ADAGRAD) one per element like TPU Adagrad; both are reported, labelled.
_OPTIMIZERS = {
    "sgd": "EXACT_SGD",
    "adagrad": "EXACT_ADAGRAD",
    "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
    "adam": "ADAM",
    "partial_rowwise_adam": "PARTIAL_ROWWISE_ADAM",
}


def _build(tables, features, optimizer, learning_rate, pooling, torch, tbe_mod, cfg, precision="fp32"):
    emb_cfg = [(t["rows"], t["dim"], tbe_mod.EmbeddingLocation.HOST, tbe_mod.ComputeDevice.CPU) for t in tables]
    pool = {"sum": tbe_mod.PoolingMode.SUM, "mean": tbe_mod.PoolingMode.MEAN, "none": tbe_mod.PoolingMode.NONE}[pooling]
    return tbe_mod.SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=emb_cfg,
        feature_table_map=[f["table"] for f in features],
        optimizer=getattr(cfg.OptimType, _OPTIMIZERS[optimizer]),
        learning_rate=learning_rate,
        eps=1e-8,
        pooling_mode=pool,
        device=torch.device("cpu"),
        weights_precision=getattr(cfg.SparseType, precision.upper()),  # FP32, or FP16 (job "weights_precision")
        output_dtype=cfg.SparseType.FP32,
    )


def _build_job(job: dict, optimizer: str, precision: str, torch, tbe_mod, cfg):
    """``_build`` with the job's tables, features, learning rate and pooling."""
    pooling = job.get("pooling", "sum")
    lr = job.get("learning_rate", 0.01)
    return _build(job["tables"], job["features"], optimizer, lr, pooling, torch, tbe_mod, cfg, precision)


def _inputs(features, base_dir, torch):
    """Concatenates the per-feature (ids, offsets) into TBE's flat layout: features major, then samples."""
    all_ids, all_offsets, last = [], [0], 0
    batch = None
    for f in features:
        ids = np.load(os.path.join(base_dir, f["ids"])).astype(np.int64)
        if f.get("offsets"):
            off = np.load(os.path.join(base_dir, f["offsets"])).astype(np.int64)
        else:
            off = np.arange(ids.shape[0] + 1, dtype=np.int64)
        if batch is None:
            batch = off.shape[0] - 1
        elif off.shape[0] - 1 != batch:
            raise ValueError(f"feature {f['ids']} has {off.shape[0] - 1} samples, expected {batch}")
        all_ids.append(ids)
        all_offsets.extend((off[1:] + last).tolist())
        last += ids.shape[0]
    return (torch.from_numpy(np.concatenate(all_ids)), torch.tensor(all_offsets, dtype=torch.int64), batch)


def _time(emb, ids, offsets, job: dict) -> dict:
    """Warms up, sizes the blocks, and times forward + backward (which applies the fused optimizer update)."""
    import torch

    # The upstream gradient: fixed random values of the activation's shape, as in our step.
    grad = torch.randn_like(emb(ids, offsets)) * 1e-3

    def step():
        emb(ids, offsets).backward(grad)

    for _ in range(int(job.get("warmup", 3))):
        step()
    steps = int(job["steps"])
    if steps <= 0:  # size blocks to about block_ms, like the suite does for its own engines
        t0 = time.perf_counter()
        step()
        est = (time.perf_counter() - t0) * 1e3
        steps = int(min(200, max(1, round(float(job.get("block_ms", 150.0)) / max(est, 1e-3)))))
    blocks = []
    for _ in range(int(job.get("blocks", 5))):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        blocks.append((time.perf_counter() - t0) * 1e3 / steps)
    return {"block_ms": blocks, "steps": steps}


def _setup(job: dict, base_dir: str):
    """Imports FBGEMM (names across its releases), sets the threads and seed; returns (modules, ids, offsets)."""
    import fbgemm_gpu  # registers the ops
    import torch
    from fbgemm_gpu import split_embedding_configs as cfg
    from fbgemm_gpu import split_table_batched_embeddings_ops_training as tbe_mod

    # EmbOptimType is the enum's real name; older releases called it OptimType.
    if not hasattr(cfg, "OptimType"):
        cfg.OptimType = cfg.EmbOptimType
    for name in ("EmbeddingLocation", "ComputeDevice", "PoolingMode"):
        if not hasattr(tbe_mod, name):
            from fbgemm_gpu import split_table_batched_embeddings_ops_common as common

            setattr(tbe_mod, name, getattr(common, name))

    torch.set_num_threads(int(job.get("threads", 1)))
    torch.manual_seed(0)
    ids, offsets, _ = _inputs(job["features"], base_dir, torch)
    return (fbgemm_gpu, torch, cfg, tbe_mod), ids, offsets


def run(job: dict, base_dir: str) -> dict:
    (fbgemm_gpu, torch, cfg, tbe_mod), ids, offsets = _setup(job, base_dir)
    dims = [job["tables"][f["table"]]["dim"] for f in job["features"]]
    out = {
        "peer": "fbgemm",
        "torch": torch.__version__,
        "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "?"),
        "threads": torch.get_num_threads(),
        "results": {},
    }
    for opt in job["optimizers"]:
        if opt not in _OPTIMIZERS:
            out["results"][opt] = {"error": f"no FBGEMM equivalent of optimizer {opt!r}"}
            continue
        try:
            emb = _build_job(job, opt, job.get("weights_precision", "fp32"), torch, tbe_mod, cfg)
            out["results"][opt] = {**_time(emb, ids, offsets, job), "optim_type": _OPTIMIZERS[opt], "out_dims": dims}
            del emb
        except Exception as e:  # reported per optimizer: FBGEMM lacks some CPU kernels
            out["results"][opt] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    return out


def serve(job: dict, base_dir: str) -> None:
    """A persistent worker (benchmarks/workers.py's protocol) on the job's ids, for the interleaved pairs.

    ``prepare NAME optimizer=sgd precision=fp32`` builds one TBE and warms it (``job["warmup"]`` steps); ``time
    NAME STEPS`` runs forward + backward STEPS times.
    """
    from benchmarks import workers

    (_, torch, cfg, tbe_mod), ids, offsets = _setup(job, base_dir)

    def make(name: str, params: dict):
        opt = params.get("optimizer", name)
        if opt not in _OPTIMIZERS:
            raise ValueError(f"optimizer: no FBGEMM equivalent of {opt!r}; expected one of {sorted(_OPTIMIZERS)}")
        emb = _build_job(job, opt, params.get("precision", "fp32"), torch, tbe_mod, cfg)
        grad = torch.randn_like(emb(ids, offsets)) * 1e-3

        def step():
            emb(ids, offsets).backward(grad)

        for _ in range(int(job.get("warmup", 3))):
            step()
        return step

    workers.serve(sys.stdin, sys.stdout, make)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--serve":
        with open(argv[2]) as f:
            serve(json.load(f), os.path.dirname(os.path.abspath(argv[2])))
        return 0
    if len(argv) != 2:
        print("usage: fbgemm_peer.py JOB.json | fbgemm_peer.py --serve JOB.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        job = json.load(f)
    print(json.dumps(run(job, os.path.dirname(os.path.abspath(argv[1])))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
