"""What every stage does at its edges: announce its output, record completion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from align.config import to_dict
from align.errors import ConfigError, InputError, MissingInputError
from align.io import STAGE_COMPLETE_MARKER, mark_stage_complete, stage_completion_info
from align.io.records import looks_local
from align.manifests import Begun, completion_fields, redact

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
    info = stage_completion_info(path)
    if info is None:
        if (path / "_job.json").exists() or any(path.glob("shard-*-of-*.jsonl")):
            raise InputError(
                f"{stage}: {key}={str(path)!r} is an unfinished stage output (no {STAGE_COMPLETE_MARKER}): "
                "finish the stage that writes it first (rerun it; for a SLURM array, every task)"
            )
        return
    if info.get("stage") in DATA_FILES:
        wanted = path / DATA_FILES[info["stage"]]
        raise InputError(
            f"{stage}: {key}={str(path)!r} is the {info['stage']} stage's output, which holds more than one "
            f"kind of row; name the file instead: {key}={wanted}"
        )


def check_input_exists(path: str | Path, stage: str, key: str) -> None:
    """A missing local input is an error naming the key, not a hub lookup failing deep in `datasets`."""
    if not str(path).strip():
        raise ConfigError(f"{stage}: set {key} (an empty path is never read as the current directory)")
    if not Path(path).exists() and looks_local(str(path)):
        raise MissingInputError(f"{stage}: {key}={str(path)!r} does not exist")


def check_model_path(model: str | Path | None, stage: str, key: str) -> None:
    """A model given as a local path must be a directory with a config.json.

    (A hub name, ``org/name``, is left to ``from_pretrained``.) Without this check a
    missing directory surfaces as the hub client refusing it as a repo id.
    """
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


def check_output_dir(path: str | Path, stage: str, key: str = "output_dir") -> None:
    """An output directory that cannot be created or written is an error before any work."""
    import os

    path = Path(path)
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise InputError(f"{stage}: {key}={str(path)!r}: {str(ancestor)!r} is a file, not a "
                                 "directory")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise InputError(f"{stage}: {key}={str(path)!r}: {str(ancestor)!r} is not writable")
            return


def read_input(path: str | Path, stage: str, key: str) -> list[dict[str, Any]]:
    """A stage's input rows: checked (exists, finished), not empty; ``align.io.read_records``
    refuses an id on two rows, naming both places."""
    from align.io import read_records

    check_input_exists(path, stage, key)
    check_stage_input(path, stage, key)
    rows = read_records(path)
    if not rows:
        raise InputError(f"{stage}: {key}={str(path)!r} holds no rows")
    return rows


def keep_hub_token_out_of_outputs(config: Any) -> None:
    """Move a ``hub_token`` setting into ``$HF_TOKEN`` for this process.

    The Trainer pickles its arguments into every checkpoint and the saved model
    (``training_args.bin``); a token left there would sit in plain text under output_dir.
    The hub client reads ``$HF_TOKEN``, so ``push_to_hub`` still works.
    """
    import os

    token = getattr(config, "hub_token", None)
    if token:
        os.environ["HF_TOKEN"] = token
        config.hub_token = None


def is_main_process() -> bool:
    """Rank 0 of a distributed launch (or a plain process): the one that writes markers."""
    import os

    return int(os.environ.get("RANK", "0")) == 0


def finish(stage: str, config: Any, output_dir: str | Path, summary: dict[str, Any],
           begun: Begun | None = None, *, job: bool = False) -> dict[str, Any]:
    """Mark the output complete with the config (secrets removed), its manifest and the summary.

    A trainer's ranks all finish the same run: only the main process writes. A sharded job
    (``job``: sample, annotate, evaluate) is complete when its last shard lands, on whichever
    rank or array task that is: that one writes, with an output id drawn from the shards'
    done markers, so two processes finishing together write the same id.
    """
    if not (job or is_main_process()):
        return summary
    output_id = None
    if job:
        from align.io.fingerprint import json_digest

        markers = sorted(Path(output_dir).rglob("shard-*.done.json"))
        output_id = json_digest([[str(p.relative_to(output_dir)), p.read_text()] for p in markers])[:32]
    fields = completion_fields(begun)
    if output_id and fields:
        fields["output_id"] = output_id
    mark_stage_complete(output_dir, stage=stage, config=redact(to_dict(config)), summary=redact(summary),
                        **fields)
    print(f"[align {stage}] wrote {output_dir}")
    print(f"[align {stage}] " + json.dumps(summary, default=str))
    return summary
