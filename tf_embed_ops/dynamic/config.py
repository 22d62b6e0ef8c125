"""`DynamicTableConfig` and the admission and eviction policies of dynamic-vocabulary tables.

A `DynamicTableConfig` is a `tf.tpu.experimental.embedding.TableConfig` (a subclass, with `vocabulary_size =
max_rows`), so every API that takes a `TableConfig` takes it: `FeatureConfig(table=...)`, `te.TPUEmbedding`,
`te.keras.TPUEmbedding`, `te.distribute`. Everything is validated here, at construction, with errors that name the
table and the value; the ops validate again.

This module is the one place that maps a configuration to what the ops run: `handle_attrs` gives the attributes
of the `TfEmbed>DynamicTableHandle` op, `dynamic_config_proto` the `TPUEmbeddingConfiguration` of the lookup and
update ops (one table entry per dynamic table, `vocabulary_size = max_rows`, the table's optimizer).
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, low_precision
from tf_embed_ops.config import slot_shapes
from tf_embed_ops.dynamic.sharding import shard_of_keys  # re-exported: the table's reshard-on-restore uses it
from tf_embed_ops.tiered import config as tiered_config

__all__ = [
    "LFU",
    "LRU",
    "TTL",
    "BloomAdmission",
    "CountAndAge",
    "DecayedLFU",
    "DynamicTableConfig",
    "FrequencyAdmission",
    "L2Norm",
    "Score",
    "dynamic_config_proto",
    "from_config_dict",
    "handle_attrs",
    "is_dynamic",
    "to_config_dict",
    "shard_of_keys",
]

# The core's limits (cc/lib/dynamic_table.h validates them again): row indices are uint32 with one value reserved.
MAX_ROWS_LIMIT = 2**31 - 1
MAX_DIM = 2**20
DEFAULT_INITIAL_CAPACITY = 1024
DEFAULT_MAX_PENDING_KEYS = 1 << 20
DEFAULT_EVICTION_LOG_CAPACITY = 1 << 20
MAX_EVICTION_LOG_CAPACITY = 1 << 32
MAX_BLOOM_COUNTERS = 1 << 34
MAX_BLOOM_HASHES = 16
_INITIALIZER_KINDS = ("zeros", "constant", "uniform", "normal", "truncated_normal")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(owner: str, argument: str, value: Any, minimum: int, maximum: int = 2**63 - 1) -> int:
    if not _is_int(value) or not minimum <= value <= maximum:
        upper = "" if maximum == 2**63 - 1 else f" and <= {maximum}"
        raise ValueError(f"{owner}: `{argument}` must be an int >= {minimum}{upper}; got {value!r}.")
    return value


class FrequencyAdmission:
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

    def __init__(
        self,
        min_count: int,
        max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS,
        pending_ttl_steps: int = 0,
        log_refused: bool = False,
    ):
        self.min_count = _check_count("FrequencyAdmission", "min_count", min_count, 1, 2**32 - 1)
        self.max_pending_keys = _check_count(
            "FrequencyAdmission", "max_pending_keys", max_pending_keys, 1, MAX_ROWS_LIMIT
        )
        self.pending_ttl_steps = _check_count("FrequencyAdmission", "pending_ttl_steps", pending_ttl_steps, 0)
        self.log_refused = _check_bool("FrequencyAdmission", "log_refused", log_refused)

    def attrs(self) -> dict[str, Any]:
        """The admission's attributes of the handle op."""
        counting = self.min_count > 1  # the core wants no counters when every key is admitted on first sight
        return {
            "admission_min_count": self.min_count,
            "max_pending_keys": self.max_pending_keys if counting else 0,
            "pending_ttl_steps": self.pending_ttl_steps if counting else 0,
            "bloom_num_counters": 0,
            "bloom_num_hashes": 0,
            "bloom_counter_bits": 8,
            "log_refused": self.log_refused,
        }

    def get_config(self) -> dict[str, Any]:
        return {
            "kind": "frequency",
            "min_count": self.min_count,
            "max_pending_keys": self.max_pending_keys,
            "pending_ttl_steps": self.pending_ttl_steps,
            "log_refused": self.log_refused,
        }

    def __repr__(self) -> str:
        return (
            f"FrequencyAdmission(min_count={self.min_count}, max_pending_keys={self.max_pending_keys}, "
            f"pending_ttl_steps={self.pending_ttl_steps}, log_refused={self.log_refused})"
        )


