"""Runs one parameter-server or worker task of a ParameterServerStrategy job that uses tf_embed_ops.

The chief (coordinator) sends functions to the other tasks as graphs that name our ops (`TfEmbed>...`); a task
can only run them if tf_embed_ops' kernels are registered in its process.  So every ps/worker task loads the op
library first, then starts its `tf.distribute.Server` and serves until killed:

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python -m tf_embed_ops.distribute.server

The chief runs the training program itself (with `TFConfigClusterResolver`); see docs/distributed.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "start_server"]


def start_server(tf_config: dict, *, protocol: str = "grpc"):
    """Loads tf_embed_ops' ops, then starts this process's server for the task in `tf_config`.

    Args:
      tf_config: the parsed TF_CONFIG: {"cluster": {job: [host:port, ...]}, "task": {"type": ..., "index": ...}}.
      protocol: the RPC layer ("grpc").

    Returns:
      The started `tf.distribute.Server` (call `.join()` to serve forever).

    Raises:
      ValueError: if `tf_config` has no cluster or task, or the task is not a "ps" or "worker" task.
    """
    import tensorflow as tf

    import tf_embed_ops

    cluster, task = tf_config.get("cluster"), tf_config.get("task")
    if not cluster or not task:
        raise ValueError(f"TF_CONFIG must have 'cluster' and 'task'; got keys {sorted(tf_config)}.")
    if task.get("type") not in ("ps", "worker"):
        raise ValueError(
            f"TF_CONFIG task type must be 'ps' or 'worker' (the chief runs the training program); got {task!r}."
        )
    tf_embed_ops.ops  # noqa: B018 - loading registers the kernels in this process before it serves
    config = None
    if task["type"] == "worker":
        # As TensorFlow's in-process clusters: workers need num_workers + 1 inter-op threads or closures can hang.
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=len(cluster.get("worker", [])) + 1)
    return tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=task["type"],
        task_index=int(task.get("index", 0)),
        protocol=protocol,
        config=config,
        start=True,
    )


def main(argv: list | None = None) -> int:
    """Entry point: `python -m tf_embed_ops.distribute.server [--tf-config JSON]` (default: $TF_CONFIG)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tf-config", help="TF_CONFIG JSON (default: the TF_CONFIG environment variable)")
    args = parser.parse_args(argv)
    raw = args.tf_config or os.environ.get("TF_CONFIG")
    if not raw:
        print("error: set TF_CONFIG (or pass --tf-config)", file=sys.stderr)
        return 2
    server = start_server(json.loads(raw))
    print(f"tf_embed_ops server started: {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
