"""Every stage of a pipeline recipe as SLURM jobs, each held until the one before succeeded.

Reads the same recipe as ``align pipeline`` and submits what is not done yet: sampling,
annotation and evaluation as job arrays (``slurm.array`` shards, one task each, through
recipes/slurm/annotate_array.sbatch), SFT, the log-prob pass and preference training over
``slurm.nodes`` nodes (one ``accelerate launch`` per node, through
recipes/slurm/train_multinode.sbatch), pairs and decontamination as one task. Each job
depends on the previous one (``--dependency=afterok``, ``--kill-on-invalid-dep=yes``): it
starts only once that one succeeded, and a failed stage cancels every later one.

What is done comes from the stages' outputs, as ``align status`` reads them: a stage whose
output is complete and current is not submitted; a sharded stage that is partly done gets an
array of its missing shards only; a stage whose job (from an earlier ``align submit``) is
still queued or running is not submitted again, the next stage waits for that job. So after
a failure, fix the cause and run the same command again. A stage whose output was made from
other settings stops the submission and names each difference.

Everything goes to ``slurm.log_dir``: the recipe as submitted (``recipe-HASH.yaml``, overrides
included; every job reads it), one batch script per stage (``N-STAGE.sbatch``, each
submittable alone), the job logs (``STAGE-JOBID.out``, ``STAGE-JOBID_TASK.out``) and the job
ids (``jobs.json``). Jobs run in the directory ``align submit`` ran in, with its environment
(``--export=ALL``; its python's directory first on PATH). With ``dry_run=true`` the scripts
and ``submit.sh`` (the sbatch commands, chained) are written and nothing is submitted.

Example: ``align submit recipes/tiny/pipeline.yaml`` (see docs/slurm.md), or
``align submit recipes/tiny/pipeline.yaml dry_run=true``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from align.config import to_dict
from align.errors import ConfigError, InputError
from align.io import write_json
from align.slurm import (
    SHIPPED_SCRIPTS,
    StageJob,
    active_jobs,
    array_spec,
    dependency_options,
    kind_of,
    sbatch,
)
from align.stages.pipeline import ORDER
from align.stages.pipeline import Config as PipelineConfig
from align.stages.status import missing_shards, stage_status

JOBS_FILE = "jobs.json"


@dataclass
class Config(PipelineConfig):
    """The pipeline recipe to submit (``align pipeline``'s keys, its ``slurm:`` section included)."""

    dry_run: bool = field(default=False, metadata={
        "help": "write the job scripts and submit.sh to slurm.log_dir; submit nothing"})


@dataclass(frozen=True)
class Planned:
    """What to do for one stage: submit ``job``, wait for a queued ``job_id``, or nothing."""

    stage: str
    note: str
    job: StageJob | None = None
    job_id: str | None = None


def write_recipe(config: Config, log_dir: Path) -> Path:
    """The recipe as submitted (overrides merged), named by its content: the file every job reads."""
    values = to_dict(config)
    recipe = {key: values[key] for key in ("defaults", *ORDER, "stop_after", "slurm") if values.get(key) is not None}
    text = yaml.safe_dump(recipe, sort_keys=False)
    path = log_dir / f"recipe-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    if not path.exists():
        path.write_text("# Written by `align submit`: the recipe the jobs of this directory run.\n" + text)
    return path


def read_jobs(log_dir: Path) -> dict[str, dict[str, Any]]:
    """The jobs an earlier ``align submit`` recorded in ``log_dir``: stage -> {job_id, ...}."""
    path = log_dir / JOBS_FILE
    if not path.exists():
        return {}
    try:
        jobs = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); remove it to submit afresh") from None
    return jobs if isinstance(jobs, dict) else {}


def plan(config: Config, recipe: Path, workdir: Path, log_dir: Path, scripts_dir: Path,
         queued: dict[str, str], jobs: dict[str, dict[str, Any]]) -> list[Planned]:
    """Each stage's plan from its output's state; refuses (naming why) before anything is submitted."""
    overrides: dict[str, tuple[str, str, str | None]] = {}
    planned = []
    for name, stage_config in config.stage_configs():
        state, reasons = stage_status(name, stage_config, overrides)
        where = getattr(stage_config, "output_dir", None)
        if state == "done":
            planned.append(Planned(name, "done, not submitted"))
            continue
        if state in ("stale", "partial, from other settings"):
            raise InputError(f"{name}: {where} was made from other settings or inputs ({'; '.join(reasons)}); "
                             f"remove it, set another {name}.output_dir, or redo it with `align pipeline RECIPE "
                             "overwrite=true`")
        previous = (jobs.get(name) or {}).get("job_id")
        if previous in queued:
            planned.append(Planned(name, f"job {previous} is still {queued[previous].lower()}: not submitted again",
                                   job_id=previous))
            continue
        settings = config.slurm.for_stage(name)
        shards: tuple[int, ...] = ()
        note = state
        if kind_of(name) == "array":
            progress = missing_shards(Path(where)) if state == "partial" else None
            if progress:  # the count the output was started with, whatever the recipe says now
                settings = replace(settings, array=progress[0])
                shards = tuple(progress[1])
                note = f"partial: shards {array_spec(list(shards))} of {progress[0]} missing"
            else:
                shards = tuple(range(settings.array))
        job = StageJob(name, settings, recipe, workdir, log_dir, scripts_dir, shards)
        planned.append(Planned(name, note, job=job))
    return planned