class BloomAdmission:
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

    def __init__(
        self,
        min_count: int,
        num_counters: int,
        num_hashes: int = 3,
        counter_bits: int = 8,
        log_refused: bool = False,
    ):
        self.counter_bits = _check_count("BloomAdmission", "counter_bits", counter_bits, 4, 16)
        if counter_bits not in (4, 8, 16):
            raise ValueError(f"BloomAdmission: `counter_bits` must be 4, 8 or 16; got {counter_bits!r}.")
        self.min_count = _check_count("BloomAdmission", "min_count", min_count, 1, 2**counter_bits - 1)
        self.num_counters = _check_count("BloomAdmission", "num_counters", num_counters, 1, MAX_BLOOM_COUNTERS)
        self.num_hashes = _check_count("BloomAdmission", "num_hashes", num_hashes, 1, MAX_BLOOM_HASHES)
        self.log_refused = _check_bool("BloomAdmission", "log_refused", log_refused)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the filter (per table, or per shard of a sharded table)."""
        return (self.num_counters * self.counter_bits + 7) // 8

    def attrs(self) -> dict[str, Any]:
        """The admission's attributes of the handle op."""
        return {
            "admission_min_count": self.min_count,
            "max_pending_keys": 0,
            "pending_ttl_steps": 0,
            "bloom_num_counters": self.num_counters,
            "bloom_num_hashes": self.num_hashes,
            "bloom_counter_bits": self.counter_bits,
            "log_refused": self.log_refused,
        }

    def get_config(self) -> dict[str, Any]:
        return {
            "kind": "bloom",
            "min_count": self.min_count,
            "num_counters": self.num_counters,
            "num_hashes": self.num_hashes,
            "counter_bits": self.counter_bits,
            "log_refused": self.log_refused,
        }

    def __repr__(self) -> str:
        return (
            f"BloomAdmission(min_count={self.min_count}, num_counters={self.num_counters}, "
            f"num_hashes={self.num_hashes}, counter_bits={self.counter_bits}, log_refused={self.log_refused})"
        )


