"""Content fingerprints: of files, directories of weights, and models held in memory.

What lets a rerun reuse an output (the reference log-prob cache, the stage manifests) is a
fingerprint of what it was made from, so a fingerprint must see every byte: a changed
weight anywhere gives another fingerprint. Every byte is hashed with xxHash's XXH3-128
(the ``xxhash`` package, which ``datasets`` already depends on): about 10 GB/s a core
here, faster than the disk, so hashing costs what reading costs (docs/environment.md,
"Fingerprints", has the measurements: 16 GB of 8B weights take about 13 s from a
1.2 GB/s disk, 140 GB of 70B weights about 2 minutes). XXH3 is not cryptographic: it
detects changes, not an adversary forging a collision, which is all a cache needs.

Nothing is remembered between calls, except inside ``remembered()``: a digest keyed by size
and modification time would miss a file rewritten within the clock's resolution, which is
the one thing it must not do across runs. Within one stage run the same weights are hashed
for its manifest and again by its own checks (the log-prob pass's cache key, the trainer's
reference check); ``remembered()`` lets the second use the first's per-file digests while
the file's size, inode and times are unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import xxhash

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_CHUNK = 16 << 20
_MEMO: list[dict[tuple, str]] = []  # the digests remembered by the innermost ``remembered()``
HASHED: list[str] = []  # every file hashed in full, in order (tests count them)


@contextlib.contextmanager
def remembered() -> Iterator[None]:
    """Within the block, a file's digest is computed once while its size, inode and times stay."""
    memo: dict[tuple, str] = {}
    _MEMO.append(memo)
    try:
        yield
    finally:  # its own dict, by identity: a block left open by a run that raised stays below it
        for index in range(len(_MEMO) - 1, -1, -1):
            if _MEMO[index] is memo:
                del _MEMO[index]
                break


def json_digest(payload: Any) -> str:
    """sha256 of a JSON-able value with sorted keys: the digest of settings and lists of digests."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(path: str | Path) -> str:
    """XXH3-128 of every byte of a file (hex)."""
    key = None
    if _MEMO:
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)
        if key in _MEMO[-1]:
            return _MEMO[-1][key]
    value = _hash_file(path)
    if key is not None:
        _MEMO[-1][key] = value
    return value


def _hash_file(path: str | Path) -> str:
    HASHED.append(str(path))
    log = os.environ.get("ALIGN_HASH_LOG")  # a file each full hash is listed in (tests count them across ranks)
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{os.environ.get('RANK', '0')} {path}\n")
    digest = xxhash.xxh3_128()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def weight_files(directory: str | Path) -> list[Path]:
    """A checkpoint directory's weight files (top level, sorted): what its fingerprint covers."""
    directory = Path(directory)
    return sorted(p for p in directory.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def files_fingerprint(files: Iterable[Path]) -> str:
    """One digest for a set of files: each file's name, size and full-content digest."""
    return json_digest([[p.name, p.stat().st_size, file_digest(p)] for p in files])


def tensors_fingerprint(named_tensors: Iterable[tuple[str, Any]]) -> str:
    """XXH3-128 over every element of every tensor, with its name, shape and dtype."""
    import torch

    digest = xxhash.xxh3_128()
    with torch.no_grad():
        for name, tensor in named_tensors:
            tensor = tensor.detach()
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
            if tensor.numel():
                flat = tensor.reshape(-1).contiguous().cpu()
                digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def weights_fingerprint(model_or_path: Any) -> str:
    """Fingerprint of a model's weights, every byte of them.

    A local checkpoint directory: its weight files (``WEIGHT_SUFFIXES``) in full. A model
    object: its ``state_dict`` tensors in full (never the files it was loaded from: its
    weights may have changed since). A name that is not a local directory (a hub id): the
    name itself (pin a revision by downloading it).
    """
    if isinstance(model_or_path, (str, Path)):
        directory = Path(model_or_path).expanduser()
        files = weight_files(directory) if directory.is_dir() else []
        if files:
            return files_fingerprint(files)
        return json_digest({"path": str(model_or_path)})
    model = model_or_path
    while hasattr(model, "module") and hasattr(model.module, "state_dict"):
        model = model.module  # DDP / DeepSpeed engine wrappers
    return tensors_fingerprint(model.state_dict().items())


__all__ = [
    "HASHED",
    "WEIGHT_SUFFIXES",
    "file_digest",
    "files_fingerprint",
    "json_digest",
    "remembered",
    "tensors_fingerprint",
    "weight_files",
    "weights_fingerprint",
]

