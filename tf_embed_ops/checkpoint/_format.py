"""On-disk format of incremental checkpoints (docs/checkpoints.md): the manifest, delta files, checksums.

Pure Python + numpy (no TensorFlow), so a checker in another process can validate a directory without the
library.  Every file is written by `tf_embed_ops.formats.atomic_write` (a temporary name, flushed to disk and
renamed); the manifest is written last, so a save killed at any point leaves the previous manifest and chain intact.

A delta names its parent by name (`parent`) and by content (`parent_sha256`, `entry_digest` of the parent's
manifest entry): a delta copied from another run of the same model, whose parent has the same name but other
content, is refused. Deltas written before `parent_sha256` existed are linked by name only.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile

import numpy as np

FORMAT = "tf_embed_ops.incremental_checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_HEADER = "__header__"


class CheckpointError(ValueError):
    """A checkpoint file or chain that cannot be restored; the message names the file and what is wrong."""


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes `data` to `path` atomically (`tf_embed_ops.formats.atomic_write.write_file`)."""
    # Imported here: the checker (`verify_directory`, run as a script) must not need the library.
    from tf_embed_ops.formats import atomic_write  # pylint: disable=import-outside-toplevel

    atomic_write.write_file(path, data)


def entry_digest(entry: dict) -> str:
    """What a child delta records of its parent's content: a delta's sha256, or for a full checkpoint the sha256 of
    its files' checksums (canonical JSON)."""
    if entry["kind"] == "delta":
        return str(entry["sha256"])
    return hashlib.sha256(json.dumps(entry["files"], sort_keys=True).encode()).hexdigest()


def check_link(path: str, header: dict, parent: dict) -> None:
    """Raises CheckpointError unless the delta at `path` (its `header`) follows the manifest entry `parent`, by name
    and, for deltas that record it, by content."""
    if header.get("parent") != parent["name"]:
        raise CheckpointError(
            f"{path}: follows {header.get('parent')!r}, but the chain has {parent['name']!r} before it"
        )
    digest = header.get("parent_sha256")
    if digest is not None and digest != entry_digest(parent):
        raise CheckpointError(
            f"{path}: follows another {parent['name']!r} (content sha256 {str(digest)[:12]}..., this chain's is "
            f"{entry_digest(parent)[:12]}...): a delta of another run or chain"
        )


def write_delta(path: str, header: dict, arrays: dict) -> tuple[str, int]:
    """Writes a delta file (an uncompressed .npz with a JSON header); returns (sha256, bytes)."""
    buf = io.BytesIO()
    payload = {_HEADER: np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)}
    for name, value in arrays.items():
        payload[name] = np.asarray(value, order="C")  # (ascontiguousarray would make a scalar 1-d)
    np.savez(buf, **payload)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest(), len(data)


def read_delta(path: str, sha256: str, holds: str = "") -> tuple[dict, dict]:
    """Reads and validates a delta file against its manifest checksum: (header, arrays).

    Args:
      path, sha256: the file and its manifest checksum.
      holds: what the file holds, for the message (e.g. "tables 'a', 'b'").

    Raises:
      CheckpointError: missing, truncated or corrupted file (naming it, and `holds`).
    """
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: the delta listed in the manifest is missing")
    with open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(
            f"{path}: checksum mismatch (the file is truncated or corrupted: {len(data)} bytes, sha256 "
            f"{hashlib.sha256(data).hexdigest()[:12]}..., the manifest expects {sha256[:12]}...)"
            + (f"; it holds {holds}" if holds else "")
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        header = json.loads(bytes(arrays.pop(_HEADER)).decode())
    except (ValueError, KeyError, OSError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable delta file ({e})") from e
    if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: not an incremental-checkpoint delta of format version {FORMAT_VERSION}")
    return header, arrays


def read_manifest(directory: str) -> dict | None:
    """The directory's manifest, or None if there is none.

    Raises:
      CheckpointError: an unreadable manifest or another format.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable manifest ({e})") from e
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: not an incremental-checkpoint manifest (a JSON {type(manifest).__name__})")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: not an incremental-checkpoint manifest of format version {FORMAT_VERSION}")
    chain = manifest.get("chain")
    if not isinstance(chain, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and e.get("kind") in ("full", "delta") for e in chain
    ):
        raise CheckpointError(f"{path}: malformed manifest (its chain must be a list of entries with a name and kind)")
    return manifest


def write_manifest(directory: str, manifest: dict) -> None:
    manifest = dict(manifest, format=FORMAT, format_version=FORMAT_VERSION)
    atomic_write_bytes(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())


def checksum_tree(directory: str) -> dict:
    """{relative path: sha256} of every file under `directory` (a full checkpoint's files)."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in sorted(files):
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = sha256_file(path)
    return out


def verify_tree(directory: str, expected: dict, holds: str = "") -> None:
    """Raises CheckpointError naming the first missing or altered file of a full checkpoint (and `holds`, what the
    checkpoint holds, e.g. "tables 'a', 'b'")."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"{directory}: the full checkpoint listed in the manifest is missing")
    suffix = f"; the checkpoint holds {holds}" if holds else ""
    for rel, digest in sorted(expected.items()):
        path = os.path.join(directory, rel)
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: file of the full checkpoint is missing{suffix}")
        if sha256_file(path) != digest:
            raise CheckpointError(
                f"{path}: checksum mismatch (truncated or corrupted: {os.path.getsize(path)} bytes){suffix}"
            )


def verify_directory(directory: str) -> dict:
    """Checks a chain without TensorFlow or the library (runnable as a script on another machine).

    Returns:
      {"valid": [names of the longest valid prefix of the newest chain], "error": None or the first problem}.
    """
    manifest = read_manifest(directory)
    if manifest is None or not manifest.get("chain"):
        return {"valid": [], "error": f"{directory}: no manifest"}
    chain = manifest["chain"]
    base = max(i for i, e in enumerate(chain) if e["kind"] == "full")
    valid: list = []
    try:
        verify_tree(os.path.join(directory, chain[base]["name"] + ".full"), chain[base]["files"])
        valid.append(chain[base]["name"])
        parent = chain[base]
        for entry in chain[base + 1 :]:
            path = os.path.join(directory, entry["name"] + ".delta")
            header, _ = read_delta(path, entry["sha256"])
            if header.get("model_id") != manifest.get("model_id"):
                raise CheckpointError(f"{entry['name']}.delta: not the next link of this chain (another model)")
            check_link(path, header, parent)
            valid.append(entry["name"])
            parent = entry
    except CheckpointError as e:
        return {"valid": valid, "error": str(e)}
    return {"valid": valid, "error": None}


if __name__ == "__main__":
    import sys

    print(json.dumps(verify_directory(sys.argv[1])))
