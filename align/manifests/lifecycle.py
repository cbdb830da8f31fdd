"""``StageRun``: the one lifecycle every stage runs over its output directory.

A stage's work has edges that are the same for every stage: decide whether its output is
already made (and by what), read and check its inputs, clean what an overwrite replaces,
record what it is made from, write, and mark it complete with what it wrote. ``StageRun``
owns all of it, so a rule about reruns lives in one place::

    run = StageRun.begin("pairs", config)          # skip, resume, refuse, or start afresh
    if run.skip:
        return {}
    records = run.read("input")                    # checked: exists, finished, unchanged, not empty
    run.start()                                    # overwrite cleans here; the manifest is recorded
    ...                                            # the work (run.check_owner() before each write)
    return run.finish(summary)                     # the files it wrote, with their digests

The rules (each also in docs/bad-inputs.md):

* **one decision per launch**: under a distributed launch with a process group, rank 0
  alone fingerprints the inputs, verifies the files of the stage outputs it reads, and
  decides; the other ranks receive its decision. Within
  a run a file is hashed once (``align.io.fingerprint.remembered``), so the manifest and the
  log-prob pass's cache key share the weights' digests;
* **apart from its inputs**: ``output_dir`` may not be, hold, or sit inside an input or a
  model the stage reads;
* **one writer**: a stage that is not a sharded job holds ``.align-writer.lock`` from
  ``start`` to the end of its run; a second run into the directory is refused before it
  writes a byte, naming the first. A sharded job's tasks share the directory and lock their own shards; an
  overwrite waits for none of them: it is refused while any shard is being written;
* **a run that lost its directory stops**: ``check_owner`` (before each write, and at
  finish) refuses to go on once the directory's manifest is another run's;
* **overwrite removes what the stage wrote**: the entries its ledger recorded
  (``align.io.ledger``) and the files its completion marker lists, after every input was
  read and checked; nothing else in the directory is touched;
* **verified outputs**: ``_COMPLETE.json`` lists every file written with its digest
  (``align.manifests.outputs``); an output edited since is "changed since it was made";
* **a disk that refuses**: a complete and current output is skipped before its directory's
  writability is checked and without a lock file (a read-only mount holds finished work); a
  write that finds the disk full or read-only is one line naming the path, what to free and
  that the same command resumes (``align.io.disk.writing``, around the stage's writes); a lock
  file that is a directory, a link or cannot be opened is refused by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align import ranks, stage_table
from align.config import to_dict
from align.errors import ConfigError, InputError, MissingInputError, NotWritableError
from align.io import STAGE_COMPLETE_MARKER, mark_stage_complete, read_records, stage_completion_info
from align.io.disk import writing
from align.io.fingerprint import json_digest, remembered, weight_files
from align.io.ledger import close_ledger, note_names, open_ledger
from align.io.records import is_marker, looks_local
from align.jobs.runner import guard_writes
from align.manifests.outputs import changed_outputs, record_outputs
from align.manifests.redaction import redact
from align.manifests.rerun import Begun, StaleOutputError, begin, completion_fields, start
from align.manifests.settings import flatten, init_settings, looks_like_path
from align.manifests.state import MANIFEST_FILE, WRITER_LOCK, open_lock, read_json
from align.stage_table import data_file_of

# --------------------------------------------------------------------------- input checks


def check_input_exists(path: str | Path, stage: str, key: str) -> None:
    """A missing local input is an error naming the key, not a hub lookup failing deep in `datasets`."""
    if not str(path).strip():
        raise ConfigError(f"{stage}: set {key} (an empty path is never read as the current directory)")
    if not Path(path).expanduser().exists() and looks_local(str(path)):
        raise MissingInputError(f"{stage}: {key}={str(path)!r} does not exist")


def check_stage_input(path: str | Path, stage: str, key: str, *, verify: bool = True) -> None:
    """Refuse a stage output directory that is unfinished, changed since it was made, or that must be
    read by file.

    A directory holding job shards or a job fingerprint but no completion marker is a stage
    still running, killed, or a SLURM array with tasks left: reading it would silently use
    a subset of the records. A finished ``pairs`` or ``decontaminate`` output holds two kinds
    of rows: the file to read must be named. A finished output whose files were edited since
    is not read. ``verify=False``: the files' digests are left to the process that verified
    them (rank 0 of a launch checks them once for every rank).
    """
    path = Path(path).expanduser()
    directory = path if path.is_dir() else path.parent
    info = stage_completion_info(directory)  # None where there is no directory or no marker
    if info is None:
        if path.is_dir() and ((path / "_job.json").exists() or any(path.glob("shard-*-of-*.jsonl"))):
            raise InputError(
                f"{stage}: {key}={str(path)!r} is an unfinished stage output (no {STAGE_COMPLETE_MARKER}): "
                "finish the stage that writes it first (rerun it; for a SLURM array, every task)"
            )
        if path.is_file() and (directory / "_job.json").exists():  # a hub name is no file: left to the loader
            raise InputError(f"{stage}: {key}={str(path)!r} is a file of an unfinished stage output ({directory}): "
                             "finish the stage that writes it first")
        return
    changed = changed_outputs(directory, info.get("files")) if verify else []
    if changed:
        raise InputError(f"{stage}: {key}={str(path)!r}: the {info.get('stage')} stage's output changed since it "
                         f"was made ({'; '.join(changed[:5])}); rerun that stage (overwrite=true redoes it), or, to "
                         "read edited rows as data of your own, copy the data files (not the _*.json markers) to a "
                         "directory of their own and read that")
    data_file = data_file_of(info.get("stage"))
    if path.is_dir() and data_file is not None:
        wanted = path / data_file
        raise InputError(
            f"{stage}: {key}={str(path)!r} is the {info['stage']} stage's output, which holds more than one "
            f"kind of row; name the file instead: {key}={wanted}"
        )


def check_model_path(model: str | Path | None, stage: str, key: str) -> None:
    """A model given as a local path must be a directory with a config.json (a hub name,
    ``org/name``, is left to ``from_pretrained``)."""
    if not model:
        raise ConfigError(f"{stage}: set {key} (a model directory or name)")
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError(f"{stage}: {key}={str(model)!r} has no config.json (not a saved model)")
        return
    if looks_local(str(model)):
        raise MissingInputError(f"{stage}: {key}={str(model)!r} does not exist (a model directory, or a hub "
                                "name such as org/name)")


def check_output_dir(path: str | Path, stage: str, key: str = "output_dir", *, writable: bool = True) -> None:
    """An output directory that cannot be created is an error before any work; so is one that is a
    dangling or looping symbolic link, and (``writable``) one that cannot be written. A stage checks
    ``writable`` only once it knows it will write: a finished output on a read-only mount is skipped."""
    path = Path(path).expanduser()
    if path.is_symlink() and not path.exists():
        raise InputError(f"{stage}: {key}={str(path)!r} is a symbolic link to nothing (or to itself): point it "
                         "at a directory, or remove it")
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise InputError(f"{stage}: {key}={str(path)!r}: {str(ancestor)!r} is a file, not a directory")
            if writable:
                check_writable(path, ancestor, stage)
            return


def check_writable(path: Path, ancestor: Path, stage: str) -> None:
    """The nearest existing directory of ``output_dir`` may be written (a read-only mount or a
    directory without write permission is refused before any work, naming it)."""
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise NotWritableError(f"{stage}: output_dir={str(path)!r}: {str(ancestor)!r} is not writable (a read-only "
                               "mount, or no write permission): make it writable, or choose another output_dir")


def read_input(path: str | Path, stage: str, key: str) -> list[dict[str, Any]]:
    """A stage's input rows outside a ``StageRun`` (a sweep reads its inputs once for every point)."""
    check_input_exists(path, stage, key)
    check_stage_input(path, stage, key)
    rows = read_records(path)
    if not rows:
        raise InputError(f"{stage}: {key}={str(path)!r} holds no rows")
    return rows


