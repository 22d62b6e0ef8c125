"""The admission and eviction policies of dynamic-vocabulary tables, and the dynamic tables' limits.

Admission (`FrequencyAdmission`, `BloomAdmission`) decides when a new key gets a row; eviction (`LRU`, `LFU`, `TTL`,
`L2Norm`, `DecayedLFU`, `CountAndAge`, `Score`) which rows go at the end of a training step. Each validates its
arguments at construction (errors name the policy, the argument and the value) and gives the attributes of the
`TfEmbed>DynamicTableHandle` op (`attrs`) and its JSON-able arguments (`get_config`). `DynamicTableConfig`
(`tf_embed_ops.dynamic.config`) takes them.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

__all__ = [
    "LFU",
    "LRU",
    "TTL",
    "BloomAdmission",
    "CountAndAge",
    "DecayedLFU",
    "EvictionPolicy",
    "FrequencyAdmission",
    "L2Norm",
    "NO_EVICTION",
    "RowBound",
    "Score",
    "check_bool",
    "check_count",
    "check_float",
    "is_int",
]

MAX_ROWS_LIMIT = 2**31 - 1
MAX_DIM = 2**20
DEFAULT_INITIAL_CAPACITY = 1024
DEFAULT_MAX_PENDING_KEYS = 1 << 20
DEFAULT_EVICTION_LOG_CAPACITY = 1 << 20
MAX_EVICTION_LOG_CAPACITY = 1 << 32
MAX_BLOOM_COUNTERS = 1 << 34
MAX_BLOOM_HASHES = 16
_INITIALIZER_KINDS = ("zeros", "constant", "uniform", "normal", "truncated_normal")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(owner: str, argument: str, value: Any, minimum: int, maximum: int = 2**63 - 1) -> int:
    if not is_int(value) or not minimum <= value <= maximum:
        upper = "" if maximum == 2**63 - 1 else f" and <= {maximum}"
        raise ValueError(f"{owner}: `{argument}` must be an int >= {minimum}{upper}; got {value!r}.")
    return value


class _Fields:
    """A policy whose `repr` and configuration are its constructor's arguments (`_FIELDS`, in its order)."""

    _FIELDS: tuple[str, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {field: getattr(self, field) for field in self._FIELDS}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self._fields().items())})"


class _Admission(_Fields):
    """What both admissions share: the handle op's attributes and `get_config` (with the "kind"
    `from_config_dict` reads)."""

    _KIND = ""

    def _attrs(self, max_pending_keys: int = 0, pending_ttl_steps: int = 0, bloom: tuple = (0, 0, 8)) -> dict:
        return {
            "admission_min_count": self.min_count,
            "max_pending_keys": max_pending_keys,
            "pending_ttl_steps": pending_ttl_steps,
            "bloom_num_counters": bloom[0],
            "bloom_num_hashes": bloom[1],
            "bloom_counter_bits": bloom[2],
            "log_refused": self.log_refused,
        }

    def get_config(self) -> dict[str, Any]:
        return {"kind": self._KIND, **self._fields()}


class FrequencyAdmission(_Admission):
    """Admission by frequency: a key gets a row once it has been seen `min_count` times.

    Counts are exact (one counter per key without a row), bounded by `max_pending_keys`; a key that finds the
    counters full is not counted (reported as `untracked`). With `pending_ttl_steps > 0` a counter whose key has
    not been seen for more than that many steps is dropped at a step boundary.

    Args:
      min_count: sightings before a key gets a row (>= 1; 1 admits every key on first sight).
      max_pending_keys: at most this many keys counted at once (>= 1).
      pending_ttl_steps: drop counters unseen for more than this many steps; 0 keeps them.
      log_refused: also report every key a training lookup gives no row in `DynamicTable.evicted_keys(
        include_refused=True)`.

    Raises:
      ValueError: for a value out of range (naming the argument and the value).
    """

    _KIND = "frequency"
    _FIELDS = ("min_count", "max_pending_keys", "pending_ttl_steps", "log_refused")

    def __init__(
        self,
        min_count: int,
        max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS,
        pending_ttl_steps: int = 0,
        log_refused: bool = False,
    ):
        self.min_count = check_count("FrequencyAdmission", "min_count", min_count, 1, 2**32 - 1)
        self.max_pending_keys = check_count(
            "FrequencyAdmission", "max_pending_keys", max_pending_keys, 1, MAX_ROWS_LIMIT
        )
        self.pending_ttl_steps = check_count("FrequencyAdmission", "pending_ttl_steps", pending_ttl_steps, 0)
        self.log_refused = check_bool("FrequencyAdmission", "log_refused", log_refused)

    def attrs(self) -> dict[str, Any]:
        """The admission's attributes of the handle op."""
        counting = self.min_count > 1  # the core wants no counters when every key is admitted on first sight
        return self._attrs(self.max_pending_keys if counting else 0, self.pending_ttl_steps if counting else 0)


