"""One lookup and one update across a list of table groups (`protocol.TableGroup`), in feature order.

The front ends call these with their groups and never ask a group's kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import _xla

__all__ = ["lookup", "probe", "refuse_under_xla", "send", "xla_refusals"]


def _take(items: Sequence[Any], positions: Sequence[int]) -> list:
    return [items[i] for i in positions]


def lookup(groups: Sequence[Any], inputs: list, training: bool) -> list:
    """Activations of every feature, in feature order: each group looks up its own features (`inputs`: every
    feature's normalised input)."""
    out: list[Any] = [None] * len(inputs)
    for group in groups:
        for i, act in zip(group.positions, group.lookup(_take(inputs, group.positions), training), strict=True):
            out[i] = act
    return out


def send(groups: Sequence[Any], gradients: list, inputs: list, check_trainable: bool = True) -> list:
    """The fused updates of every group for one step (`gradients`, `inputs`: every feature's, feature order).

    Every group's trainability and learning rates are taken first; then the checks of every group but the first
    (`validate_send`, writing nothing) run before any group writes, and the first group's update validates its own
    inputs before its first write: a step any group rejects changes no table of any group.

    `check_trainable=False` skips the trainability checks, for a caller that declared its tables without an
    optimizer frozen (the Keras layers' `frozen_tables`): their configuration is SGD with learning rate 0, so the
    update leaves them as they are.

    Returns:
      Each group's result of `send_gradients` (what its `probe` takes), in group order.
    """
    for group in groups if check_trainable else ():
        group.check_trainable()
    learning_rates = [group.evaluate_learning_rates() for group in groups]
    checks = []
    for group, rates in zip(groups[1:], learning_rates[1:], strict=True):
        checks += group.validate_send(_take(gradients, group.positions), _take(inputs, group.positions), rates)
    if checks:
        with tf.control_dependencies(checks):
            gradients = [tf.identity(g) for g in gradients]
    return [
        group.send_gradients(_take(gradients, group.positions), _take(inputs, group.positions), rates)
        for group, rates in zip(groups, learning_rates, strict=True)
    ]


def probe(groups: Sequence[Any], sent: list) -> tf.Tensor:
    """A float32 scalar read after every group's update (`sent`: `send`'s answer; each group's `probe`): a data
    dependency on the whole update, for the Keras layers' trigger (`update_trigger`); zero when none reads."""
    probes = [p for p in (g.probe(s) for g, s in zip(groups, sent, strict=True)) if p is not None]
    return tf.add_n([tf.cast(p, tf.float32) for p in probes]) if probes else tf.zeros([], tf.float32)


def xla_refusals(groups: Sequence[Any]) -> list[str]:
    """Why some of `groups` cannot be looked up under XLA ([] when every group can)."""
    return [reason for reason in (group.xla_refusal() for group in groups) if reason is not None]


def refuse_under_xla(groups: Sequence[Any], who: str, advice: str) -> None:
    """Raises ValueError (`who`: the call; the groups' reasons, then `advice`) when running under XLA
    (`jit_compile=True`) and some of `groups` cannot be looked up there."""
    refusals = xla_refusals(groups) if _xla.in_xla_context() else []
    if refusals:
        raise ValueError(f"{who}: {'; '.join(refusals)}. {advice}")