def input_paths(config: Any) -> dict[str, str]:
    """Every setting of ``config`` that names a path it reads, and that exists here."""
    out = {}
    for key, value in flatten(init_settings(config)).items():
        values = value if isinstance(value, list) and all(isinstance(v, str) for v in value) else [value]
        for i, item in enumerate(values):
            name = key if len(values) == 1 else f"{key}[{i}]"
            if looks_like_path(name, item):  # the manifest's own rule for what is an input
                out[name] = item
    return out


def check_apart(stage: str, config: Any, output_dir: Path) -> None:
    """``output_dir`` is not an input of the stage, does not hold one, and is not inside one."""
    out = os.path.realpath(os.path.expanduser(str(output_dir)))
    for key, value in input_paths(config).items():
        real = os.path.realpath(os.path.expanduser(value))
        inside = real.startswith(out + os.sep)
        around = out.startswith(real + os.sep) and os.path.isdir(real)
        if real == out or inside or around:
            how = "is" if real == out else "holds" if inside else "is inside"
            raise ConfigError(f"{stage}: output_dir={str(output_dir)!r} {how} its input {key}={value!r}: writing "
                              "there would overwrite (or be read back as) what the stage reads; choose another "
                              "output_dir")


# --------------------------------------------------------------------------- the lifecycle

