"""Reads a delta file piece by piece with stock TensorFlow ops, never whole (the servable's `apply_delta`).

`tf.io.read_file` is the only stock op that reads a file into a tensor, and it reads all of it: a delta of a
million rows would sit in the serving process beside the model. These helpers read byte ranges instead, through
`tf.data.FixedLengthRecordDataset` (stock, in every TensorFlow a servable loads in): a range is a dataset of
consecutive records, `scan_records` consumes them one at a time, so memory holds one record.

A record dataset skips its `header_bytes` by reading them (it does not seek): a range that starts deep in the file
costs a pass over the bytes before it, through a small buffer, at memory bandwidth (a burst that slows the lookups
beside it). Each helper opens as few ranges as it can, as near the file's start as it can, for that reason.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["bytes_of", "head", "read", "read_ranges", "records", "scan_records", "size_matches"]

# What a range dataset buffers while it reads (and skips its header).
_BUFFER_BYTES = 1 << 18
# Sizes beyond this are refused before they are added (2 ** 61 + 2 ** 61 + 40 cannot wrap int64).
MAX_SEGMENT = 1 << 61
_MANY = 1 << 62


def scan_records(records: tf.data.Dataset, initial: Any, fn: Any, empty: tf.Tensor) -> tf.Tensor:
    """`fn(state, (i, record)) -> (state, output)` over the records in order, one record in memory at a time;
    returns the outputs stacked ([count, ...]; `empty`, a [0, ...] tensor of their dtype and shape, when there is no
    record).

    A scan consumed by `get_single_element` (`DatasetToSingleElement`): unlike `Dataset.reduce` or an iterator, it
    does not rewrite the dataset's graph each call (about 10 ms a dataset), and it runs `fn` on one element at a
    time, in order, so `fn` may write state (a chunk's rows). One function in the graph: every function in
    `apply_delta` costs memory to trace and save, in every full version's export."""
    indexed = tf.data.Dataset.zip(tf.data.Dataset.range(_MANY), records)
    return _stacked(_on_own_thread(indexed.scan(initial, fn)), empty)


def _stacked(ds: tf.data.Dataset, empty: tf.Tensor) -> tf.Tensor:
    """A dataset's elements stacked ([count, ...]), `empty` when it has none."""
    return ds.batch(_MANY).concatenate(tf.data.Dataset.from_tensors(empty)).take(1).get_single_element()


def _on_own_thread(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with its functions run on a private thread, one intra-op thread each (the stock datasets behind
    `tf.data.Options().threading`): an apply's chunks do not queue in the pools the process's lookups run in."""
    specs = tf.nest.flatten(ds.element_spec)
    types, shapes = [s.dtype for s in specs], [s.shape for s in specs]
    variant = tf.raw_ops.MaxIntraOpParallelismDataset(
        input_dataset=tf.data.experimental.to_variant(ds),
        max_intra_op_parallelism=tf.constant(1, tf.int64),
        output_types=types,
        output_shapes=shapes,
    )
    variant = tf.raw_ops.PrivateThreadPoolDataset(
        input_dataset=variant, num_threads=tf.constant(1, tf.int64), output_types=types, output_shapes=shapes
    )
    return tf.data.experimental.from_variant(variant, ds.element_spec)


def records(path: tf.Tensor, size: Any, start: Any, length: Any, record: Any) -> tf.data.Dataset:
    """The bytes [start, start + length) of a file of `size` bytes (checked before: `size_matches`), as records in
    order: first the remainder of `length` modulo `record` when it is not 0, then `record`-byte records (a dataset
    of scalar strings).

    The short record comes first: each of the two datasets reads through the bytes before its first one, so both
    stop short of `start + record`; a short record at the end would read through the whole segment again."""
    start, length, size = (tf.cast(x, tf.int64) for x in (start, length, size))
    record = tf.maximum(tf.cast(record, tf.int64), 1)
    full = length // record
    head = length - full * record
    # `take`: an empty part is never opened (opening one reads through its header).
    first = tf.data.FixedLengthRecordDataset(
        path, tf.maximum(head, 1), header_bytes=start, footer_bytes=size - start - head, buffer_size=_BUFFER_BYTES
    ).take(tf.cast(head > 0, tf.int64))
    body = tf.data.FixedLengthRecordDataset(
        path, record, header_bytes=start + head, footer_bytes=size - start - length, buffer_size=_BUFFER_BYTES
    ).take(full)
    return first.concatenate(body)


def _joined(ds: tf.data.Dataset) -> tf.Tensor:
    """A dataset of scalar strings, concatenated (small ones only: it is held whole). No function: every function
    in `apply_delta`'s graph costs memory to trace and save, in every full version's export."""
    return tf.strings.reduce_join(_stacked(ds, tf.zeros([0], tf.string)))


def read(path: tf.Tensor, size: Any, start: Any, length: Any) -> tf.Tensor:
    """The bytes [start, start + length) as one scalar string (a segment small enough to hold: keys, a header)."""
    return _joined(records(path, size, start, length, length))


def read_ranges(path: tf.Tensor, size: Any, ranges: list) -> list:
    """The bytes of each (start, length) range, as scalar strings, read by one dataset (small ranges only: keys,
    dense weights; they are held whole)."""
    parts = None
    for start, length in ranges:
        # Exactly one element a range: its one record, or b"" when it is empty.
        part = records(path, size, start, length, length).concatenate(tf.data.Dataset.from_tensors(b"")).take(1)
        parts = part if parts is None else parts.concatenate(part)
    if parts is None:
        return []
    return tf.unstack(_stacked(parts, tf.zeros([0], tf.string)), num=len(ranges))


def head(path: tf.Tensor, length: int) -> tf.Tensor:
    """The first `length` bytes of a file of unknown size, or all of it when shorter (a byte at a time: for the
    preamble only)."""
    return _joined(tf.data.FixedLengthRecordDataset(path, 1, buffer_size=length).take(length))


def size_matches(path: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    """-1, 0 or 1: the file is shorter than, exactly or longer than `size` (>= 1) bytes; reads two bytes at most.

    A record dataset whose footer is all but the last expected byte holds one 1-byte record for a file of exactly
    `size` bytes, none for a shorter file (a footer past the end leaves no body) and more for a longer one."""
    ds = tf.data.FixedLengthRecordDataset(path, 1, header_bytes=0, footer_bytes=size - 1, buffer_size=2).take(2)
    return tf.size(_stacked(ds, tf.zeros([0], tf.string)), out_type=tf.int64) - 1


def bytes_of(u8: tf.Tensor) -> tf.Tensor:
    """A scalar string of the bytes of a uint8 tensor (no stock op encodes raw bytes: each byte is looked up in a
    256-entry alphabet; a digest is 8 bytes)."""
    chars = tf.gather(tf.constant([bytes([i]) for i in range(256)]), tf.cast(tf.reshape(u8, [-1]), tf.int32))
    return tf.strings.reduce_join(chars)
