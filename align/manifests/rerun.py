"""The rerun rules every stage applies to its output directory.

* complete, same manifest: skip, said in one line;
* complete or partial, different manifest: stop, naming each difference
  (``train.loss_type: 'qrpo' → 'dpo'``, ``prompts (prompts.jsonl): content changed (3 rows
  differ, 1 added)``) and the two ways forward: another ``output_dir``, or ``overwrite=true``;
* partial, same manifest: resume (job shards skip finished ids, trainers resume from their
  last checkpoint);
* complete, same manifest, but a file it wrote changed since (``align.manifests.outputs``):
  stop, naming the file; ``overwrite=true`` redoes it;
* ``overwrite=true`` over a different (or changed) output: remove what that stage wrote (the
  entries its ledger and completion marker list, never anything else), then start afresh.
  An output written without a manifest (by an earlier version) is not removed: what it
  holds is unknown, so the user removes it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align import ranks
from align.errors import InputError
from align.io import stage_completion_info, write_json
from align.manifests.differences import explain
from align.manifests.inputs import row_digests
from align.manifests.manifest import Manifest, build_manifest
from align.manifests.outputs import changed_outputs
from align.manifests.state import (
    LOCK_FILE,
    MANIFEST_FILE,
    ROWS_FILE,
    locked,
    read_json,
    recorded_manifest,
    remove_stage_output,
    started_manifest,
    unreadable_manifest,
)


class StaleOutputError(InputError):
    """An output directory holds work made from other settings or inputs than this run's."""


def _forward(output_dir: Path) -> str:
    return (f"use another output_dir, or overwrite=true to remove what the stage wrote in {output_dir} "
            "and redo it")


@dataclass
class Begun:
    """What ``begin`` decided: ``skip`` (done, same manifest), else the manifest to finish with."""

    skip: bool
    manifest: Manifest
    output_dir: Path
    resumed: bool = False
    overwrite: bool = False  # remove an output of other settings in ``start``, once the inputs are checked
    redo: bool = False  # the output's manifest is this run's, but its files changed since: remove and redo


def begin(stage: str, config: Any, output_dir: str | Path, *, overwrite: bool = False) -> Begun:
    """Apply the rerun rules to ``output_dir`` before a stage reads its inputs (see the module doc).

    Skips, or stops with the differences; under ``overwrite`` it lets the stage go on, and
    ``start`` removes what the stage wrote once the inputs have been read and checked (a
    mistyped input path never costs a finished output), then records the manifest.
    """
    output_dir = Path(output_dir)
    manifest = build_manifest(stage, config)
    state, recorded = recorded_manifest(output_dir)
    same = recorded is not None and recorded.get("fingerprint") == manifest.fingerprint
    changed = changed_outputs(output_dir, (stage_completion_info(output_dir) or {}).get("files")) \
        if state == "complete" and same else []
    if state == "complete" and same and not changed:
        print(f"[align {stage}] {output_dir} is already complete; skipping (made from the same settings and inputs)")
        return Begun(True, manifest, output_dir)
    if changed:
        if not overwrite:
            raise StaleOutputError(f"{stage}: {output_dir} changed since it was made: {'; '.join(changed[:5])}"
                                   f"{f' and {len(changed) - 5} more' if len(changed) > 5 else ''}. "
                                   f"{_forward(output_dir)}")
        return Begun(False, manifest, output_dir, overwrite=True, redo=True)
    if state == "empty" or same:
        return Begun(False, manifest, output_dir, resumed=state == "partial")
    if recorded is not None and recorded.get("stage") not in (None, stage):
        raise StaleOutputError(f"{stage}: {output_dir} holds the {recorded.get('stage')} stage's output; choose "
                               "another output_dir (overwrite=true never removes another stage's output)")
    problem = unreadable_manifest(output_dir) if recorded is None else None
    if problem is not None:
        if overwrite:
            return Begun(False, manifest, output_dir, overwrite=True)
        raise StaleOutputError(f"{stage}: {output_dir} holds a partial output whose manifest ({MANIFEST_FILE}) is "
                               f"{problem}, so what it was made from is unknown: rerun with overwrite=true to remove "
                               f"what the stage wrote there and redo it, or remove {output_dir} yourself")
    if recorded is None:
        raise StaleOutputError(f"{stage}: {output_dir} holds a stage output written without a manifest (by an "
                               "earlier version of align), so what it was made from, and which of its files the "
                               "stage wrote, are unknown: remove it yourself, or use another output_dir")
    if not overwrite:
        problem = explain(stage, output_dir, recorded, manifest)
        what = "an output" if state == "complete" else "a partial output"
        raise StaleOutputError(f"{stage}: {output_dir} holds {what} made from other settings or inputs: "
                               + "; ".join(problem) + f". {_forward(output_dir)}")
    return Begun(False, manifest, output_dir, overwrite=True)