class BloomAdmission(_Admission):
    """Admission through a counting Bloom filter: bounded memory however many distinct ids arrive.

    Every sighting of a key without a row adds to `num_hashes` of `num_counters` saturating counters of
    `counter_bits` bits; the key gets a row when the minimum of its counters reaches `min_count` (count-min). The
    filter takes `num_counters * counter_bits / 8` bytes per table (per shard when sharded), fixed at creation.

    The estimate never undercounts, so a key seen `min_count` times is always admitted. A key seen `c <
    min_count` times is admitted by mistake when each of its counters received `min_count - c` sightings of other
    keys; with `S` sightings in all over the filter's life, each counter holds about Poisson(lambda = num_hashes
    * S / num_counters) of them, so the false-admission rate of a one-off key is about
    `P(Poisson(lambda) >= min_count - 1) ** num_hashes` (docs/dynamic_lifecycle.md has the measured figures).
    Counters are never decayed or cleared: size the filter for the stream the table sees between restarts.

    Args:
      min_count: sightings before a key gets a row (>= 1, < 2**counter_bits).
      num_counters: counters in the filter (>= 1).
      num_hashes: counters per key (1 to 16).
      counter_bits: bits per counter: 4, 8 or 16 (counters saturate at 2**bits - 1).
      log_refused: also report every key a training lookup gives no row in `DynamicTable.evicted_keys(
        include_refused=True)`.

    Raises:
      ValueError: for a value out of range (naming the argument and the value).

    Example:
      >>> admission = te.dynamic.BloomAdmission(min_count=3, num_counters=1 << 24, num_hashes=3, counter_bits=4)
    """

    _KIND = "bloom"
    _FIELDS = ("min_count", "num_counters", "num_hashes", "counter_bits", "log_refused")

    def __init__(
        self,
        min_count: int,
        num_counters: int,
        num_hashes: int = 3,
        counter_bits: int = 8,
        log_refused: bool = False,
    ):
        self.counter_bits = check_count("BloomAdmission", "counter_bits", counter_bits, 4, 16)
        if counter_bits not in (4, 8, 16):
            raise ValueError(f"BloomAdmission: `counter_bits` must be 4, 8 or 16; got {counter_bits!r}.")
        self.min_count = check_count("BloomAdmission", "min_count", min_count, 1, 2**counter_bits - 1)
        self.num_counters = check_count("BloomAdmission", "num_counters", num_counters, 1, MAX_BLOOM_COUNTERS)
        self.num_hashes = check_count("BloomAdmission", "num_hashes", num_hashes, 1, MAX_BLOOM_HASHES)
        self.log_refused = check_bool("BloomAdmission", "log_refused", log_refused)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the filter (per table, or per shard of a sharded table)."""
        return (self.num_counters * self.counter_bits + 7) // 8

    def attrs(self) -> dict[str, Any]:
        """The admission's attributes of the handle op."""
        return self._attrs(bloom=(self.num_counters, self.num_hashes, self.counter_bits))


