"""Where a row lives in a collective job: mod sharding, as `TPUEmbeddingV2` lays rows out across chips.

Row `r` of a static table lives on worker `r % N` at local row `r // N`; worker `w` therefore holds
`ceil((V - w) / N)` rows: the rows `w, w + N, w + 2N, ...` of the full table, in order. A dynamic table's key lives
on worker `tf_embed_ops.dynamic.sharding.shard_of_keys(key, N)`.

Example:
    >>> shard_rows(10, 4, 1)   # rows 1, 5, 9
    3
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_num_workers", "shard_rows", "shard_slice"]


def check_num_workers(num_workers: int, worker: int | None = None) -> None:
    """Raises ValueError unless `num_workers` is an int >= 1 and `worker` (if given) is in [0, num_workers)."""
    if not isinstance(num_workers, (int, np.integer)) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(f"Argument `num_workers` must be an int >= 1; got {num_workers!r}.")
    if worker is not None and (not isinstance(worker, (int, np.integer)) or not 0 <= worker < num_workers):
        raise ValueError(f"Argument `worker` must be an int in [0, {num_workers}); got {worker!r}.")


def shard_rows(vocabulary_size: int, num_workers: int, worker: int) -> int:
    """The number of rows worker `worker` of `num_workers` holds of a table of `vocabulary_size` rows."""
    check_num_workers(num_workers, worker)
    return max(0, (int(vocabulary_size) - int(worker) + int(num_workers) - 1) // int(num_workers))


def shard_slice(num_workers: int, worker: int) -> slice:
    """The full table's rows worker `worker` holds, as a slice: `full[shard_slice(N, w)]` is its shard."""
    check_num_workers(num_workers, worker)
    return slice(int(worker), None, int(num_workers))
