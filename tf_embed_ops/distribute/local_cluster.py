"""An in-process localhost cluster for tests, examples and benchmarks (as TensorFlow's own multi-worker tests).

`create_local_cluster` starts `num_workers` worker and `num_ps` parameter-server gRPC servers inside this
process (TensorFlow's `multi_worker_test_base.create_in_process_cluster` does the same; it needs the
`portpicker` package, this does not) and returns a `ParameterServerStrategy` whose coordinator is this process.
The servers share this process's op registry, so tf_embed_ops' kernels are available on every task.

Every task gets a `localhost` address, so the tasks dial each other over loopback only.  TensorFlow's server
still listens on all interfaces for its port (it binds `0.0.0.0` whatever host the cluster names), and it is
unauthenticated: on a machine reachable from untrusted networks, firewall the ports (docs/distributed.md,
"Security").

In-process servers cannot be shut down: they live until the process exits.  A second call starts a second,
independent cluster on fresh ports (this process's eager context then points at the new one).

Example:
    >>> strategy = create_local_cluster(num_workers=2, num_ps=2)
    >>> coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
"""

from __future__ import annotations

import random
import socket

import tensorflow as tf

__all__ = ["create_local_cluster", "free_port"]


_taken_ports: set = set()


def free_port() -> int:
    """A localhost port that is free now, below the usual ephemeral range and never handed out twice here.

    A port the kernel picks for `bind(0)` comes from the ephemeral range, where the cluster's own outgoing gRPC
    connections also take their local ports: a task that binds its port a few seconds later (a process still
    importing TensorFlow) can then find it taken.  So probe random ports in [20000, 32000) instead.
    """
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(20000, 32000)
        if port in _taken_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("localhost", port))
            except OSError:
                continue
        _taken_ports.add(port)
        return port
    raise RuntimeError("no free localhost port found in [20000, 32000)")


_free_port = free_port  # the name the cluster tests use


def create_local_cluster(num_workers: int = 2, num_ps: int = 2, *, variable_partitioner=None):
    """Starts an in-process cluster on localhost and returns a `ParameterServerStrategy` for it.

    Args:
      num_workers: worker tasks to start (>= 1).
      num_ps: parameter-server tasks to start (>= 1).
      variable_partitioner: passed to the strategy (tf_embed_ops' sharded tables do not use it).

    Returns:
      A `tf.distribute.experimental.ParameterServerStrategy` whose chief (coordinator) is this process.

    Raises:
      ValueError: if a count is not an int >= 1.
    """
    for name, value in (("num_workers", num_workers), ("num_ps", num_ps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"Argument `{name}` must be an int >= 1; got {value!r}.")
    cluster = {
        "worker": [f"localhost:{free_port()}" for _ in range(num_workers)],
        "ps": [f"localhost:{free_port()}" for _ in range(num_ps)],
        "chief": [f"localhost:{free_port()}"],
    }
    cluster_spec = tf.train.ClusterSpec(cluster)

    # Workers need at least num_workers + 1 inter-op threads or closures can deadlock (TensorFlow b/172296720,
    # the same setting its in-process clusters use).
    worker_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=num_workers + 1)
    ps_config = tf.compat.v1.ConfigProto()
    for i in range(num_workers):
        tf.distribute.Server(cluster_spec, job_name="worker", task_index=i, config=worker_config, protocol="grpc")
    for i in range(num_ps):
        tf.distribute.Server(cluster_spec, job_name="ps", task_index=i, config=ps_config, protocol="grpc")

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec, rpc_layer="grpc", task_type="chief", task_id=0
    )
    return tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=variable_partitioner)
