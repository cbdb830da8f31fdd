"""What every stage does at its edges: announce its output, record completion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from align.config import to_dict
from align.io import COMPLETE_MARKER, completion_info, is_complete, mark_complete


def already_done(output_dir: str | Path, stage: str, *, overwrite: bool = False) -> bool:
    """True (and say so) when a stage's output is complete and not to be overwritten."""
    if is_complete(output_dir) and not overwrite:
        print(f"[align {stage}] {output_dir} is already complete; skipping (overwrite=true redoes it)")
        return True
    return False


# Stage outputs that hold more than one kind of row: reading the whole directory would mix
# them (skipped prompts into pairs, contaminated rows into the training set).
DATA_FILES = {"pairs": "pairs.jsonl", "decontaminate": "kept.jsonl"}


def check_stage_input(path: str | Path, stage: str, key: str) -> None:
    """Refuse a stage output directory that is unfinished, or that must be read by file.

    A directory holding job shards (``shard-*.jsonl``) or a job fingerprint (``_job.json``)
    but no completion marker is a stage still running, killed, or a SLURM array with tasks
    left: reading it would silently use a subset of the records. A finished ``pairs`` or
    ``decontaminate`` output holds two kinds of rows (pairs / skipped, kept / removed): the
    file to read must be named. Plain data directories and files are read as they are.
    """
    path = Path(path)
    if not path.is_dir():
        return
    info = completion_info(path)
    if info is None:
        if (path / "_job.json").exists() or any(path.glob("shard-*-of-*.jsonl")):
            raise ValueError(
                f"{stage}: {key}={str(path)!r} is an unfinished stage output (no {COMPLETE_MARKER}): "
                "finish the stage that writes it first (rerun it; for a SLURM array, every task)"
            )
        return
    if info.get("stage") in DATA_FILES:
        wanted = path / DATA_FILES[info["stage"]]
        raise ValueError(
            f"{stage}: {key}={str(path)!r} is the {info['stage']} stage's output, which holds more than one "
            f"kind of row; name the file instead: {key}={wanted}"
        )


def is_main_process() -> bool:
    """Rank 0 of a distributed launch (or a plain process): the one that writes markers."""
    import os

    return int(os.environ.get("RANK", "0")) == 0


def finish(stage: str, config: Any, output_dir: str | Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Mark the output complete with the config and summary, and print where it is.

    Only the main process writes; the others return the summary unmarked.
    """
    if not is_main_process():
        return summary
    mark_complete(output_dir, stage=stage, config=to_dict(config), summary=summary)
    print(f"[align {stage}] wrote {output_dir}")
    print(f"[align {stage}] " + json.dumps(summary, default=str))
    return summary
