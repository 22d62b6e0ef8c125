"""Runs one parameter-server or worker task of a ParameterServerStrategy job that uses tf_embed_ops.

The chief (coordinator) sends functions to the other tasks as graphs that name our ops (`TfEmbed>...`); a task
can only run them if tf_embed_ops' kernels are registered in its process.  So every ps/worker task loads the op
library first, then starts its `tf.distribute.Server` and serves until killed:

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python -m tf_embed_ops.distribute.server

The chief runs the training program itself (with `TFConfigClusterResolver`); see docs/distributed.md.

Security: TensorFlow's gRPC servers have no authentication and run any graph a client sends them.  So the
server refuses a task address that is not loopback unless `--trusted-network` says the network between the
tasks is private (docs/distributed.md, "Security").
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys

__all__ = ["check_task_address", "is_loopback_address", "main", "start_server", "task_address"]

TRUSTED_NETWORK_FLAG = "--trusted-network"


def task_address(tf_config: dict) -> str:
    """The `host:port` that `tf_config`'s own task serves on (its entry in the cluster).

    Raises:
      ValueError: if the cluster has no such job or index.
    """
    cluster, task = tf_config.get("cluster") or {}, tf_config.get("task") or {}
    job, index = task.get("type"), int(task.get("index", 0))
    addresses = cluster.get(job) or []
    if not 0 <= index < len(addresses):
        raise ValueError(f"TF_CONFIG cluster has no address for task {job!r} index {index}; cluster: {cluster!r}.")
    return addresses[index]


def is_loopback_address(address: str) -> bool:
    """True when `address` (`host:port`, `[v6]:port`) names this machine's loopback interface only.

    `localhost`, 127.0.0.0/8 and ::1 are loopback; any other name or address (including 0.0.0.0) is not, since
    a host name could resolve to a public interface.
    """
    if address.startswith("["):
        host = address[1 : address.find("]")]
    elif address.count(":") == 1:
        host = address.rsplit(":", 1)[0]
    else:  # a bare IPv6 address (or a name without a port)
        host = address
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_task_address(tf_config: dict, *, trusted_network: bool) -> None:
    """Refuses a non-loopback task address unless the caller declared the network trusted.

    Raises:
      ValueError: naming the address and the flag, if the task's address is not loopback and `trusted_network`
        is False (or the cluster has no address for the task).
    """
    address = task_address(tf_config)
    if not trusted_network and not is_loopback_address(address):
        raise ValueError(
            f"refusing to serve on {address!r}: it is not a loopback address, and TensorFlow's gRPC server is "
            f"unauthenticated (anyone who reaches the port can run any graph in this process). Only on a private "
            f"network whose firewall admits the job's own tasks only, pass {TRUSTED_NETWORK_FLAG} "
            f"(start_server(..., trusted_network=True)); see docs/distributed.md, 'Security'."
        )


def start_server(tf_config: dict, *, protocol: str = "grpc", trusted_network: bool = False):
    """Loads tf_embed_ops' ops, then starts this process's server for the task in `tf_config`.

    Args:
      tf_config: the parsed TF_CONFIG: {"cluster": {job: [host:port, ...]}, "task": {"type": ..., "index": ...}}.
      protocol: the RPC layer ("grpc").
      trusted_network: allow a task address that is not loopback (the network between the tasks is private
        and firewalled: anyone who can reach the port can run arbitrary graphs in this process).

    Returns:
      The started `tf.distribute.Server` (call `.join()` to serve forever).

    Raises:
      ValueError: if `tf_config` has no cluster or task, the task is not a "ps" or "worker" task, or its address
        is not loopback and `trusted_network` is False.
    """
    import tensorflow as tf

    from tf_embed_ops import _loader

    cluster, task = tf_config.get("cluster"), tf_config.get("task")
    if not cluster or not task:
        raise ValueError(f"TF_CONFIG must have 'cluster' and 'task'; got keys {sorted(tf_config)}.")
    if task.get("type") not in ("ps", "worker"):
        raise ValueError(
            f"TF_CONFIG task type must be 'ps' or 'worker' (the chief runs the training program); got {task!r}."
        )
    check_task_address(tf_config, trusted_network=trusted_network)
    _loader.load_ops()  # registers the kernels in this process before it serves
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
    """Entry point: `python -m tf_embed_ops.distribute.server [--tf-config JSON] [--trusted-network]`.

    TF_CONFIG comes from `--tf-config`, else the environment.  Returns 2 (with a message on stderr) for a missing
    TF_CONFIG or a non-loopback address without `--trusted-network`.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tf-config", help="TF_CONFIG JSON (default: the TF_CONFIG environment variable)")
    parser.add_argument(
        TRUSTED_NETWORK_FLAG,
        action="store_true",
        help="serve on a non-loopback address: only on a private network whose firewall admits the job's tasks only",
    )
    args = parser.parse_args(argv)
    raw = args.tf_config or os.environ.get("TF_CONFIG")
    if not raw:
        print("error: set TF_CONFIG (or pass --tf-config)", file=sys.stderr)
        return 2
    tf_config = json.loads(raw)
    try:  # before TensorFlow is imported: a refused address costs nothing
        check_task_address(tf_config, trusted_network=args.trusted_network)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = start_server(tf_config, trusted_network=args.trusted_network)
    print(f"tf_embed_ops server started: {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