_HELD: dict[str, tuple[int, Any]] = {}  # writer locks this process holds: real path -> (descriptor, the run holding it)


class StageRun:
    """One stage's run over its output directory (see the module docstring)."""

    def __init__(self, stage: str, config: Any, *, output_dir: str | Path | None = None, job: bool = False,
                 overwrite: bool | None = None):
        self.stage = stage
        self.config = config
        target = output_dir if output_dir is not None else config.output_dir
        # None: an output kept under its cache key (the log-prob pass with cache_dir), made with no manifest
        self.output_dir = None if target is None else Path(target)
        self.job = job
        self.overwrite = bool(getattr(config, "overwrite", False)) if overwrite is None else overwrite
        self.rows: dict[str, list[dict[str, Any]]] = {}  # each input key's rows, read before start
        self.held: dict[str, Any] = {}  # what a stage's prepare read or decided, for its work
        self.begun: Begun | None = None
        self._memo: contextlib.ExitStack | None = None

    @classmethod
    def begin(cls, stage: str, config: Any, **kwargs: Any) -> StageRun:
        """Apply the rerun rules before any input is read (``run.skip``: complete and current)."""
        run = cls(stage, config, **kwargs)
        run._begin()
        return run

    @property
    def skip(self) -> bool:
        return bool(self.begun and self.begun.skip)

    @property
    def resumed(self) -> bool:
        return bool(self.begun and self.begun.resumed)

    def _begin(self) -> None:
        if self.output_dir is not None:
            check_output_dir(self.output_dir, self.stage, writable=False)  # written only if not skipped
            check_apart(self.stage, self.config, self.output_dir)
        self._memo = contextlib.ExitStack()
        self._memo.enter_context(remembered())
        if self.output_dir is None:  # a keyed output: nothing to decide here (its cache key decides)
            return
        if ranks.launch_group() is not None and not ranks.is_writer():
            decided = ranks.share(None)
            if decided.get("error"):
                self._end()
                raise InputError(f"{self.stage}: rank 0 stopped before the run started (its error is in its log)")
            self.begun = Begun(decided["skip"], None, self.output_dir, decided["resumed"])  # type: ignore[arg-type]
            if self.begun.skip:
                self._end()
            return
        self._decide()

    def _decide(self) -> None:
        """Rank 0 (or the only process) applies the rerun rules and shares what it decided; an output
        it will write must be writable (a complete and current one is skipped without writing)."""
        try:
            self.begun = begin(self.stage, self.config, self.output_dir, overwrite=self.overwrite)
            if not self.begun.skip:
                check_output_dir(self.output_dir, self.stage)
        except BaseException:
            if ranks.launch_group() is not None:
                ranks.share({"error": True})  # the other ranks raise on it, reading nothing else
            self._end()
            raise
        ranks.share({"skip": self.begun.skip, "resumed": self.begun.resumed})
        if self.begun.skip:
            self._end()

    def _take_writer_lock(self) -> None:
        """Hold ``.align-writer.lock`` for the whole run; refuse at once when another run holds it.

        A lock this process still holds from a run that raised (a notebook cell that failed)
        is taken over: that run is not writing any more.
        """
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / WRITER_LOCK
        key = os.path.realpath(path)
        if key in _HELD:  # the abandoned run keeps no claim on it: closing it later leaves the lock alone
            _HELD[key] = (_HELD[key][0], self)
            return
        fd = open_lock(path, self.stage)  # a directory, a link or an unwritable file there: refused by name
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise InputError(f"{self.stage}: another run is writing {self.output_dir} ({holder}); two runs never "
                             "write one output directory: wait for it to finish, or stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
                  .encode(), 0)
        _HELD[key] = (fd, self)

    def check(self, key: str, value: str | None = None) -> str:
        """An input the stage streams itself (too large to hold as rows): it exists, is finished and unchanged."""
        value = getattr(self.config, key) if value is None else value
        if not value:
            raise ConfigError(f"{self.stage}: set {key}")
        check_input_exists(value, self.stage, key)
        check_stage_input(value, self.stage, key, verify=ranks.launch_group() is None or ranks.is_writer())
        return str(value)

    def input_fingerprint(self, key: str) -> str:
        """The content fingerprint the manifest recorded for input ``key`` (rank 0's, on every rank)."""
        def compute() -> str:
            entry = (self.begun.manifest.inputs.get(key) if self.begun and self.begun.manifest else None) or {}
            return json_digest({k: v for k, v in entry.items() if k not in ("path", "files")})

        return ranks.on_rank_zero(compute)

    def read(self, key: str, value: str | Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The rows of input ``key`` (default: the config's value): it exists, is finished and unchanged, and
        holds rows; several paths are read as one input (an id on two rows is an error naming both)."""
        value = getattr(self.config, key) if value is None else value
        paths = [value] if isinstance(value, (str, Path)) else list(value or [])
        if not paths:
            raise ConfigError(f"{self.stage}: set {key}")
        rows: list[dict[str, Any]] = []
        seen: dict[str, str] = {}
        verify = ranks.launch_group() is None or ranks.is_writer()
        for path in paths:
            check_input_exists(path, self.stage, key)
            check_stage_input(path, self.stage, key, verify=verify)
            part = read_records(path)
            if not part and len(paths) == 1:
                raise InputError(f"{self.stage}: {key}={str(path)!r} holds no rows")
            for row in part:
                rid = row.get("id")
                if isinstance(rid, str) and rid:
                    if rid in seen:
                        raise InputError(f"{self.stage}: id {rid!r} is in {seen[rid]} and in {path}: the inputs of "
                                         f"{key} must hold other rows")
                    seen[rid] = str(path)
            rows += part
        if not rows:
            raise InputError(f"{self.stage}: {key}={[str(p) for p in paths]} hold no rows")
        self.rows[key] = rows
        return rows

    def start(self) -> None:
        """Record the manifest (the writer cleans first under ``overwrite``); the other ranks wait for it."""
        if self.begun is None or self.begun.skip:
            return
        dist = ranks.launch_group()
        if dist is not None and not ranks.is_writer():
            dist.barrier()
            return
        if not self.job:
            self._take_writer_lock()
        if self.begun.overwrite:  # only job outputs hold shard locks; elsewhere there is nothing to find
            _refuse_while_shards_are_written(self.stage, self.output_dir)
        start(self.begun, self.rows)
        open_ledger(self.output_dir)
        guard_writes(self.output_dir, self.check_owner)
        if dist is not None:
            dist.barrier()

    def check_owner(self) -> None:
        """Stop before writing when the directory's manifest is no longer this run's (another run took it)."""
        if self.begun is None or self.begun.manifest is None:
            return
        found = read_json(self.output_dir / MANIFEST_FILE)
        if found is None or found.get("fingerprint") != self.begun.manifest.fingerprint:
            raise StaleOutputError(f"{self.stage}: {self.output_dir} was taken over by another run (its manifest is "
                                   "no longer this run's); this run stops without writing there again")

    def finish(self, summary: dict[str, Any], *, config: Any = None, announce: bool = True) -> dict[str, Any]:
        """Mark the output complete: the settings (secrets removed), manifest, summary and the files written.

        A trainer's ranks all finish the same run: only the main process writes. A sharded
        job is complete when its last shard lands, on whichever task that is.
        """
        try:
            if not (self.job or ranks.is_writer()) or self.begun is None or self.begun.manifest is None:
                return summary
            self.check_owner()
            output_id = None
            if self.job:
                markers = sorted(self.output_dir.rglob("shard-*.done.json"))
                output_id = json_digest([[str(p.relative_to(self.output_dir)), p.read_text()] for p in markers])[:32]
            fields = completion_fields(self.begun)
            if output_id:
                fields["output_id"] = output_id
            names = _written_names(self.output_dir)
            note_names(self.output_dir, names)
            files = record_outputs(self.output_dir, names)
            mark_stage_complete(self.output_dir, stage=self.stage, config=redact(to_dict(config or self.config)),
                                summary=redact(summary), files=files, **fields)
            if announce:
                print(f"[align {self.stage}] wrote {self.output_dir}")
                print(f"[align {self.stage}] " + json.dumps(redact(summary), default=str))
            return summary
        finally:
            self._end()

    def close(self) -> None:
        """End the run without marking it complete (a shard of a job left to other tasks)."""
        self._end()

    def _end(self) -> None:
        if self.output_dir is not None:
            close_ledger(self.output_dir)
            guard_writes(self.output_dir, None)
        for key, (fd, holder) in list(_HELD.items()):
            if holder is self:  # a lock a later run took over is that run's to release
                del _HELD[key]
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        if self._memo is not None:
            self._memo.close()
            self._memo = None


def _written_names(output_dir: Path) -> list[str]:
    """The top-level entries this stage made: its ledger, and what is new since it started."""
    from align.io.ledger import written

    found = read_json(output_dir / MANIFEST_FILE) or {}
    before = set(found.get("preexisting") or [])
    new = [p.name for p in output_dir.iterdir() if p.name not in before and not is_marker(p.name)]
    return sorted(set(written(output_dir)) | set(new))


def _refuse_while_shards_are_written(stage: str, output_dir: Path) -> None:
    """An overwrite of a job output waits for no task: it is refused while any shard's lock is held."""
    for lock in sorted(output_dir.glob("shard-*-of-*.lock")):
        if lock.is_symlink():
            raise InputError(f"{stage}: overwrite=true, but {lock} is a symbolic link, not a lock this library "
                             "wrote; remove it (nothing was deleted)")
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            raise InputError(f"{stage}: overwrite=true, but {lock.name[:-5]} is being written by another task of "
                             f"{output_dir}; let it finish (or cancel it) first") from None
        finally:
            os.close(fd)


def redacted_settings(config: Any) -> Mapping[str, Any]:
    """The settings as written into markers and logs (secrets removed)."""
    return redact(to_dict(config))


# --------------------------------------------------------------------------- a stage inside its lifecycle


@dataclass
class Unfinished:
    """What a stage's work returns when its output is not complete yet (a job shard whose siblings are still
    running, a rank other than the writer): the run ends without marking the output, and ``summary`` is
    what the stage reports."""

    summary: dict[str, Any] = field(default_factory=dict)


def run_stage(name: str, config: Any, work: Callable[[StageRun], dict[str, Any] | Unfinished], *,
              prepare: Callable[[StageRun], None] | None = None) -> dict[str, Any]:
    """Run a stage's ``work`` inside the one lifecycle every stage shares.

    What the stage reads comes from its entry in ``align.stage_table``: each input key is
    checked to be set, then, after the rerun rules decided (skip, resume, refuse, redo), read
    (``rows``: every row, checked, in ``run.rows[KEY]``), checked (``stream``: the stage
    streams it) or looked up (``model``). ``prepare`` checks what only the stage knows, still
    before ``start`` may remove an earlier output. A stage launched over several ranks has
    its process group up before rank 0 decides for all. ``work`` returns the summary (the
    output is marked complete with it) or ``Unfinished``; an error ends the run, leaving the
    output unmarked and its lock released.
    """
    entry = stage_table.spec(name)
    for key, reads in entry.reads.items():
        if reads.how != "none" and not setting_at(config, key):
            raise ConfigError(f"{name}: set {key} ({reads.what}; an empty path is never read as the current "
                              "directory)")
    if entry.launches:
        ranks.start_process_group(config)
    run = StageRun.begin(name, config, job=entry.shards)
    if run.skip:
        return {}
    needs = (lambda: model_bytes(setting_at(config, "model_name_or_path"))) if entry.writes == stage_table.MODEL \
        else None
    try:
        for key, reads in entry.reads.items():
            value = setting_at(config, key)
            if reads.how == "rows":
                run.read(key)
            elif reads.how == "stream":
                run.check(key)
            elif reads.how == "model":
                check_model_path(value, name, key)
        with writing(name, run.output_dir, needs):  # a full or read-only disk: one line, and a rerun resumes
            if prepare is not None:
                prepare(run)
            run.start()
            result = work(run)
    except BaseException:
        run.close()
        raise
    if isinstance(result, Unfinished):
        run.close()
        return result.summary
    with writing(name, run.output_dir, needs):
        return run.finish(result)


def model_bytes(model: Any) -> int | None:
    """The bytes of a local model's weight files: about what saving the model trained from it takes."""
    if not isinstance(model, (str, Path)) or not Path(model).expanduser().is_dir():
        return None
    try:
        return sum(path.stat().st_size for path in weight_files(Path(model).expanduser())) or None
    except OSError:
        return None


def setting_at(config: Any, key: str) -> Any:
    """A config's value at a dotted key (``sampler.model``)."""
    value = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
    return value


def mark_complete_unmanaged(stage: str, config: Any, output_dir: str | Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Mark an output complete that has no manifest of its own (a sweep: each of its points has one)."""
    if not ranks.is_writer():
        return summary
    mark_stage_complete(output_dir, stage=stage, config=redact(to_dict(config)), summary=redact(summary))
    print(f"[align {stage}] wrote {output_dir}")
    print(f"[align {stage}] " + json.dumps(redact(summary), default=str))
    return summary