def check_bool(owner: str, argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: `{argument}` must be a bool; got {value!r}.")
    return value


def check_float(owner: str, argument: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low < value if low_open else low <= value) and value <= high
    if not ok:
        bound = f"in ({low}, {high}]" if low_open else (f">= {low}" if high == math.inf else f"in [{low}, {high}]")
        raise ValueError(f"{owner}: `{argument}` must be a finite number {bound}; got {value!r}.")
    return float(value)


NO_EVICTION = {
    "eviction": "none",
    "eviction_max_rows": 0,
    "eviction_ttl_steps": 0,
    "eviction_min_norm": 0.0,
    "eviction_decay": 1.0,
    "eviction_min_count": 0,
}


class EvictionPolicy(_Fields):
    """An eviction policy, applied at the end of every training step (and by an explicit `evict()`)."""

    kind = "none"

    def attrs(self) -> dict[str, Any]:
        """The policy's attributes of the handle op (and of the explicit-evict op)."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """JSON-able arguments (the Keras layer's get_config); `from_config_dict` rebuilds the policy."""
        return self._fields()


class RowBound(EvictionPolicy):
    _FIELDS = ("max_rows",)

    def __init__(self, max_rows: int):
        self.max_rows = check_count(type(self).__name__, "max_rows", max_rows, 1, MAX_ROWS_LIMIT)

    def attrs(self) -> dict[str, Any]:
        return {**NO_EVICTION, "eviction": self.kind, "eviction_max_rows": self.max_rows}


class LRU(RowBound):
    """Least recently used: at a step boundary, evicts the rows seen longest ago until `max_rows` remain (ties:
    smaller key first)."""

    kind = "lru"


class LFU(RowBound):
    """Least frequently used: at a step boundary, evicts the rows with the lowest count until `max_rows` remain
    (ties: older last step first, then smaller key)."""

    kind = "lfu"


class TTL(EvictionPolicy):
    """Time to live: at a step boundary, evicts every row not seen for more than `steps` steps."""

    kind = "ttl"
    _FIELDS = ("steps",)

    def __init__(self, steps: int):
        self.steps = check_count("TTL", "steps", steps, 1)

    def attrs(self) -> dict[str, Any]:
        return {**NO_EVICTION, "eviction": self.kind, "eviction_ttl_steps": self.steps}


class L2Norm(EvictionPolicy):
    """Evicts, at a step boundary, every row whose weights' L2 norm is below `min_norm` (rows the optimizer has
    driven to near zero carry no signal).

    The norm is computed in float64 from the float32 weights, and compared with `min_norm` as a float32 (the op
    attribute's type): a row goes when `sqrt(sum(w**2)) < float32(min_norm)`.

    Args:
      min_norm: the threshold (finite, >= 0; 0 evicts nothing).

    Raises:
      ValueError: for a negative or non-finite `min_norm`.
    """

    kind = "l2_norm"
    _FIELDS = ("min_norm",)

    def __init__(self, min_norm: float):
        self.min_norm = check_float("L2Norm", "min_norm", min_norm, 0.0, math.inf)

    def attrs(self) -> dict[str, Any]:
        return {**NO_EVICTION, "eviction": self.kind, "eviction_min_norm": self.min_norm}


class DecayedLFU(RowBound):
    """Least frequently used with decayed counts: recent sightings weigh more than old ones.

    Per eviction round (the end of every training step): each row's decayed count is multiplied by `decay` and
    the row's sightings since the previous round are added (in float64, stored as float32); then the rows with the
    lowest decayed counts are evicted until `max_rows` remain (ties: older last step, then smaller key). A new row
    starts at 0 and receives its sightings at its first round. `decay = 1` is LFU over the rows' lifetimes. The
    decayed counts are checkpointed (`decayed_keys` / `decayed_counts` tensors). `decay` travels as a float32.

    Args:
      max_rows: rows kept after each round (1 to the table's max_rows).
      decay: the factor per round, in (0, 1].

    Raises:
      ValueError: for `max_rows` out of range or `decay` outside (0, 1].
    """

    kind = "decayed_lfu"
    _FIELDS = ("max_rows", "decay")

    def __init__(self, max_rows: int, decay: float):
        super().__init__(max_rows)
        self.decay = check_float("DecayedLFU", "decay", decay, 0.0, 1.0, low_open=True)

    def attrs(self) -> dict[str, Any]:
        return {**super().attrs(), "eviction_decay": self.decay}


class CountAndAge(EvictionPolicy):
    """Evicts, at a step boundary, every row that is both rare and stale: count < `min_count` and not seen for more
    than `max_age_steps` steps (`step - last_step > max_age_steps`). Frequent rows stay however old; a new row
    has `max_age_steps` steps to reach `min_count`.

    Args:
      min_count: the count a row needs to stay once it is stale (>= 1).
      max_age_steps: steps a row may go unseen before its count is checked (>= 0).

    Raises:
      ValueError: for a value out of range.
    """

    kind = "count_and_age"
    _FIELDS = ("min_count", "max_age_steps")

    def __init__(self, min_count: int, max_age_steps: int):
        self.min_count = check_count("CountAndAge", "min_count", min_count, 1, 2**32 - 1)
        self.max_age_steps = check_count("CountAndAge", "max_age_steps", max_age_steps, 0)

    def attrs(self) -> dict[str, Any]:
        return {
            **NO_EVICTION,
            "eviction": self.kind,
            "eviction_min_count": self.min_count,
            "eviction_ttl_steps": self.max_age_steps,
        }


class Score(EvictionPolicy):
    """A user score: keeps the `max_rows` rows of highest score, evicting the rest, at every step boundary.

    `fn(count, last_step, norm, step)` gets four float32 tensors of shape [n], the statistics of all n rows of the
    table (or shard) at once (`step` is the current step, broadcast), and returns one float32 score per row, [n].
    It is called once per eviction round (a TensorFlow function over the whole table, never once per row). Rows
    with the lowest scores go first; ties: older last step, then smaller key. Scores must be finite.

    `fn` is either a Python callable of TensorFlow ops, or a string expression over `count`, `last_step`, `norm`,
    `step` with numbers, `+ - * / **`, unary minus and the functions `log`, `log1p`, `exp`, `sqrt`, `abs`,
    `minimum`, `maximum` (parsed, never `eval`ed; each function takes exactly its arguments: one, or two for
    `minimum` and `maximum`). An expression is at most `MAX_SCORE_EXPRESSION_CHARS` (1,000) characters and
    `MAX_SCORE_EXPRESSION_DEPTH` (64) operations deep (a sum of n terms is n - 1 deep). Only an expression is
    serializable: a layer's `get_config` (and `model.save`) stores it, while a callable is refused there with an
    error naming the table; checkpoints hold no part of the policy, so a callable works with them.

    Args:
      fn: the score, a callable or an expression string.
      max_rows: rows kept after each round (>= 0; per shard in a sharded table, as LRU's).

    Raises:
      ValueError: for a `fn` that is neither, an expression with anything else, a function given the wrong number
        of arguments, an expression longer or deeper than the limits (the message names the limit), or `max_rows`
        out of range.

    Example:
      >>> te.dynamic.Score("log1p(count) - 0.1 * (step - last_step)", max_rows=10**6)
    """

    kind = "score"

    def __init__(self, fn: Any, max_rows: int):
        if isinstance(fn, str):
            self.expression = fn
            self.fn = _parse_score_expression(fn)
        elif callable(fn):
            self.expression = None
            self.fn = fn
        else:
            raise ValueError(f"Score: `fn` must be a callable or an expression string; got {fn!r}.")
        self.max_rows = check_count("Score", "max_rows", max_rows, 0, MAX_ROWS_LIMIT)

    def attrs(self) -> dict[str, Any]:
        # The core does not evict by itself: the engine runs the score's round after each update.
        return dict(NO_EVICTION)

    def get_config(self) -> dict[str, Any]:
        if self.expression is None:
            raise ValueError(
                "te.dynamic.Score: a score given as a Python callable cannot be saved in a config; give the score "
                "as an expression string (e.g. Score('log1p(count) - 0.1 * (step - last_step)', max_rows)) or "
                "rebuild the layer with the callable."
            )
        return {"fn": self.expression, "max_rows": self.max_rows}

    def __repr__(self) -> str:
        fn = repr(self.expression) if self.expression is not None else getattr(self.fn, "__name__", repr(self.fn))
        return f"Score(fn={fn}, max_rows={self.max_rows})"


MAX_SCORE_EXPRESSION_CHARS = 1000
MAX_SCORE_EXPRESSION_DEPTH = 64
_SCORE_NAMES = ("count", "last_step", "norm", "step")
_SCORE_ARITY = {"log": 1, "log1p": 1, "exp": 1, "sqrt": 1, "abs": 1, "minimum": 2, "maximum": 2}
_SCORE_FUNCTIONS = {
    "log": tf.math.log,
    "log1p": tf.math.log1p,
    "exp": tf.math.exp,
    "sqrt": tf.math.sqrt,
    "abs": tf.math.abs,
    "minimum": tf.math.minimum,
    "maximum": tf.math.maximum,
}


def _parse_score_expression(text: str):
    """A score expression as a function of the four statistics (a whitelist over Python's AST; nothing is
    evaluated but these operations)."""
    import ast  # pylint: disable=import-outside-toplevel
    import operator  # pylint: disable=import-outside-toplevel

    binary = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.Pow: operator.pow}  # fmt: skip
    if len(text) > MAX_SCORE_EXPRESSION_CHARS:
        raise ValueError(
            f"Score: the expression has {len(text)} characters; at most MAX_SCORE_EXPRESSION_CHARS = "
            f"{MAX_SCORE_EXPRESSION_CHARS} are accepted (got {text[:40]!r}...)."
        )
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"Score: cannot parse the expression {text!r}: {e.msg}.") from None
    except (RecursionError, MemoryError):  # Python's parser gives up on deep nesting before our depth check
        raise ValueError(
            f"Score: the expression {text[:40]!r}... is nested too deeply to parse; at most "
            f"MAX_SCORE_EXPRESSION_DEPTH = {MAX_SCORE_EXPRESSION_DEPTH} operations deep are accepted."
        ) from None

    def check(node, depth=0):
        if depth > MAX_SCORE_EXPRESSION_DEPTH:
            raise ValueError(
                f"Score: the expression {text[:40]!r}... is more than MAX_SCORE_EXPRESSION_DEPTH = "
                f"{MAX_SCORE_EXPRESSION_DEPTH} operations deep (a sum of n terms is n - 1 deep)."
            )
        if isinstance(node, ast.Expression):
            return check(node.body, depth)
        if isinstance(node, ast.BinOp) and type(node.op) in binary:
            return check(node.left, depth + 1) and check(node.right, depth + 1)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return check(node.operand, depth + 1)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return True
        if isinstance(node, ast.Name) and node.id in _SCORE_NAMES:
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _SCORE_FUNCTIONS
            and not node.keywords
        ):
            arity = _SCORE_ARITY[node.func.id]
            if len(node.args) != arity:
                raise ValueError(
                    f"Score: in the expression {text!r}, {node.func.id}() takes {arity} argument"
                    f"{'s' if arity > 1 else ''}; got {len(node.args)}."
                )
            return all(check(a, depth + 1) for a in node.args)
        raise ValueError(
            f"Score: the expression {text!r} may use only {', '.join(_SCORE_NAMES)}, numbers, + - * / **, and "
            f"{', '.join(sorted(_SCORE_FUNCTIONS))}; got {ast.dump(node)[:60]}."
        )

    check(tree)

    def evaluate(node, env):
        if isinstance(node, ast.Expression):
            return evaluate(node.body, env)
        if isinstance(node, ast.BinOp):
            return binary[type(node.op)](evaluate(node.left, env), evaluate(node.right, env))
        if isinstance(node, ast.UnaryOp):
            value = evaluate(node.operand, env)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Constant):
            return tf.constant(float(node.value), tf.float32)
        if isinstance(node, ast.Name):
            return env[node.id]
        return _SCORE_FUNCTIONS[node.func.id](*[evaluate(a, env) for a in node.args])

    def fn(count, last_step, norm, step):
        env = dict(zip(_SCORE_NAMES, (count, last_step, norm, step), strict=True))
        return evaluate(tree, env) + tf.zeros_like(count)  # a constant expression still scores every row

    return fn
