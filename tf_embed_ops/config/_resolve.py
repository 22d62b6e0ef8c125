"""The one place that decides how features become numbered tables: table order, table names, learning-rate tags.

TensorFlow's ``TPUEmbedding.__init__`` numbers tables by first appearance in ``tf.nest.flatten(feature_config)``
(compared by identity: ``TableConfig`` has no ``__eq__``), names an unnamed table ``table_{i}``, and gives each
distinct learning-rate callable (compared with ``==``, in table order) a dynamic tag, its index.  Every front end
(``tf_embed_ops.config.from_feature_config``, ``tf_embed_ops.TPUEmbedding`` and the Keras layers built on it)
resolves a feature config here, so they number and name alike; ``to_feature_config`` uses
:func:`first_appearance` to tell whether a config was numbered this way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def _in(a: Any, b: Any) -> bool:
    # What Python's `in` compares with (TensorFlow collects the learning-rate callables with `not in`).
    return a is b or a == b


def first_appearance(items: Iterable[T], same: Callable[[T, T], bool] = _in) -> list[T]:
    """The distinct ``items`` in order of first appearance, ``same`` deciding what is a repeat."""
    out: list[T] = []
    for item in items:
        if not any(same(item, seen) for seen in out):
            out.append(item)
    return out


@dataclasses.dataclass(frozen=True)
class ResolvedTables:
    """The tables of a feature config as TensorFlow numbers them.

    Attributes:
      tables: the ``TableConfig`` objects; index = table id.
      names: each table's name (its own, or ``table_{i}``).
      optimizers: each table's optimizer (its own, else the global one; None when neither is given).
      learning_rates: the dynamic learning-rate callables; index = tag.
    """

    tables: tuple[Any, ...]
    names: tuple[str, ...]
    optimizers: tuple[Any, ...]
    learning_rates: tuple[Callable[[], Any], ...]
    _ids: dict[int, int] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._ids.update({id(t): i for i, t in enumerate(self.tables)})

    def table_id(self, table: Any) -> int:
        """The id of ``table`` (by identity: it must be one of ``tables``)."""
        return self._ids[id(table)]

    def tag(self, table_id: int) -> int | None:
        """The dynamic learning-rate tag of table ``table_id``, or None when its learning rate is a constant."""
        lr = getattr(self.optimizers[table_id], "learning_rate", None)
        if not callable(lr):
            return None
        return next(i for i, r in enumerate(self.learning_rates) if _in(r, lr))


def resolve_tables(features: Sequence[Any], optimizer: Any = None) -> ResolvedTables:
    """Numbers, names and tags the tables of ``features`` (``tf.nest.flatten(feature_config)``).

    Args:
      features: the flattened ``FeatureConfig`` objects, in order.
      optimizer: the global optimizer, for tables whose ``TableConfig.optimizer`` is None (may be None).

    Raises:
      ValueError: two tables have the same name.
    """
    tables = first_appearance((f.table for f in features), lambda a, b: a is b)
    names: list[str] = []
    for i, table in enumerate(tables):
        name = table.name if table.name is not None else f"table_{i}"
        if name in names:
            raise ValueError(f"Tables must have a unique name. Multiple tables with name {name} found.")
        names.append(name)
    optimizers = tuple(t.optimizer if t.optimizer is not None else optimizer for t in tables)
    # getattr: an unsupported optimizer object is the caller's to report, not an AttributeError here.
    rates = (getattr(o, "learning_rate", None) for o in optimizers)
    return ResolvedTables(
        tables=tuple(tables),
        names=tuple(names),
        optimizers=optimizers,
        learning_rates=tuple(first_appearance(r for r in rates if callable(r))),
    )