def _write_script(job: StageJob, index: int, source: str) -> Path:
    path = job.log_dir / f"{index}-{job.stage}.sbatch"
    path.write_text(job.script(source))
    return path


def run(config: Config) -> dict[str, str]:
    """Submit the stages that are not done, in order, each after the previous; {stage: job id}."""
    if getattr(config, "rounds", None) is not None:
        raise ConfigError("rounds: align submit submits each stage of a recipe once, and a recipe with rounds is "
                          "not submitted yet; run `align pipeline RECIPE` inside one allocation (docs/slurm.md)")
    if config.overwrite:
        raise ConfigError("overwrite=true: align submit redoes no stage made from other settings (array tasks "
                          "would remove each other's shards); redo it with `align pipeline RECIPE overwrite=true`, "
                          "or remove its output")
    workdir = Path.cwd().resolve()
    log_dir = (workdir / config.slurm.log_dir).resolve()
    scripts_dir = (workdir / config.slurm.scripts_dir).resolve()
    absent = [name for name in SHIPPED_SCRIPTS if not (scripts_dir / name).is_file()]
    if absent:
        raise ConfigError(f"slurm.scripts_dir: {scripts_dir} lacks {absent} (the repository's recipes/slurm; "
                          "run align submit from the repository root or set slurm.scripts_dir)")
    log_dir.mkdir(parents=True, exist_ok=True)
    recipe = write_recipe(config, log_dir)
    jobs = read_jobs(log_dir)
    recorded = [str(entry.get("job_id")) for entry in jobs.values() if isinstance(entry, dict)]
    queued = {} if config.dry_run else active_jobs(recorded)
    planned = plan(config, recipe, workdir, log_dir, scripts_dir, queued, jobs)

    submitted: dict[str, str] = {}
    chain = ["#!/bin/bash", (f"# Written by `align submit ... dry_run=true`: the jobs of {recipe.name}, "
                             "each after the one before."), "set -euo pipefail", f"cd {shlex.quote(str(workdir))}"]
    after: list[str] = []  # the job the next stage waits for (a shell variable in submit.sh)
    for item in planned:
        if item.job is None:
            print(f"[align submit] {item.stage}: {item.note}")
            if item.job_id is not None:
                after = [item.job_id]
            continue
        index = ORDER.index(item.stage) + 1
        script = _write_script(item.job, index, recipe.name)
        if config.dry_run:
            var = item.stage.upper()
            chain += [f"{var}=$(sbatch --parsable {' '.join(dependency_options(after))} {shlex.quote(str(script))})",
                      f'echo "{item.stage}: job ${var}"']
            after = [f"${var}"]
            print(f"[align submit] {item.stage} ({item.note}): wrote {script}")
            continue
        job_id = sbatch(script, after)
        waits = f", after job {after[0]}" if after else ""
        shards = f", array {array_spec(list(item.job.shards))} of {item.job.settings.array} shards" \
            if item.job.kind == "array" else ""
        print(f"[align submit] {item.stage}: job {job_id}{shards}{waits} ({item.note}); logs {item.job.logs_for(job_id)}")
        after = [job_id]
        submitted[item.stage] = job_id
        jobs[item.stage] = {"job_id": job_id, "script": str(script), "logs": item.job.logs_for(job_id),
                            "recipe": str(recipe), "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_json(log_dir / JOBS_FILE, jobs)
    if config.dry_run:
        path = log_dir / "submit.sh"
        path.write_text("\n".join(chain) + "\n")
        print(f"[align submit] dry run: nothing submitted; `bash {path}` submits the scripts above")
    elif submitted:
        print(f"[align submit] {len(submitted)} job(s) submitted: squeue -j {','.join(submitted.values())}; "
              f"align status {recipe}")
    else:
        print(f"[align submit] nothing to submit; align status {recipe}")
    return submitted
