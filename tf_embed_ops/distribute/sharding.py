"""DIV row sharding of embedding tables: which rows live on which shard (the TPU's DIV_DEFAULT layout).

A table of V rows split over N shards keeps contiguous row ranges; shard i holds ``V // N + (i < V % N)`` rows,
so the first ``V mod N`` shards are one row larger (TensorFlow's ``make_sharded_variable_creator``).
A table never gets an empty shard: one with fewer rows than parameter servers is split over ``V`` shards only
(the TPU pads the vocabulary instead, which would change the checkpoint shape; we keep the full [V, dim]).

Example:
    >>> div_shard_sizes(10, 3)
    [4, 3, 3]
    >>> div_shard_boundaries(10, 3)
    [0, 4, 7, 10]
"""

from __future__ import annotations

__all__ = ["div_shard_boundaries", "div_shard_sizes", "num_table_shards"]


def _check(vocabulary_size: int, num_shards: int) -> None:
    if not isinstance(vocabulary_size, int) or isinstance(vocabulary_size, bool) or vocabulary_size < 1:
        raise ValueError(f"Argument `vocabulary_size` must be an int >= 1; got {vocabulary_size!r}.")
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ValueError(f"Argument `num_shards` must be an int >= 1; got {num_shards!r}.")
    if num_shards > vocabulary_size:
        raise ValueError(
            f"Argument `num_shards` ({num_shards}) must not exceed `vocabulary_size` ({vocabulary_size}): every "
            "shard needs at least one row (use num_table_shards to pick the count)."
        )


def num_table_shards(vocabulary_size: int, num_parameter_servers: int) -> int:
    """How many shards a table of `vocabulary_size` rows gets on `num_parameter_servers` servers.

    Args:
      vocabulary_size: rows of the table (>= 1).
      num_parameter_servers: servers available (>= 1).

    Returns:
      ``min(vocabulary_size, num_parameter_servers)``: one shard per server, never an empty one.

    Raises:
      ValueError: if an argument is not an int >= 1.
    """
    if not isinstance(num_parameter_servers, int) or num_parameter_servers < 1:
        raise ValueError(f"Argument `num_parameter_servers` must be an int >= 1; got {num_parameter_servers!r}.")
    _check(vocabulary_size, 1)
    return min(vocabulary_size, num_parameter_servers)


def div_shard_sizes(vocabulary_size: int, num_shards: int) -> list[int]:
    """Rows per shard under DIV sharding: the first ``vocabulary_size % num_shards`` shards get one extra.

    Args:
      vocabulary_size: rows of the table (>= 1).
      num_shards: number of shards, 1 <= num_shards <= vocabulary_size.

    Returns:
      A list of `num_shards` positive ints summing to `vocabulary_size`.

    Raises:
      ValueError: if an argument is out of range.
    """
    _check(vocabulary_size, num_shards)
    base, extra = divmod(vocabulary_size, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


def div_shard_boundaries(vocabulary_size: int, num_shards: int) -> list[int]:
    """First row of every shard, plus `vocabulary_size`: shard i holds rows [b[i], b[i + 1]).

    Args:
      vocabulary_size: rows of the table (>= 1).
      num_shards: number of shards, 1 <= num_shards <= vocabulary_size.

    Returns:
      A list of ``num_shards + 1`` ascending ints from 0 to `vocabulary_size`.

    Raises:
      ValueError: if an argument is out of range.
    """
    boundaries = [0]
    for size in div_shard_sizes(vocabulary_size, num_shards):
        boundaries.append(boundaries[-1] + size)
    return boundaries
