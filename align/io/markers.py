"""Completion markers: when a stage's output, and when a job's shards, are finished.

Two kinds, for two questions:

* **Stage markers.** A stage's output directory is complete when it holds
  ``_COMPLETE.json`` (``STAGE_COMPLETE_MARKER``, written last, atomically, with the
  stage's config and summary). ``align pipeline`` skips complete stages, so a killed
  pipeline resumes at the first incomplete one. ``stage_is_complete(output_dir)``.
* **Job markers.** Each shard of a job (``align.jobs.run_job``) writes
  ``shard-0000i-of-0000N.done.json`` when it holds all of its records.
  ``job_is_complete(output_dir, records, num_shards)``: every shard done and exactly
  these ids written. A stage running a job writes its stage marker once this holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.errors import InputError
from align.io.files import atomic_write, write_json
from align.io.shards import SHARD_RE, ids_of, iter_lines, shard_files, shard_name

STAGE_COMPLETE_MARKER = "_COMPLETE.json"


# --------------------------------------------------------------------------- stage markers


def mark_stage_complete(output_dir: str | Path, **info: Any) -> Path:
    """Record that a stage finished writing ``output_dir`` (the last thing a stage does)."""
    return write_json(Path(output_dir) / STAGE_COMPLETE_MARKER, {"finished_at": time.time(), **info})


def stage_is_complete(output_dir: str | Path) -> bool:
    """Whether a stage already finished writing ``output_dir``."""
    return (Path(output_dir) / STAGE_COMPLETE_MARKER).is_file()


def stage_completion_info(output_dir: str | Path) -> dict[str, Any] | None:
    """The metadata a finished stage left, or None when it has not finished."""
    marker = Path(output_dir) / STAGE_COMPLETE_MARKER
    if not marker.is_file():
        return None
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{marker}: not a completion marker (not valid JSON: {exc}); remove it to run the "
                         "stage that wrote it again") from None
    shapes = {"stage": str, "manifest": dict, "manifest_fingerprint": str, "output_id": str, "files": dict,
              "summary": dict}
    wrong = [k for k, kind in shapes.items() if isinstance(info, dict) and info.get(k) is not None
             and not isinstance(info[k], kind)]
    if not isinstance(info, dict) or wrong:
        raise InputError(f"{marker}: not a completion marker ({'not a JSON object' if not isinstance(info, dict) else f'{wrong} of the wrong type'}); "
                         "remove it to run the stage that wrote it again")
    return info


# --------------------------------------------------------------------------- job (shard) markers


def shard_done_path(output_dir: Path, shard_index: int, num_shards: int) -> Path:
    """The marker that says a shard holds all of its records."""
    return output_dir / shard_name(shard_index, num_shards).replace(".jsonl", ".done.json")


def mark_shard_done(output_dir: Path, shard_index: int, num_shards: int, payload: Mapping[str, Any]) -> Path:
    """Write a shard's done marker (sorted keys, no final newline)."""
    return atomic_write(shard_done_path(output_dir, shard_index, num_shards),
                        lambda handle: json.dump(payload, handle, indent=2, sort_keys=True))


def job_is_complete(
    output_dir: str | Path,
    records_or_ids: Sequence[Any] | Any,
    num_shards: int,
    *,
    id_field: str = "id",
) -> bool:
    """True when every shard has its done marker and the output holds exactly these ids."""
    output_dir = Path(output_dir)
    files = shard_files(output_dir)
    if any(int(SHARD_RE.match(p.name).group(2)) != num_shards for p in files):
        return False
    if not all(shard_done_path(output_dir, i, num_shards).exists() for i in range(num_shards)):
        return False
    written: list[str] = [r.get(id_field) for p in files for _, r in iter_lines(p)]
    return len(written) == len(set(written)) and set(written) == set(ids_of(records_or_ids, id_field))
