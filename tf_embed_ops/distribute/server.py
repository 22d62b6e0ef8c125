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
import re
import socket
import sys
from typing import Any

__all__ = [
    "check_task_address",
    "check_tf_config",
    "is_loopback_address",
    "main",
    "parse_address",
    "parse_tf_config",
    "start_server",
    "task_address",
]

TRUSTED_NETWORK_FLAG = "--trusted-network"

# main's exit status when another process holds the task's port: the port was free when the job's launcher chose
# it, so the launcher starts the job again on other ports (tf_embed_ops.distribute.launch).
EXIT_PORT_TAKEN = 3


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_BRACKETED = re.compile(r"\[([^\[\]]+)\]:([0-9]{1,5})")
_PLAIN = re.compile(r"([^:\[\]]+):([0-9]{1,5})")


def parse_address(address: str) -> tuple[str, int]:
    """Splits a task address into (host, port), strictly.

    Accepted: `host:port` with a DNS host name (RFC 1123 labels of letters, digits and inner hyphens, dot
    separated, at most 253 characters) or a dotted-quad IPv4 address; `[v6]:port` with an IPv6 address in
    brackets (a zone `%name` allowed). The port is 1-65535. Nothing else: no user info (`a@b`), no path, no
    whitespace, nothing after the port or the closing bracket, no unbracketed IPv6.

    Raises:
      ValueError: naming the address and what is wrong with it.
    """
    if not isinstance(address, str):
        raise ValueError(f"task address {address!r} must be a string 'host:port' or '[ipv6]:port'")
    bracketed, plain = _BRACKETED.fullmatch(address), _PLAIN.fullmatch(address)
    if bracketed:
        host, port = bracketed.groups()
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"task address {address!r}: {host!r} in brackets is not an IPv6 address") from None
    elif plain:
        host, port = plain.groups()
        if not _is_ipv4(host) and not _is_host_name(host):
            raise ValueError(
                f"task address {address!r}: {host!r} is neither an IPv4 address nor a host name (letters, digits, "
                f"'-' and '.')"
            )
    else:
        raise ValueError(f"task address {address!r} is not 'host:port' or '[ipv6]:port'")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"task address {address!r}: port {int(port)} is not in [1, 65535]")
    return host, int(port)


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _is_host_name(host: str) -> bool:
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def task_address(tf_config: dict) -> str:
    """The `host:port` that `tf_config`'s own task serves on (its entry in the cluster).

    Raises:
      ValueError: if the cluster has no such job or index, or the TF_CONFIG is malformed.
    """
    check_tf_config(tf_config)
    cluster, task = tf_config.get("cluster") or {}, tf_config.get("task") or {}
    job, index = task.get("type"), task.get("index", 0)
    addresses = cluster.get(job) or []
    if not 0 <= index < len(addresses):
        raise ValueError(f"TF_CONFIG cluster has no address for task {job!r} index {index}; cluster: {cluster!r}.")
    return addresses[index]


def check_tf_config(tf_config: Any) -> None:
    """Checks TF_CONFIG's structure: `{"cluster": {job: [address, ...]}, "task": {"type": job, "index": int}}`.

    Raises:
      ValueError: naming the field and the value.
    """
    if not isinstance(tf_config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object; got {type(tf_config).__name__}")
    cluster, task = tf_config.get("cluster"), tf_config.get("task")
    if cluster is not None:
        if not isinstance(cluster, dict):
            raise ValueError(f"TF_CONFIG 'cluster' must be an object {{job: [address, ...]}}; got {cluster!r}")
        for job, addresses in cluster.items():
            if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                raise ValueError(f"TF_CONFIG cluster job {job!r} must be a list of address strings; got {addresses!r}")
    if task is not None:
        if not isinstance(task, dict) or not isinstance(task.get("type"), str):
            raise ValueError(f"TF_CONFIG 'task' must be an object with a string 'type'; got {task!r}")
        index = task.get("index", 0)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(f"TF_CONFIG task 'index' must be an int >= 0; got {index!r}")


def parse_tf_config(raw: str) -> dict:
    """TF_CONFIG's JSON text, parsed and checked (`check_tf_config`).

    Raises:
      ValueError: the text is not JSON (naming the position), or not a TF_CONFIG.
    """
    try:
        tf_config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    check_tf_config(tf_config)
    return tf_config


def is_loopback_address(address: str) -> bool:
    """True when `address` (`host:port`, `[v6]:port`, parsed by `parse_address`) names this machine's loopback
    interface only.

    `localhost`, 127.0.0.0/8 and ::1 (also as ::ffff:127.x.y.z) are loopback; any other name or address
    (including 0.0.0.0) is not, since a host name could resolve to a public interface; nor is anything
    `parse_address` refuses.
    """
    try:
        host, _ = parse_address(address)
    except ValueError:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def check_task_address(tf_config: dict, *, trusted_network: bool) -> None:
    """Refuses a non-loopback task address unless the caller declared the network trusted.

    Raises:
      ValueError: naming the address and the flag, if the task's address is not loopback and `trusted_network`
        is False (or the cluster has no address for the task).
    """
    address = task_address(tf_config)
    parse_address(address)
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


def _port_taken(port: int) -> bool:
    """Whether another socket holds `port` on some interface (gRPC binds every interface for a task)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def main(argv: list | None = None) -> int:
    """Entry point: `python -m tf_embed_ops.distribute.server [--tf-config JSON] [--trusted-network]`.

    TF_CONFIG comes from `--tf-config`, else the environment.  Returns 2 (with a message on stderr) for a missing
    TF_CONFIG or a non-loopback address without `--trusted-network`, and EXIT_PORT_TAKEN when another process
    holds the task's port.
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
    try:  # before TensorFlow is imported: a refused address costs nothing
        tf_config = parse_tf_config(raw)
        check_task_address(tf_config, trusted_network=args.trusted_network)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import tensorflow as tf

    try:
        server = start_server(tf_config, trusted_network=args.trusted_network)
    except tf.errors.UnknownError:
        address = task_address(tf_config)
        if not _port_taken(parse_address(address)[1]):
            raise
        print(f"error: task address {address}: another process holds its port", file=sys.stderr)
        return EXIT_PORT_TAKEN
    print(f"tf_embed_ops server started: {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
