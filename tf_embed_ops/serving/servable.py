"""The live servable: a SavedModel of stock TensorFlow ops whose tables a running process updates in place.

Its state is TensorFlow's own: a static table is the resource variable the lookups gather from (a delta writes
rows with `scatter_update`); a dynamic table is a `MutableRowTable`, a `tf.lookup.experimental.MutableHashTable`
key -> slot over a preallocated row variable; dense weights are variables (a delta assigns them whole); the
version it serves is an int64 variable. Three signatures:

- `serving_default`: the model (as `tf_embed_ops.keras.export_for_serving` traces it);
- `apply_delta(path: string) -> {"version": int64}`: reads a delta file (`delta_format`) range by range
  (`delta_reader`: stock record datasets, never the whole file in memory). A first pass checks *all* of it (size,
  checksum piece by piece, model, version chain, layout, every table's dim, encoding, counts, ids and capacity, every
  row finite chunk by chunk, every dense value finite) and writes nothing; a refused delta raises
  `InvalidArgumentError` naming the file and the problem and changes nothing, whichever chunk holds the fault. Sizes
  are checked by division, never by a product that could overflow int64 (a header claiming 2**61 rows is refused,
  not wrapped). A second pass reads the rows again, APPLY_CHUNK_BYTES at a time, and writes them;
- `served_version() -> {"version": int64}`.

Readers and an apply run concurrently; a reader waits for one chunk's write at most. A row is never seen
half-written: each chunk's `scatter_update` holds the variable's lock and `ResourceGather` reads under it. A dynamic
table's new rows are written before their keys are inserted (chunk by chunk); a slot freed by an eviction is reused
only by the next delta (so a lookup that found the old key an instant before does not read another key's row).
While a delta applies, a request may see some rows of the new version and some of the old one, across chunks (a
torn view, as before chunking); the served version changes only after the last write. Deltas are applied one at a
time (one caller of `apply_delta`, e.g. a watcher thread).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic import serving as dynamic_serving
from tf_embed_ops.serving import chunks
from tf_embed_ops.serving import delta_format as fmt
from tf_embed_ops.serving import delta_reader as reader
from tf_embed_ops.serving import streamed as streamed_lib
from tf_embed_ops.serving.chunks import SLOT_USED
from tf_embed_ops.serving.tables import module_name

__all__ = ["MutableRowTable", "Servable", "layout_id"]

# Bytes of rows per chunk (read, checked, written): bounds what an apply holds, and how long one scatter holds the
# variable's lock against concurrent lookups. Traced into `apply_delta` when a servable is saved.
APPLY_CHUNK_BYTES = 1 << 20
# Keys per chunk of a dynamic table at most (its rows' chunk when smaller): bounds how long one lookup, insert or
# removal of a chunk's keys holds its hash table against the lookups (about 0.1-0.5 ms at 4,096 keys).
APPLY_CHUNK_KEYS = 1 << 12


class MutableRowTable(tf.Module):
    """A dynamic table's serving state: `index` key -> slot (a MutableHashTable), `values` [capacity + 1, dim],
    `state` int8 [capacity] (`chunks.SLOT_FREE`, `SLOT_USED`, `SLOT_RELEASED`: its key evicted). Slot `capacity`
    is the default row of zeros (what the training side reads for a key without a row).

    Args:
      keys: int64 [n], unique.
      weights: [n, dim].
      capacity: slots (>= n); deltas insert into the free ones.
      key_dtype: tf.int64 or tf.string (the ids `rows` accepts; string ids are fingerprinted).
      name: the table's name.
    """

    def __init__(self, keys: Any, weights: Any, capacity: int, key_dtype: Any = tf.int64, name: str = "table"):
        super().__init__(name=module_name(name))
        keys = np.asarray(keys, np.int64).reshape([-1])
        weights = np.asarray(weights)
        n = keys.shape[0]
        if capacity < n:
            raise ValueError(f"table {name}: capacity {capacity} is below its {n} rows")
        self.table_name = name
        self.key_dtype = tf.as_dtype(key_dtype)
        self.dim = int(weights.shape[1])
        if self.dim < 1:
            raise ValueError(f"table {name}: rows of dim {self.dim}; a served table's rows have dim >= 1")
        self.capacity = int(capacity)
        self.dtype = tf.as_dtype(weights.dtype)
        values = np.zeros([capacity + 1, self.dim], weights.dtype)
        values[:n] = weights
        state = np.zeros([capacity], np.int8)
        state[:n] = SLOT_USED
        self.values = tf.Variable(values, trainable=False, name="values")
        self.state = tf.Variable(state, trainable=False, name="state")
        self.index = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=np.int64(capacity))
        self.index.insert(tf.constant(keys), tf.range(n, dtype=tf.int64))

    def rows(self, ids: Any) -> tf.Tensor:
        """Slot of each id in `values` (`capacity` for an id without a row), same shape as `ids`."""
        return self.index.lookup(dynamic_serving.to_keys(ids, self.key_dtype))

    def gather_rows(self, rows: Any) -> tf.Tensor:
        """Float32 rows at slots `rows` (what `rows(ids)` returns): the serving-form protocol the Keras layers'
        plain lookup reads (as `FrozenDynamicTable.gather_rows`)."""
        return tf.cast(tf.gather(self.values, rows), tf.float32)

    def lookup(self, ids: Any) -> tf.Tensor:
        return self.gather_rows(self.rows(ids))


def layout_id(layout: dict) -> int:
    """The fingerprint of what makes deltas interchangeable: table names, kinds, encodings, key dtypes, static
    vocabulary sizes, dense variables' names, shapes and dtypes (dims are checked one by one, to name them)."""
    tables = [{k: v for k, v in t.items() if k not in ("dim", "capacity")} for t in layout["tables"]]
    return fmt.fingerprint64(json.dumps({"tables": tables, "dense": layout["dense"]}, sort_keys=True))