def start(begun: Begun, rows_by_key: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
    """Record the manifest (and a digest per input row) before the stage's first write.

    SLURM array tasks and the ranks of a launch share one directory: the first records it,
    the others find the same manifest; ranks other than 0 wait for rank 0's.
    """
    if begun.skip:
        return
    output_dir, manifest = begun.output_dir, begun.manifest
    if not ranks.is_writer():
        _wait_for_manifest(output_dir, manifest)
        return
    with locked(output_dir, manifest.stage):
        state, recorded = recorded_manifest(output_dir)  # again, under the lock: others may have started
        found = started_manifest(output_dir)
        if begun.redo or (state != "empty" and (recorded or {}).get("fingerprint") != manifest.fingerprint):
            if not begun.overwrite:  # another run started here since `begin` looked
                raise StaleOutputError(f"{manifest.stage}: {output_dir} now holds work of another run with other "
                                       f"settings or inputs (started while this one was reading its inputs). "
                                       f"{_forward(output_dir)}")
            removed, kept = remove_stage_output(output_dir, found, stage_completion_info(output_dir))
            print(f"[align {manifest.stage}] overwrite=true: removed the {len(removed)} entries the stage wrote in "
                  f"{output_dir}" + (f"; kept {len(kept)} it did not write: {', '.join(kept[:5])}" if kept else ""))
            # what is left now was not written by the stage (a user's files, the first run's or added since):
            # recorded as there before, so neither this run nor the next overwrite takes it for its own
            found = None
        if found is None or found.get("fingerprint") != manifest.fingerprint:
            # a new manifest: nothing in the directory now is this work's (a fresh start, the cleanup of an
            # overwrite, a run of other settings that stopped before writing), so all of it is kept as there before
            preexisting = sorted(p.name for p in output_dir.iterdir() if p.name not in (LOCK_FILE, ROWS_FILE))
            write_json(output_dir / MANIFEST_FILE, {**manifest.as_json(), "preexisting": preexisting,
                                                    "started_at": time.time()})
        wanted = {key: row_digests(rows) for key, rows in (rows_by_key or {}).items() if key in manifest.inputs}
        if wanted and wanted != read_json(output_dir / ROWS_FILE):
            write_json(output_dir / ROWS_FILE, wanted)


def _wait_for_manifest(output_dir: Path, manifest: Manifest, timeout: float = 1800.0) -> None:
    """Ranks other than 0 start once rank 0 has cleaned (if asked) and recorded this manifest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = started_manifest(output_dir)
        if found and found.get("fingerprint") == manifest.fingerprint:
            return
        time.sleep(0.2)
    raise TimeoutError(f"rank 0 did not record the manifest in {output_dir} within {timeout:.0f} s")


def completion_fields(begun: Begun | None) -> dict[str, Any]:
    """What ``_COMPLETE.json`` adds: the manifest, and a new output id (a re-made output is new bytes).

    Refuses to mark an output whose recorded manifest is no longer this run's (another run
    with other settings took the directory over while this one worked).
    """
    if begun is None:
        return {}
    found = started_manifest(begun.output_dir)
    if found is not None and found.get("fingerprint") != begun.manifest.fingerprint:
        raise StaleOutputError(f"{begun.manifest.stage}: {begun.output_dir} was taken over by a run with other "
                               "settings or inputs while this one worked; it is not marked complete. "
                               f"{_forward(begun.output_dir)}")
    return {"manifest": begun.manifest.as_json(), "manifest_fingerprint": begun.manifest.fingerprint,
            "output_id": uuid.uuid4().hex}
