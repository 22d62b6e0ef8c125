"""TFRA's restrict policies as tf_embed_ops eviction policies.

`de.TimestampRestrictPolicy` keeps the most recently trained rows (`te.dynamic.LRU`: recency in training steps,
where TFRA stamps wall-clock seconds), `de.FrequencyRestrictPolicy` the most often seen ones (`te.dynamic.LFU`).
`Variable.restrict(num_reserved, trigger)` applies them on demand, as TFRA does.
"""

from __future__ import annotations

from typing import Any

from tf_embed_ops.dynamic import config as dynamic_config

__all__ = ["FrequencyRestrictPolicy", "RestrictPolicy", "TimestampRestrictPolicy", "check_policy"]


class RestrictPolicy:
    """Base of the restrict policies: `eviction(num_reserved)` is the tf_embed_ops policy that keeps that many."""

    def __init__(self, var: Any = None):
        self.var = var

    @classmethod
    def eviction(cls, num_reserved: int) -> Any:
        raise NotImplementedError


class TimestampRestrictPolicy(RestrictPolicy):
    """Keeps the `num_reserved` most recently trained (or inserted) rows."""

    @classmethod
    def eviction(cls, num_reserved: int) -> Any:
        return dynamic_config.LRU(num_reserved)


class FrequencyRestrictPolicy(RestrictPolicy):
    """Keeps the `num_reserved` most frequently seen rows."""

    @classmethod
    def eviction(cls, num_reserved: int) -> Any:
        return dynamic_config.LFU(num_reserved)


def check_policy(owner: str, policy: Any) -> Any:
    """The policy class of `restrict_policy=` (a class, or an instance of one), or None.

    Raises:
      ValueError: anything else, naming the variable.
    """
    if policy is None:
        return None
    cls = policy if isinstance(policy, type) else type(policy)
    if not issubclass(cls, RestrictPolicy) or cls is RestrictPolicy:
        raise ValueError(
            f"de.Variable {owner!r}: restrict_policy must be de.TimestampRestrictPolicy or "
            f"de.FrequencyRestrictPolicy; got {policy!r}."
        )
    return cls