def _fail(ok: Any, path: tf.Tensor, *message: Any) -> tf.Operation:
    """An Assert whose message is `delta <path>: <message...>` (strings and numbers joined)."""
    parts = [m if isinstance(m, str) or m.dtype == tf.string else tf.strings.as_string(m) for m in message]
    text = tf.strings.join([tf.constant("delta "), path, tf.constant(": ")] + [tf.convert_to_tensor(p) for p in parts])
    return tf.debugging.Assert(ok, [text])


def _gate(deps: list, *tensors: Any) -> Any:
    """`tensors`, computed only after `deps` (so that no parse runs on bytes a check has not passed)."""
    with tf.control_dependencies(deps):
        out = [tf.identity(t) for t in tensors]
    return out[0] if len(out) == 1 else out


def _substr(data: tf.Tensor, offset: Any, length: Any) -> tf.Tensor:
    return tf.strings.substr(data, tf.cast(offset, tf.int64), tf.cast(length, tf.int64))


def _int64s(data: tf.Tensor, offset: Any, count: Any) -> tf.Tensor:
    return tf.reshape(tf.io.decode_raw(_substr(data, offset, tf.cast(count, tf.int64) * 8), tf.int64), [-1])


class Servable(tf.Module):
    """The SavedModel root (see the module docstring).

    Args:
      serving_fn: the traced `serving_default` concrete function.
      tables: [(name, table)] in layout order, a table being a variable, a MutableRowTable or a StreamedTable. A
        `StreamedTable` (a tiered table's serving form without quantization, `streamed.StreamedTable`) serves as its
        `rows` variable, which deltas scatter into; it is kept reachable from the root (`streamed`) so that
        `streamed.write_rows` finds it after `tf.saved_model.save`. A `MutableRowTable` may be streamed too
        (`streamed_row_table.StreamedRowTable`).
      dense: [(name, tf.Variable)] in layout order.
      model_id: the chain's model id (a string).
      version: the version this full export is.
    """

    def __init__(self, serving_fn: Any, tables: list, dense: list, model_id: str, version: int):
        super().__init__(name="servable")
        for name, t in tables:
            if isinstance(t, streamed_lib.StreamedTable) and t.mode is not None:
                raise ValueError(f"table {name!r}: a published table is stored as trained, not quantized ({t.mode})")
        # A static tiered table's serving form: its variable is the servable's table (rows written after the save).
        self.tables = [t.rows if isinstance(t, streamed_lib.StreamedTable) else t for _, t in tables]
        self.streamed = [t for _, t in tables if isinstance(t, streamed_lib.Streamed)]
        self.dense = [v for _, v in dense]
        self.version = tf.Variable(np.int64(version), trainable=False, name="version")
        layout = {
            "tables": [_table_layout(name, t) for name, t in tables],
            "dense": [{"name": n, "shape": list(v.shape), "dtype": v.dtype.name} for n, v in dense],
        }
        for table in layout["tables"]:
            if table["dim"] < 1:
                raise ValueError(f"table {table['name']!r}: dim {table['dim']}; a served table's rows have dim >= 1")
        # Kept as JSON text: a tf.Module would wrap a dict attribute into trackable containers.
        self._layout_json = json.dumps(layout)
        self.model_id_text = model_id
        self._model_id = fmt.fingerprint64(model_id)
        self._layout_id = layout_id(layout)
        self._serving_fn = serving_fn
        self.apply_delta = tf.function(
            self._apply_delta, input_signature=[tf.TensorSpec([], tf.string, name="path")], autograph=False
        )
        self.served_version = tf.function(lambda: {"version": self.version.read_value()}, input_signature=[])

    @property
    def layout(self) -> dict:
        """{"tables": [{name, kind, encoding, dim, rows | capacity, key_dtype}], "dense": [{name, shape, dtype}]}."""
        return json.loads(self._layout_json)

    def signatures(self) -> dict:
        return {
            "serving_default": self._serving_fn,
            "apply_delta": self.apply_delta.get_concrete_function(),
            "served_version": self.served_version.get_concrete_function(),
        }

    def metadata(self) -> dict:
        return {"model_id": self.model_id_text, "layout_id": self._layout_id, "layout": self.layout}

    # ---------------------------------------------------------------------------------------- apply_delta
    def _apply_delta(self, path: tf.Tensor) -> dict:
        # The file is read range by range (`delta_reader`), never whole, in four datasets (each costs memory to save
        # with every full version): the preamble and header; the size; the keys and dense weights; one pass over
        # the rest (`chunks`).
        num_tables, num_dense = len(self.tables), len(self.dense)
        want_words = fmt.HEADER_FIXED + fmt.TABLE_FIELDS * num_tables
        # At most the longest valid header is read; a longer one is refused below by its size.
        longest = 8 * (want_words + fmt.DENSE_FIELDS * num_dense)
        start = reader.head(path, fmt.PREAMBLE + longest)
        got = tf.cast(tf.strings.length(start), tf.int64)
        checks = [_fail(got >= fmt.PREAMBLE, path, "truncated: ", got, " bytes, shorter than the preamble")]
        pre = _gate(checks, start)
        checks = [_fail(tf.equal(_substr(pre, 0, 8), fmt.MAGIC), path, "not a delta file (bad magic)")]
        pre = _gate(checks, _int64s(pre, 8, 4))
        fmt_version, h, b, check = pre[0], pre[1], pre[2], pre[3]
        checks = [
            _fail(tf.equal(fmt_version, fmt.FORMAT_VERSION), path, "format version ", fmt_version, " unsupported"),
            _fail(
                # Bounded before they are added: PREAMBLE + h + b cannot wrap int64.
                tf.logical_and(
                    tf.logical_and(h >= 0, b >= 0), tf.logical_and(h <= reader.MAX_SEGMENT, b <= reader.MAX_SEGMENT)
                ),
                path,
                "truncated or extended: its preamble says a header of ",
                h,
                " and a payload of ",
                b,
                " bytes",
            ),
        ]
        h, b = _gate(checks, h, b)
        size = fmt.PREAMBLE + h + b
        longer = reader.size_matches(path, size)
        checks = [
            _fail(
                tf.equal(longer, 0),
                path,
                "truncated or extended: the file is ",
                tf.where(longer < 0, tf.constant("shorter"), tf.constant("longer")),
                " than the ",
                size,
                " bytes its preamble says",
            )
        ]
        h, b, size = _gate(checks, h, b, size)
        checks = [_fail(tf.equal(h % 8, 0), path, "header size ", h, " is not a multiple of 8")]
        header = _gate(checks, _substr(start, fmt.PREAMBLE, tf.minimum(h, longest)))
        header = tf.reshape(tf.io.decode_raw(header, tf.int64), [-1])
        hsize = h // 8
        checks = [
            _fail(hsize >= fmt.HEADER_FIXED, path, "header of ", hsize, " words is too short"),
        ]
        header = _gate(checks, tf.pad(header, [[0, fmt.HEADER_FIXED]]))
        model, layout, version, base = header[0], header[1], header[2], header[3]
        checks = [
            _fail(
                tf.equal(model, self._model_id),
                path,
                "delta of another model (model id ",
                model,
                f"; this servable is model {self.model_id_text}, id {self._model_id})",
            ),
        ]
        checks = [
            *checks,
            _fail(
                tf.equal(base, self.version),
                path,
                "version chain gap: the delta makes version ",
                version,
                " from version ",
                base,
                ", the servable serves version ",
                self.version.read_value(),
            ),
        ]
        checks.append(
            _fail(
                tf.equal(layout, self._layout_id),
                path,
                "delta of another table layout (layout id ",
                layout,
                f", this servable's is {self._layout_id}: tables {[t['name'] for t in self.layout['tables']]})",
            )
        )
        checks.append(_fail(version > base, path, "version ", version, " does not follow its base ", base))
        checks.append(
            _fail(
                tf.logical_and(
                    tf.equal(header[5], num_tables),
                    tf.logical_or(tf.equal(header[6], 0), tf.equal(header[6], num_dense)),
                ),
                path,
                "the delta has ",
                header[5],
                " tables and ",
                header[6],
                f" dense variables; the servable has {num_tables} tables and {num_dense} dense variables",
            )
        )
        header = _gate(checks, header)
        carries_dense = header[6] > 0
        checks = [
            _fail(
                tf.equal(
                    hsize,
                    want_words
                    + tf.where(
                        carries_dense, tf.constant(fmt.DENSE_FIELDS * num_dense, tf.int64), tf.constant(0, tf.int64)
                    ),
                ),
                path,
                "header of ",
                hsize,
                " words does not match its table and dense-variable counts",
            )
        ]
        header = _gate(checks, header)
        payload = fmt.PREAMBLE + h
        layout = self.layout
        checks, ranges = [], []
        fields = []
        for t, entry in enumerate(layout["tables"]):
            fields.append([header[fmt.HEADER_FIXED + fmt.TABLE_FIELDS * t + i] for i in range(fmt.TABLE_FIELDS)])
            checks += _check_segments(entry, fields[-1], path, b)
            _, _, n, m, k_off, _, e_off, _ = fields[-1]
            ranges += [(payload + k_off, n * 8), (payload + e_off, m * 8)]
        dense_plans = []
        for d, var in enumerate(self.dense):
            base_word = want_words + fmt.DENSE_FIELDS * d
            off, nbytes = (
                tf.gather(header, tf.minimum(hsize - 1, base_word)),
                tf.gather(header, tf.minimum(hsize - 1, base_word + 1)),
            )
            expected = int(np.prod(var.shape)) * var.dtype.size
            name = layout["dense"][d]["name"]
            sized = tf.logical_and(tf.equal(nbytes, expected), _in_payload(off, nbytes, b))
            ok = tf.logical_or(tf.logical_not(carries_dense), sized)
            checks.append(
                _fail(ok, path, f"dense variable {name}: ", nbytes, f" bytes, its shape {var.shape} needs {expected}")
            )
            # Read once its size is known good, and only when carried (else 0 bytes from the payload's start); the
            # value read is checked and then assigned (a dense variable is held whole by the servable anyway).
            carried = tf.logical_and(carries_dense, sized)
            ranges.append((tf.where(carried, payload + off, payload), tf.where(carried, nbytes, tf.zeros_like(nbytes))))
            dense_plans.append((var, name))
        # The keys, evicted keys and dense weights: one dataset, once every segment is known to be in the file.
        values = reader.read_ranges(path, _gate(checks, size), ranges)
        plans, content = [], []
        for t, (entry, table) in enumerate(zip(layout["tables"], self.tables, strict=True)):
            keys, evicted = (tf.reshape(tf.io.decode_raw(v, tf.int64), [-1]) for v in values[2 * t : 2 * t + 2])
            plan, table_checks, table_content = _check_table(entry, table, fields[t], keys, evicted, path, payload)
            plans.append(plan)
            checks += table_checks
            content += table_content
        for d, (var, name) in enumerate(dense_plans):
            value = values[2 * num_tables + d]
            if var.dtype.is_floating:
                finite = tf.reduce_all(tf.math.is_finite(tf.io.decode_raw(value, var.dtype)))
                content.append((finite, [f"dense variable {name}: a value is not finite (NaN or infinity)"]))
            dense_plans[d] = (var, value)
        # The header and the segments' bounds are checked; one pass over the file (`chunks.apply`) checks the
        # rest (the checksum, every row finite, `content`) and, past its barrier, writes the rows. Nothing below
        # can fail on the delta's content once the pass's last checks hold.
        with tf.control_dependencies(checks):
            final = chunks.apply(path, size, h + b, check, plans, content, _fail)
        with tf.control_dependencies(final):
            dense_writes = []
            for var, value in dense_plans:
                dense_writes.append(
                    tf.cond(
                        carries_dense,
                        lambda var=var, value=value: _assign_dense(var, value),
                        lambda: tf.constant(True),
                    )
                )
            with tf.control_dependencies(dense_writes):  # the served version changes last
                done = self.version.assign(version)
        return {"version": tf.identity(done)}


