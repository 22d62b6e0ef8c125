"""An embedding's features split into table groups, one per kind of table (`backends.protocol.TableGroup`).

Each kind beside the in-memory one claims its features (`kind.of(flat_features, check_numerics)`: its group, or
None); the features no kind claims form the in-memory group, which comes first (its update validates before it
writes and has no check-only form, `backends.walk.send`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from tf_embed_ops import config as config_lib
from tf_embed_ops.backends import protocol

__all__ = ["Groups", "make_groups", "of_class"]


class Groups(NamedTuple):
    """`make_groups`' answer."""

    groups: tuple  # the groups, the in-memory one first (absent when no feature is left to it)
    tables: list  # the in-memory tables, in table order
    learning_rates: list  # their learning-rate callables, in tag order


def make_groups(
    owner: Any,
    flat_features: list,
    tables: list,
    backends: Sequence[type],
    in_memory_group: type,
    check_numerics: bool,
) -> Groups:
    """The groups of `flat_features` (`tables`: every table, in table order; `owner`: the embedding the in-memory
    group's variables belong to).

    Raises:
      ValueError: a kind of `backends` refuses a table (naming it).
    """
    others = [g for g in (kind.of(flat_features, check_numerics) for kind in backends) if g is not None]
    claimed = protocol.claimed_positions(others)
    static = [i for i in range(len(flat_features)) if i not in claimed]
    owned = {t.name for g in others for t in g.table_configs}
    static_features = [flat_features[i] for i in static]
    # One entry per distinct learning-rate callable, in table order: index = the dynamic-learning-rate tag. Resolved
    # again from the tables as they now stand (Keras optimizers converted, the global one written in), exactly as
    # `from_feature_config` will resolve them for the config proto.
    rates = list(config_lib.resolve_tables(static_features).learning_rates)
    mine = [in_memory_group(owner, static, static_features)] if static else []
    # A tuple of plain objects: attribute tracking leaves it alone (no node in the checkpoint's object graph).
    return Groups(tuple(mine + others), [t for t in tables if t.name not in owned], rates)


def of_class(groups: Sequence[Any], cls: type) -> Any:
    """The group of `groups` that is a `cls` (a kind's class, or its sharded subclass), or None: what a front end's
    accessors of one kind's tables ask (`TPUEmbedding.dynamic_tables`), never the kind's name."""
    return next((g for g in groups if isinstance(g, cls)), None)
