"""Writes the disk refuses: full (ENOSPC, EDQUOT) or not writable (EROFS, EACCES, EPERM).

A stage writes in steps that a rerun resumes: job shards hold whole lines (a line cut short
is dropped when the shard is opened again), every other file is replaced atomically (a
temp file, then a rename), and a trainer resumes from its last whole checkpoint. So a disk
that fills up, or turns read-only, in the middle of a run costs the write in flight and
nothing else. ``writing`` turns the error of that write into one line that names the path,
what to free or make writable, and that a rerun resumes: from Python (``OSError``), or from
a library that writes by itself (safetensors' ``SafetensorError`` carries the OS error code
in its text; torch's stream writer carries none, and counts as a full disk when the file
system holding the output has less than ``NEARLY_FULL`` bytes left).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from align.errors import AlignError, DiskFullError, NotWritableError

FULL = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT"}
NOT_WRITABLE = {errno.EROFS: "EROFS", errno.EACCES: "EACCES", errno.EPERM: "EPERM"}
NEARLY_FULL = 1 << 20  # bytes left on a file system that a write without an error code counts as full
_OS_CODE = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")
_TORCH_WRITER = re.compile(r"PytorchStreamWriter failed|inline_container\.cc.*(unexpected pos|file write failed)")
RESUMES = "then run the same command again: it resumes from what was written"


def size_text(count: int) -> str:
    """Bytes as people read them (``1.5 GiB``)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def free_bytes(path: str | Path) -> int | None:
    """Bytes this user may still write on the file system holding ``path`` (its nearest existing
    ancestor), or None where the file system does not say."""
    for place in (Path(path), *Path(path).parents):
        try:
            stat = os.statvfs(place)
        except OSError:
            continue
        return stat.f_bavail * stat.f_frsize
    return None


def _inside(path: str, directory: str | Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real == top or real.startswith(top + os.sep)


def write_error_code(exc: BaseException, output_dir: str | Path | None) -> tuple[int, str | None] | None:
    """(errno, the path it names) of a refused write in ``exc`` or the exceptions behind it, else None.

    EACCES and EPERM count only for a path inside ``output_dir`` (elsewhere they may be a
    read); a code in an error's text counts only for ENOSPC, EDQUOT and EROFS, which no read gives.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL:
            return exc.errno, _name(exc.filename)
        if isinstance(exc, OSError) and exc.errno in NOT_WRITABLE:
            path = _name(exc.filename)
            if exc.errno == errno.EROFS or (path is not None and output_dir is not None and _inside(path, output_dir)):
                return exc.errno, path
        elif not isinstance(exc, OSError):
            found = _text_code(str(exc), output_dir)
            if found is not None:
                return found, None
        exc = exc.__cause__ or exc.__context__
    return None


def _name(filename: object) -> str | None:
    return os.fsdecode(filename) if isinstance(filename, (str, bytes)) else None


def _text_code(text: str, output_dir: str | Path | None) -> int | None:
    """The code of a write error a library reports as text (safetensors), or ENOSPC for torch's
    stream writer failing on a file system with (nearly) nothing left."""
    for match in _OS_CODE.finditer(text):
        code = int(match.group(1) or match.group(2))
        if code in FULL or code == errno.EROFS:
            return code
    if output_dir is not None and _TORCH_WRITER.search(text):
        left = free_bytes(output_dir)
        if left is not None and left < NEARLY_FULL:
            return errno.ENOSPC
    return None


def disk_full_message(stage: str, output_dir: str | Path, code: int, path: str | None = None,
                      needs: int | None = None) -> str:
    """What a full disk (or quota) stops: the path, what to free and where, that a rerun resumes."""
    holder = output_dir if path is None or _inside(path, output_dir) else os.path.dirname(path) or "."
    left = free_bytes(holder)
    now = f"{size_text(left)} free now" if left is not None else "free space unknown"
    need = f"; the stage needs about {size_text(needs)} there to save its model" if needs else ""
    what = ("the disk quota is used up" if code == errno.EDQUOT else "no space left on the device")
    free = ("free some of your quota (or ask for more) on the file system holding" if code == errno.EDQUOT
            else "free space on the file system holding")
    return (f"{stage}: {what} writing {path or output_dir} ({FULL[code]}): {free} {holder} ({now}{need}), "
            f"{RESUMES}")


def not_writable_message(stage: str, path: str | Path, code: int) -> str:
    """What a read-only or refused write stops: the path, how to make it writable, that a rerun resumes."""
    why = {errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied (no write permission)",
           errno.EPERM: "operation not permitted (an immutable file: chattr -i it)"}[code]
    return (f"{stage}: {path} cannot be written: {why} ({NOT_WRITABLE[code]}): make it writable (a read-only "
            f"mount: remount it read-write) or choose another output_dir, {RESUMES}")


def disk_error(stage: str, output_dir: str | Path, exc: BaseException,
               needs: Callable[[], int | None] | None = None) -> AlignError | None:
    """The one-line error for a write the disk refused, or None where ``exc`` is no such write."""
    found = write_error_code(exc, output_dir)
    if found is None:
        return None
    code, path = found
    if code in FULL:
        error: AlignError = DiskFullError(disk_full_message(stage, output_dir, code, path,
                                                            needs() if needs is not None else None))
    else:
        error = NotWritableError(not_writable_message(stage, path or output_dir, code))
    error.errno = code  # type: ignore[attr-defined]
    return error


@contextlib.contextmanager
def writing(stage: str, output_dir: str | Path | None,
            needs: Callable[[], int | None] | None = None) -> Iterator[None]:
    """Around a stage's writes into ``output_dir``: a write the disk refuses becomes ``DiskFullError``
    or ``NotWritableError`` (``needs``: the bytes the stage needs there, where it knows)."""
    try:
        yield
    except AlignError:
        raise
    except Exception as exc:
        error = disk_error(stage, output_dir, exc, needs) if output_dir is not None else None
        if error is None:
            raise
        raise error from exc