def _table_layout(name: str, table: Any) -> dict:
    if isinstance(table, streamed_lib.StreamedTable):
        # Its variable may hold float16 rows as their int16 bits: the layout (and the deltas) name the rows' dtype.
        return {"name": name, "kind": "static", "encoding": table.dtype.name, "dim": table.dim, "rows": table.num_rows}
    if isinstance(table, MutableRowTable):
        return {
            "name": name,
            "kind": "dynamic",
            "key_dtype": table.key_dtype.name,
            "encoding": table.dtype.name,
            "dim": table.dim,
            "capacity": table.capacity,
        }
    return {
        "name": name,
        "kind": "static",
        "encoding": table.dtype.name,
        "dim": int(table.shape[1]),
        "rows": int(table.shape[0]),
    }


def _in_payload(off: tf.Tensor, nbytes: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """[off, off + nbytes) inside a payload of b >= 0 bytes, computed without overflow (no off + nbytes)."""
    return tf.logical_and(tf.logical_and(off >= 0, nbytes >= 0), tf.logical_and(off <= b, nbytes <= b - off))


def _count_in_payload(off: tf.Tensor, count: tf.Tensor, unit: int, b: tf.Tensor) -> tf.Tensor:
    """`count` items of `unit` bytes from `off` inside the payload, without computing count * unit first (a header
    may claim 2**61 rows: the product would wrap)."""
    return tf.logical_and(
        tf.logical_and(off >= 0, count >= 0), tf.logical_and(off <= b, count <= (b - off) // max(unit, 1))
    )


def _assign_dense(var: tf.Variable, value: tf.Tensor) -> tf.Tensor:
    value = tf.reshape(tf.io.decode_raw(value, var.dtype), var.shape)
    with tf.control_dependencies([var.assign(value)]):
        return tf.constant(True)


def _check_segments(entry: dict, fields: list, path: Any, b: Any) -> list:
    """The checks of one table's header fields: dim, encoding, its segments inside the payload."""
    name = entry["name"]
    dim, enc, n, m, k_off, r_off, e_off, r_bytes = fields
    code = fmt.ROW_ENCODINGS[entry["encoding"]]
    itemsize = tf.as_dtype(entry["encoding"]).size
    return [
        _fail(tf.equal(dim, entry["dim"]), path, f"table {name}: dim ", dim, f", the servable's is {entry['dim']}"),
        _fail(
            tf.equal(enc, code),
            path,
            f"table {name}: row encoding ",
            enc,
            f", the servable's is {code} ({entry['encoding']})",
        ),
        _fail(
            tf.logical_and(
                tf.logical_and(_count_in_payload(k_off, n, 8, b), _count_in_payload(e_off, m, 8, b)),
                tf.logical_and(
                    _count_in_payload(r_off, n, entry["dim"] * itemsize, b),
                    # Multiplied only once n is known to fit the payload (else a 0-sized product could pass).
                    tf.logical_and(
                        _in_payload(r_off, r_bytes, b),
                        tf.equal(r_bytes, tf.where(n <= b, n, 0) * entry["dim"] * itemsize),
                    ),
                ),
            ),
            path,
            f"table {name}: segments outside the payload or of the wrong size (rows ",
            n,
            ", evicted ",
            m,
            ")",
        ),
    ]


def _check_table(entry: dict, table: Any, fields: list, keys: Any, evicted: Any, path: Any, payload: Any):
    """One table's plan for `chunks.apply` (which checks its keys chunk by chunk, once the checksum holds), its
    checks (the header's) and its content checks (a dynamic table's evicted keys)."""
    name = entry["name"]
    _, _, n, m, _, r_off, e_off, _ = fields
    itemsize = tf.as_dtype(entry["encoding"]).size
    checks = []
    # The rows are decoded as the variable stores them: a streamed float16 table keeps its rows' int16 bits (the
    # same bytes); otherwise the variable's dtype is the encoding.
    values = table if entry["kind"] == "static" else table.values
    row_bytes = entry["dim"] * itemsize
    plan = {
        "name": name,
        "kind": entry["kind"],
        "rows_at": payload + r_off,
        "n": n,
        "dim": entry["dim"],
        "encoding": tf.as_dtype(entry["encoding"]),
        "var": values,
        "chunk_rows": max(1, APPLY_CHUNK_BYTES // row_bytes),
        "keys": keys,
    }
    if entry["kind"] == "dynamic":  # its keys are looked up, inserted and removed under the hash table's lock
        plan["chunk_rows"] = min(plan["chunk_rows"], APPLY_CHUNK_KEYS)
    if entry["kind"] == "static":
        plan["vocab"] = entry["rows"]
        checks.append(_fail(tf.equal(m, 0), path, f"table {name}: a static table evicts nothing, the delta evicts ", m))
        return plan, checks, []
    # A dynamic table. Its evicted keys, strictly ascending (what `chunks` searches a chunk's keys in).
    capacity = table.capacity
    order = tf.reshape(tf.where(evicted[1:] <= evicted[:-1]), [-1])
    at = tf.concat([order, [0]], 0)[0] + 1
    padded = tf.concat([evicted[at - 1 : at + 1], [0, 0]], 0)  # the pair out of order (when there is one)
    content = [
        (
            tf.equal(tf.size(order), 0),
            [
                f"table {name}: evicted keys not strictly ascending: ",
                padded[1],
                " at ",
                at,
                " (0-based) after ",
                padded[0],
            ],
        )
    ]
    # New keys take the slots free when the delta starts (a slot released by its own evictions is not), in order
    # (`chunks`).
    free = tf.reshape(tf.where(tf.not_equal(table.state, SLOT_USED)), [-1])
    plan.update(
        index=table.index,
        state=table.state,
        capacity=capacity,
        m=m,
        evicted=evicted,
        evicted_at=payload + e_off,
        free=free,
        available=tf.size(free, out_type=tf.int64),
    )
    return plan, checks, content