def _check_bool(owner: str, argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: `{argument}` must be a bool; got {value!r}.")
    return value


def _check_float(owner: str, argument: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low < value if low_open else low <= value) and value <= high
    if not ok:
        bound = f"in ({low}, {high}]" if low_open else (f">= {low}" if high == math.inf else f"in [{low}, {high}]")
        raise ValueError(f"{owner}: `{argument}` must be a finite number {bound}; got {value!r}.")
    return float(value)


_NO_EVICTION = {
    "eviction": "none",
    "eviction_max_rows": 0,
    "eviction_ttl_steps": 0,
    "eviction_min_norm": 0.0,
    "eviction_decay": 1.0,
    "eviction_min_count": 0,
}


class _Eviction:
    """An eviction policy, applied at the end of every training step (and by an explicit `evict()`)."""

    kind = "none"

    def attrs(self) -> dict[str, Any]:
        """The policy's attributes of the handle op (and of the explicit-evict op)."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """JSON-able arguments (the Keras layer's get_config); `from_config_dict` rebuilds the policy."""
        raise NotImplementedError


class _RowBound(_Eviction):
    def __init__(self, max_rows: int):
        self.max_rows = _check_count(type(self).__name__, "max_rows", max_rows, 1, MAX_ROWS_LIMIT)

    def attrs(self) -> dict[str, Any]:
        return {**_NO_EVICTION, "eviction": self.kind, "eviction_max_rows": self.max_rows}

    def get_config(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_rows={self.max_rows})"


class LRU(_RowBound):
    """Least recently used: at a step boundary, evicts the rows seen longest ago until `max_rows` remain (ties:
    smaller key first)."""

    kind = "lru"


class LFU(_RowBound):
    """Least frequently used: at a step boundary, evicts the rows with the lowest count until `max_rows` remain
    (ties: older last step first, then smaller key)."""

    kind = "lfu"


class TTL(_Eviction):
    """Time to live: at a step boundary, evicts every row not seen for more than `steps` steps."""

    kind = "ttl"

    def __init__(self, steps: int):
        self.steps = _check_count("TTL", "steps", steps, 1)

    def attrs(self) -> dict[str, Any]:
        return {**_NO_EVICTION, "eviction": self.kind, "eviction_ttl_steps": self.steps}

    def get_config(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def __repr__(self) -> str:
        return f"TTL(steps={self.steps})"


class L2Norm(_Eviction):
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

    def __init__(self, min_norm: float):
        self.min_norm = _check_float("L2Norm", "min_norm", min_norm, 0.0, math.inf)

    def attrs(self) -> dict[str, Any]:
        return {**_NO_EVICTION, "eviction": self.kind, "eviction_min_norm": self.min_norm}

    def get_config(self) -> dict[str, Any]:
        return {"min_norm": self.min_norm}

    def __repr__(self) -> str:
        return f"L2Norm(min_norm={self.min_norm})"


class DecayedLFU(_RowBound):
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

    def __init__(self, max_rows: int, decay: float):
        super().__init__(max_rows)
        self.decay = _check_float("DecayedLFU", "decay", decay, 0.0, 1.0, low_open=True)

    def attrs(self) -> dict[str, Any]:
        return {**super().attrs(), "eviction_decay": self.decay}

    def get_config(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows, "decay": self.decay}

    def __repr__(self) -> str:
        return f"DecayedLFU(max_rows={self.max_rows}, decay={self.decay})"


class CountAndAge(_Eviction):
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

    def __init__(self, min_count: int, max_age_steps: int):
        self.min_count = _check_count("CountAndAge", "min_count", min_count, 1, 2**32 - 1)
        self.max_age_steps = _check_count("CountAndAge", "max_age_steps", max_age_steps, 0)

    def attrs(self) -> dict[str, Any]:
        return {
            **_NO_EVICTION,
            "eviction": self.kind,
            "eviction_min_count": self.min_count,
            "eviction_ttl_steps": self.max_age_steps,
        }

    def get_config(self) -> dict[str, Any]:
        return {"min_count": self.min_count, "max_age_steps": self.max_age_steps}

    def __repr__(self) -> str:
        return f"CountAndAge(min_count={self.min_count}, max_age_steps={self.max_age_steps})"


class Score(_Eviction):
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
        self.max_rows = _check_count("Score", "max_rows", max_rows, 0, MAX_ROWS_LIMIT)

    def attrs(self) -> dict[str, Any]:
        # The core does not evict by itself: the engine runs the score's round after each update.
        return dict(_NO_EVICTION)

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


def _initializer_spec(initializer: Any, dim: int, table: str) -> tuple[str, list[float], int | None]:
    """(kind, params, the initializer's own seed or None) of a TensorFlow/Keras initializer object or name.

    Only the kinds the core computes from the key are accepted; anything else (a lambda, Glorot, ...) would need
    the shape of the whole table, which a growing table does not have.
    """
    if initializer is None:  # TableConfig's default
        return "truncated_normal", [0.0, 1.0 / math.sqrt(dim)], None
    if isinstance(initializer, str):
        name = initializer.lower()
        if name in ("zeros", "zero"):
            return "zeros", [], None
        if name in ("ones", "one"):
            return "constant", [1.0], None
        raise ValueError(
            f"DynamicTableConfig {table!r}: initializer {initializer!r} is not supported; use 'zeros', 'ones' or "
            "an initializer object of kind Zeros, Ones, Constant, RandomUniform, RandomNormal or TruncatedNormal."
        )
    kind = type(initializer).__name__
    get_config = getattr(initializer, "get_config", None)
    config = get_config() if callable(get_config) else None
    if config is not None:
        seed = config.get("seed")
        seed = seed if _is_int(seed) else None
        if kind in ("Zeros", "Zeros_v2", "ZerosInitializer"):
            return "zeros", [], None
        if kind in ("Ones", "Ones_v2", "OnesInitializer"):
            return "constant", [1.0], None
        if kind in ("Constant", "Constant_v2", "ConstantInitializer"):
            value = config.get("value")
            try:
                scalar = float(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f"DynamicTableConfig {table!r}: a Constant initializer of a dynamic table needs a scalar "
                    f"value; got {value!r}."
                ) from None
            return "constant", [scalar], None
        if kind in ("RandomUniform", "RandomUniform_v2"):
            return "uniform", [float(config["minval"]), float(config["maxval"])], seed
        if kind in ("RandomNormal", "RandomNormal_v2"):
            return "normal", [float(config["mean"]), float(config["stddev"])], seed
        if kind in ("TruncatedNormal", "TruncatedNormal_v2"):
            return "truncated_normal", [float(config["mean"]), float(config["stddev"])], seed
    raise ValueError(
        f"DynamicTableConfig {table!r}: initializer {initializer!r} ({kind}) is not supported by dynamic "
        "tables, whose rows are initialised from their key when they are created; use Zeros, Ones, Constant, "
        "RandomUniform, RandomNormal or TruncatedNormal (TensorFlow's or Keras')."
    )


def _check_initializer_params(table: str, kind: str, params: list[float]) -> None:
    if not all(math.isfinite(p) for p in params):
        raise ValueError(f"DynamicTableConfig {table!r}: initializer parameters must be finite; got {params}.")
    if kind == "uniform" and not params[0] <= params[1]:
        raise ValueError(f"DynamicTableConfig {table!r}: uniform initializer needs minval <= maxval; got {params}.")
    if kind in ("normal", "truncated_normal") and not params[1] >= 0:
        raise ValueError(f"DynamicTableConfig {table!r}: {kind} initializer needs stddev >= 0; got {params[1]}.")


def _slot_initial_values(optimizer: Any, table: str) -> list[float]:
    """One float per optimizer slot (Load/Retrieve order): a dynamic table's new row starts its slots there."""
    values = []
    for slot, init in zip(_tf_compat.slot_names(optimizer), _tf_compat.slot_initializers(optimizer), strict=True):
        config = init.get_config() if hasattr(init, "get_config") else {}
        value = config.get("value")
        try:
            values.append(float(value))
        except (TypeError, ValueError):
            raise ValueError(
                f"DynamicTableConfig {table!r}: slot {slot!r} of {type(optimizer).__name__} has initializer "
                f"{init!r}; a dynamic table needs constant slot initializers."
            ) from None
    return values


def _slot_widths(optimizer: Any, dim: int) -> list[int]:
    """Floats per row of each optimizer slot (Load/Retrieve order), from the optimizer schema: dim, or 1 for a
    per-row slot (row-wise Adagrad keeps one accumulator per row in a dynamic table too)."""
    return [width for _, width in slot_shapes(optimizer, 1, dim).values()]


class DynamicTableConfig(tf.tpu.experimental.embedding.TableConfig):
    """A dynamic-vocabulary embedding table: rows keyed by any int64 (or string) id, created as ids arrive.

    A subclass of `tf.tpu.experimental.embedding.TableConfig` with `vocabulary_size = max_rows`, so a
    `FeatureConfig` takes it as its table and the TPU configuration describes it as a table of `max_rows` rows.

    Args:
      name: the table's name (required: it names the table's resource and its checkpoint entries).
      dim: the embedding dimension (1 to 2^20).
      optimizer: the table's optimizer: any of `tf_embed_ops.optimizers` (TensorFlow's five included), with all
        its options; None takes the global optimizer of the `TPUEmbedding`. Its slots must start at a constant.
      combiner: "mean" (default), "sum" or "sqrtn", as `TableConfig`.
      initializer: how a new key's row starts: None (TableConfig's default, truncated normal with stddev
        1/sqrt(dim)), "zeros", "ones", or a TensorFlow / Keras `Zeros`, `Ones`, `Constant`, `RandomUniform`,
        `RandomNormal` or `TruncatedNormal` object. The values are a function of (seed, key, column).
      key_dtype: `tf.int64` (default) or `tf.string` (fingerprinted to int64 inside the ops, as `tf.fingerprint`).
      initial_capacity: rows allocated at creation (1 to `max_rows`; None: min(1024, max_rows)); the table
        grows past it without moving rows.
      max_rows: the most rows the table holds; with no eviction, new keys are refused once it is full.
      admission: None (every key gets a row on first sight), `te.dynamic.FrequencyAdmission` (exact counts) or
        `te.dynamic.BloomAdmission` (a counting Bloom filter of fixed memory).
      eviction: None, `te.dynamic.LRU`, `LFU`, `TTL`, `L2Norm`, `DecayedLFU`, `CountAndAge` or `Score`, applied after
        each training step.
      seed: the seed of the initializer; None takes the initializer object's own integer seed, else 0.
      eviction_log_capacity: entries the table's eviction log keeps (`DynamicTable.evicted_keys()`; >= 1, per
        shard); the oldest are dropped first and a reader that misses some is told.
      storage_dtype, slot_storage_dtype, rounding: the rows' and the slots' storage dtype and how a 16-bit row
        is rounded back after the float32 optimizer step, with `te.TableConfig`'s choices and defaults
        (tf.float32; the table's; "stochastic"); docs/low_precision.md.
      storage: None (the rows in memory) or `te.Tiered(cache_bytes=..., directory=...)`: the rows and their
        slots in a row file `<directory>/<name>.rows` behind a DRAM cache of `cache_bytes`, the keys and their
        metadata in memory (docs/tiered_dynamic_tables.md). Trained by `te.TPUEmbedding` and
        `te.keras.TPUEmbedding`; its `mode` is "create" or "overwrite" (a row file without its keys cannot be
        reopened), and L2Norm eviction (which reads every row) is refused.

    Raises:
      ValueError: for any value out of range or of the wrong kind, naming the table and the value.

    Example:
      >>> users = te.DynamicTableConfig("users", dim=16, optimizer=te.optimizers.Adagrad(0.1),
      ...                               admission=te.dynamic.FrequencyAdmission(2), eviction=te.dynamic.LRU(10**6))
      >>> feature = tf.tpu.experimental.embedding.FeatureConfig(table=users)
    """

    def __init__(
        self,
        name: str,
        dim: int,
        optimizer: Any = None,
        combiner: str = "mean",
        initializer: Any = None,
        key_dtype: Any = tf.int64,
        initial_capacity: int | None = None,
        max_rows: int = MAX_ROWS_LIMIT,
        admission: FrequencyAdmission | BloomAdmission | None = None,
        eviction: _Eviction | None = None,
        seed: int | None = None,
        eviction_log_capacity: int = DEFAULT_EVICTION_LOG_CAPACITY,
        *,
        storage_dtype: Any = tf.float32,
        slot_storage_dtype: Any = None,
        rounding: str | None = None,
        storage: Any = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"DynamicTableConfig: `name` must be a non-empty string; got {name!r}.")
        owner = f"DynamicTableConfig {name!r}"
        tiered = _check_tiered(owner, storage, eviction)
        storage, slot_storage, rounding = low_precision.storage_options(
            owner, storage_dtype, slot_storage_dtype, rounding
        )
        _check_count(owner, "dim", dim, 1, MAX_DIM)
        _check_count(owner, "max_rows", max_rows, 1, MAX_ROWS_LIMIT)
        if initial_capacity is None:
            initial_capacity = min(DEFAULT_INITIAL_CAPACITY, max_rows)
        _check_count(owner, "initial_capacity", initial_capacity, 1)
        if initial_capacity > max_rows:
            raise ValueError(f"{owner}: `initial_capacity` ({initial_capacity}) must be <= max_rows ({max_rows}).")
        try:
            dtype = tf.as_dtype(key_dtype)
        except TypeError:
            dtype = None
        if dtype not in (tf.int64, tf.string):
            raise ValueError(f"{owner}: `key_dtype` must be tf.int64 or tf.string; got {key_dtype!r}.")
        if combiner not in ("mean", "sum", "sqrtn"):
            raise ValueError(f"{owner}: `combiner` must be one of 'mean', 'sum', 'sqrtn'; got {combiner!r}.")
        if admission is not None and not isinstance(admission, (FrequencyAdmission, BloomAdmission)):
            raise ValueError(
                f"{owner}: `admission` must be None, te.dynamic.FrequencyAdmission or te.dynamic.BloomAdmission; "
                f"got {admission!r}."
            )
        if eviction is not None and not isinstance(eviction, _Eviction):
            raise ValueError(
                f"{owner}: `eviction` must be None, te.dynamic.LRU, LFU, TTL, L2Norm, DecayedLFU, CountAndAge or "
                f"Score; got {eviction!r}."
            )
        _check_count(owner, "eviction_log_capacity", eviction_log_capacity, 1, MAX_EVICTION_LOG_CAPACITY)
        if isinstance(eviction, Score) and eviction.max_rows > max_rows:
            raise ValueError(
                f"{owner}: `eviction` keeps up to {eviction.max_rows} rows, more than max_rows ({max_rows})."
            )
        if isinstance(eviction, _RowBound) and eviction.max_rows > max_rows:
            raise ValueError(
                f"{owner}: `eviction` keeps up to {eviction.max_rows} rows, more than max_rows ({max_rows})."
            )
        if optimizer is not None and not isinstance(optimizer, _tf_compat.OptimizerBase):
            raise ValueError(
                f"{owner}: `optimizer` must be a tf_embed_ops.optimizers (or tf.tpu.experimental.embedding) "
                f"optimizer or None; got {optimizer!r}."
            )
        kind, params, own_seed = _initializer_spec(initializer, dim, name)
        _check_initializer_params(name, kind, params)
        if seed is None:
            seed = own_seed if own_seed is not None else 0
        if not _is_int(seed) or not -(2**63) <= seed < 2**63:
            raise ValueError(f"{owner}: `seed` must be an int64; got {seed!r}.")
        if optimizer is not None:
            _slot_initial_values(optimizer, name)  # refuse non-constant slots now, not at build
        if isinstance(initializer, str):  # TableConfig wants a callable: the object of the same kind
            initializer = _tf_compat.init_ops_v2.Zeros() if kind == "zeros" else _tf_compat.init_ops_v2.Constant(1.0)
        super().__init__(
            vocabulary_size=max_rows,
            dim=dim,
            initializer=initializer,
            optimizer=optimizer,
            combiner=combiner,
            name=name,
        )
        self.key_dtype = dtype
        self.initial_capacity = initial_capacity
        self.max_rows = max_rows
        self.admission = admission
        self.eviction = eviction
        self.eviction_log_capacity = eviction_log_capacity
        self.seed = seed
        self.initializer_kind = kind
        self.initializer_params = params
        self.storage_dtype = storage
        self.slot_storage_dtype = slot_storage
        self.rounding = rounding
        self.storage = tiered

    def __repr__(self) -> str:
        return (
            f"DynamicTableConfig(name={self.name!r}, dim={self.dim}, optimizer={self.optimizer!r}, "
            f"combiner={self.combiner!r}, initializer={self.initializer_kind}{self.initializer_params}, "
            f"key_dtype={self.key_dtype.name}, initial_capacity={self.initial_capacity}, max_rows={self.max_rows}, "
            f"admission={self.admission!r}, eviction={self.eviction!r}, seed={self.seed}, "
            f"eviction_log_capacity={self.eviction_log_capacity}, "
            f"storage_dtype={self.storage_dtype.name!r}, slot_storage_dtype={self.slot_storage_dtype.name!r}, "
            f"rounding={self.rounding!r}, storage={self.storage!r})"
        )


def _check_tiered(owner: str, storage: Any, eviction: Any) -> tiered_config.Tiered | None:
    """`storage` checked for a dynamic table: None, or a `te.Tiered` whose mode a dynamic table can use, with no
    eviction policy that reads every row."""
    storage = tiered_config.check_storage(owner, storage)
    if storage is None:
        return None
    if storage.mode == "open":
        raise ValueError(
            f"{owner}: storage=te.Tiered(mode='open') is not supported for a dynamic table: its keys live in memory, "
            "so a row file alone cannot be reopened. Use mode='create', 'overwrite' or 'restore' and restore a "
            "checkpoint."
        )
    if isinstance(eviction, L2Norm):
        raise ValueError(
            f"{owner}: eviction=L2Norm is not supported with storage=te.Tiered: it reads every row's weights at "
            "every step boundary, and a tiered table keeps them on disk. Use LRU, LFU, DecayedLFU, TTL, "
            "CountAndAge or Score."
        )
    return storage


def is_dynamic(table: Any) -> bool:
    """Whether `table` is a dynamic-vocabulary table configuration."""
    return isinstance(table, DynamicTableConfig)


def handle_attrs(config: DynamicTableConfig, optimizer: Any = None, shared_name: str = "") -> dict[str, Any]:
    """The attributes of `TfEmbed>DynamicTableHandle` for `config` (the one mapping from config to op).

    Args:
      config: the table.
      optimizer: the optimizer that trains it, when `config.optimizer` is None (the global one); None for a
        lookup-only table (no slots).
      shared_name: the resource's shared name ("" = private to the handle op).

    Raises:
      ValueError: if the optimizer's slots do not start at a constant.
    """
    optimizer = config.optimizer if config.optimizer is not None else optimizer
    admission = config.admission or FrequencyAdmission(1, max_pending_keys=1)
    eviction = config.eviction.attrs() if config.eviction is not None else dict(_NO_EVICTION)
    # 16-bit storage: attrs only where they differ from the defaults, so a float32 table's op is the one older
    # versions wrote (and read).
    storage = (
        {
            "storage_dtype": config.storage_dtype.name,
            "slot_storage_dtype": config.slot_storage_dtype.name,
            "rounding": config.rounding,
        }
        if low_precision.is_low_precision(config)
        else {}
    )
    # A tiered table: attrs only when tiered, so an in-memory table's op is the one older versions wrote.
    tiered = tiered_config.storage_of(config)
    tiered_attrs = (
        {
            "tiered_path": tiered.path(config.name),
            "tiered_cache_bytes": tiered.cache_bytes,
            # (A dynamic table writes no row at creation: "restore" is "overwrite" for it.)
            "tiered_mode": "overwrite" if tiered.mode == "restore" else tiered.mode,
        }
        if tiered is not None
        else {}
    )
    return {
        "shared_name": shared_name,
        "table_name": config.name,
        "dim": config.dim,
        "key_dtype": config.key_dtype,
        "slot_initial_values": _slot_initial_values(optimizer, config.name) if optimizer is not None else [],
        "slot_widths": _slot_widths(optimizer, config.dim) if optimizer is not None else [],
        "initial_capacity": config.initial_capacity,
        "max_rows": config.max_rows,
        "initializer": config.initializer_kind,
        "initializer_params": list(config.initializer_params),
        "seed": config.seed,
        **admission.attrs(),
        **eviction,
        "eviction_log_capacity": getattr(config, "eviction_log_capacity", DEFAULT_EVICTION_LOG_CAPACITY),
        **storage,
        **tiered_attrs,
    }


def dynamic_config_proto(features: list, optimizer: Any = None, output_shapes: Any = None):
    """The `TPUEmbeddingConfiguration` of the dynamic lookup and update ops over `features` (flattened
    `FeatureConfig`s whose tables are all dynamic): one table entry per table (`vocabulary_size = max_rows`, its
    optimizer, learning-rate tags numbered among these tables), one feature descriptor per feature."""
    from tf_embed_ops import config as config_lib  # pylint: disable=import-outside-toplevel

    for feature in features:
        if not is_dynamic(feature.table):
            raise ValueError(f"dynamic_config_proto: table {feature.table.name!r} is not a DynamicTableConfig.")
    return config_lib.from_feature_config(list(features), optimizer=optimizer, output_shapes=output_shapes)


def to_config_dict(config: DynamicTableConfig) -> dict[str, Any]:
    """The dynamic fields of `config` as JSON-able values (the Keras layer's `get_config` stores them beside the
    `TableConfig` fields)."""
    admission = config.admission
    eviction = config.eviction
    return {
        "key_dtype": config.key_dtype.name,
        "initial_capacity": config.initial_capacity,
        "max_rows": config.max_rows,
        "seed": config.seed,
        "admission": None if admission is None else admission.get_config(),
        "eviction": None if eviction is None else _eviction_config(eviction, config.name),
        "eviction_log_capacity": config.eviction_log_capacity,
        "storage_dtype": config.storage_dtype.name,
        "slot_storage_dtype": config.slot_storage_dtype.name,
        "rounding": config.rounding,
    }


_EVICTION_KINDS = {
    cls.kind: cls for cls in (LRU, LFU, TTL, L2Norm, DecayedLFU, CountAndAge, Score)
}  # fmt: skip


def _eviction_config(eviction: _Eviction, table: str) -> dict[str, Any]:
    """{"kind": ..., "args": {...}}; earlier versions wrote {"kind", "value"} for LRU/LFU/TTL (still read)."""
    try:
        args = eviction.get_config()
    except ValueError as e:
        raise ValueError(f"DynamicTableConfig {table!r}: {e}") from None
    return {"kind": eviction.kind, "args": args}


def _eviction_from_config(eviction: dict[str, Any], name: str) -> _Eviction:
    kind = eviction.get("kind")
    if kind not in _EVICTION_KINDS:
        raise ValueError(f"DynamicTableConfig {name!r}: unknown eviction kind in a saved config: {eviction!r}.")
    if "args" in eviction:
        return _EVICTION_KINDS[kind](**eviction["args"])
    return _EVICTION_KINDS[kind](eviction["value"])


def _admission_from_config(admission: dict[str, Any]) -> FrequencyAdmission | BloomAdmission:
    args = dict(admission)
    kind = args.pop("kind", "frequency")
    return BloomAdmission(**args) if kind == "bloom" else FrequencyAdmission(**args)


def from_config_dict(
    fields: dict[str, Any], *, name: str, dim: int, optimizer: Any, combiner: str, initializer: Any, **options: Any
) -> DynamicTableConfig:
    """Inverse of `to_config_dict`, given the `TableConfig` fields and any other constructor `options` (saved by
    the caller under the argument's name)."""
    admission = fields.get("admission")
    eviction = fields.get("eviction")
    policy = None if eviction is None else _eviction_from_config(eviction, name)
    return DynamicTableConfig(
        name,
        dim,
        optimizer=optimizer,
        combiner=combiner,
        initializer=initializer,
        key_dtype=tf.as_dtype(fields["key_dtype"]),
        initial_capacity=fields["initial_capacity"],
        max_rows=fields["max_rows"],
        admission=None if admission is None else _admission_from_config(admission),
        eviction=policy,
        seed=fields["seed"],
        eviction_log_capacity=fields.get("eviction_log_capacity", DEFAULT_EVICTION_LOG_CAPACITY),
        # Configs saved before 16-bit dynamic tables have none of the three: the defaults.
        storage_dtype=fields.get("storage_dtype", "float32"),
        slot_storage_dtype=fields.get("slot_storage_dtype"),
        rounding=fields.get("rounding"),
        **options,
    )
