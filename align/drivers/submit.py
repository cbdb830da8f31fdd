"""Every step of a recipe as SLURM jobs, each held until the steps it reads succeeded.

Reads the same recipe as ``align pipeline`` (any shape; rounds included) and submits what
is not done yet: sampling, annotation and evaluation as job arrays (``slurm.array`` shards,
one task each), SFT, the log-prob pass and preference training as one launch over
``slurm.nodes`` nodes (one ``accelerate launch`` per node), the other steps as one task.
Each job waits for the jobs of the steps it reads (``--dependency=afterok``,
``--kill-on-invalid-dep=yes``): independent steps (the reward model's and the judge's
annotation) run side by side, and a failed step cancels every step that reads it.

What is done comes from the steps' outputs, as ``align status`` reads them: a step whose
output is complete and current is not submitted; a sharded step that is partly done gets an
array of its missing shards only; a step whose job (from an earlier ``align submit``) is
still queued or running is not submitted again, and the steps after it wait for that job. So
after a failure, fix the cause and run the same command again. Steps whose outputs were made
from other settings (or edited since) stop the submission, all of them named at once;
``overwrite=true`` removes what each of them wrote, here, before submitting, and submits
them again.

The recipe is read as a login node reads it: no device is checked here (a training step's
``bf16`` is checked by its job). Every file a job opens before align does (its Python, the
accelerate config, the launch script) and every input no earlier step makes is checked now.

Everything goes to ``slurm.log_dir``: the recipe as submitted (``recipe-HASH.yaml``,
overrides merged, stage files of ``from:`` included, secrets left out: jobs read tokens from
the environment, e.g. ``HF_TOKEN``), one batch script per step (``N-STEP.sbatch``, each
submittable alone), the job logs (``STEP-JOBID.out``, ``STEP-JOBID_TASK.out``) and the job
ids (``jobs.json``). Each job runs the Python ``slurm.python`` names for its step
(docs/slurm.md: the vLLM steps in the vLLM environment, training in the training one). With
``dry_run=true`` the scripts and ``submit.sh`` (the sbatch commands, chained) are written and
nothing is submitted.

Example: ``align submit recipes/apertus-8b/pipeline.yaml`` (docs/slurm.md), or
``align submit recipes/tiny/pipeline.yaml dry_run=true``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from align.drivers.args import recipe_from_args
from align.drivers.submit_checks import (
    code_snapshot,
    fetch_models,
    fit_time_limits,
    hub_cache,
    hub_models,
    partition_limits_or_none,
    required_problems,
    unset_variables,
    url_credentials,
)
from align.errors import ConfigError, InputError
from align.io import write_json
from align.io.records import looks_local
from align.manifests import redact
from align.manifests.lifecycle import input_paths
from align.manifests.settings import flatten, init_settings, is_path_key
from align.manifests.state import (
    recorded_manifest,
    remove_stage_output,
    started_manifest,
    unreadable_manifest,
)
from align.manifests.status import Outputs, StepState, shard_list, step_state
from align.recipe import PipelineSettings, Recipe, Step
from align.slurm import SHIPPED_SCRIPTS, StepJob, active_jobs, dependency_options, sbatch

JOBS_FILE = "jobs.json"


@dataclass
class Config(PipelineSettings):
    """The recipe to submit (``align pipeline``'s keys, its ``slurm:`` section included)."""

    dry_run: bool = field(default=False, metadata={
        "help": "write the job scripts and submit.sh to slurm.log_dir; submit nothing, remove nothing"})


@dataclass
class Submission:
    recipe: Recipe
    dry_run: bool = False


@dataclass(frozen=True)
class Planned:
    """What to do for one step: submit ``job``, wait for a queued ``job_id``, or nothing."""

    step: str
    note: str
    job: StepJob | None = None
    job_id: str | None = None
    needs: tuple[str, ...] = ()


def config_from_args(args: Sequence[str]) -> Submission:
    """``align submit RECIPE [key=value ...] [dry_run=true]``: the recipe read as a login node reads it."""
    dry = [a for a in args if a.split("=", 1)[0].strip() == "dry_run"]
    rest = [a for a in args if a not in dry]
    dry_run = False
    if dry:
        value = yaml.safe_load(dry[-1].split("=", 1)[1]) if dry[-1].split("=", 1)[1].strip() else None
        if not isinstance(value, bool):
            raise ConfigError(f"dry_run: expected true/false, got {value!r}")
        dry_run = value
    return Submission(recipe_from_args("submit", rest), dry_run)


def read_jobs(log_dir: Path) -> dict[str, dict[str, Any]]:
    """The jobs an earlier ``align submit`` recorded in ``log_dir``: step -> {job_id, ...}."""
    path = log_dir / JOBS_FILE
    if not path.exists():
        return {}
    try:
        jobs = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); remove it to submit afresh") from None
    return jobs if isinstance(jobs, dict) else {}


def write_recipe(recipe: Recipe, log_dir: Path) -> Path:
    """The recipe as submitted (overrides merged, ``from:`` files included, secrets left out, no overwrite),
    named by its content: the file every job reads."""
    data = {k: v for k, v in redact(recipe.raw).items() if k != "overwrite"}
    if recipe.kind == "stage":  # a stage file: one step, written where its config says
        step = recipe.steps[0]
        data["steps"][step.name].setdefault("output_dir", recipe.config(step).output_dir)
    text = yaml.safe_dump(data, sort_keys=False)
    path = log_dir / f"recipe-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    if not path.exists():
        path.write_text("# Written by `align submit`: the recipe the jobs of this directory run.\n" + text)
    return path


def stale_refusal(stale: list[tuple[Step, StepState]], source: str) -> InputError:
    """One refusal naming every step whose output was made from something else."""
    lines = [f"  {step.name} ({step.output_dir}): {'; '.join(state.reasons) or state.state}" for step, state in stale]
    return InputError(f"{len(stale)} step(s) hold outputs made from other settings or inputs, or edited since:\n"
                      + "\n".join(lines) + f"\nRedo them on the cluster with `align submit {source} overwrite=true` "
                      "(each step's output loses only what that step wrote), or give them other output_dirs")


def missing_inputs(recipe: Recipe) -> list[str]:
    """Inputs that no step makes and that do not exist here (each as ``step.key=path``)."""
    made = [os.path.abspath(s.output_dir) for s in recipe if s.output_dir]
    missing = []
    for step in recipe:
        config = recipe.config(step)
        for key, value in flatten(init_settings(config)).items():
            values = value if isinstance(value, list) and all(isinstance(v, str) for v in value) else [value]
            for item in values:
                if not (isinstance(item, str) and item and is_path_key(key) and looks_local(item)):
                    continue
                if key.rsplit(".", 1)[-1] == "resume_from_checkpoint":
                    continue
                path = os.path.abspath(os.path.expanduser(item))
                if any(path == m or path.startswith(m + os.sep) for m in made):
                    continue
                if not os.path.exists(path):
                    missing.append(f"{step.name}.{key}={item}")
    return missing


def plan(recipe: Recipe, states: dict[str, StepState], recipe_path: Path, workdir: Path, log_dir: Path,
         scripts_dir: Path, queued: dict[str, str], jobs: dict[str, dict[str, Any]], code: Path | None = None
         ) -> list[Planned]:
    """Each step's plan from its output's state."""
    planned = []
    shards_of: dict[str, int] = {}
    for step in recipe:
        state = states[step.name]
        if state.state == "done":
            planned.append(Planned(step.name, "done, not submitted"))
            continue
        previous = str((jobs.get(step.name) or {}).get("job_id"))
        if previous in queued:
            planned.append(Planned(step.name, f"job {previous} is still {queued[previous].lower()}: not submitted "
                                   "again", job_id=previous, needs=step.needs))
            continue
        settings = recipe.settings.slurm.for_stage(step.stage, step.base, step.name)
        kind = step.job_kind()
        shards: tuple[int, ...] = ()
        count = settings.array
        extra: tuple[str, ...] = ()
        note = state.state
        if kind == "array":
            if state.shards:  # the count the output was started with, whatever the recipe says now
                count, missing = state.shards
                shards = tuple(missing)
                note = f"partial: shards {shard_list(missing)} of {count} missing"
            else:
                shards = tuple(range(count))
            shards_of[step.name] = count
        elif step.phase == "report":  # the evaluation's report: one task over the array's shards
            base = step.name.removesuffix(".report")
            count = shards_of.get(base) or _recorded_shards(Path(step.output_dir or ".")) or settings.array
            extra = ("shard_index=0", f"num_shards={count}")
        job = StepJob(step.name, step.stage, kind, replace(settings), recipe_path, workdir, log_dir, scripts_dir,
                      shards, count, extra, code)
        planned.append(Planned(step.name, note, job=job, needs=step.needs))
    return planned


def _recorded_shards(output_dir: Path) -> int | None:
    from align.manifests.status import missing_shards

    found = missing_shards(output_dir / "generations") if (output_dir / "generations").is_dir() else None
    return found[0] if found else None


def _missing_files(planned: list[Planned]) -> list[str]:
    """Every file a job opens before align does that is missing now (or a Python that does not run)."""
    problems = []
    for item in planned:
        if item.job is None:
            continue
        for what, path in item.job.files_needed().items():
            if what == "recipe":
                continue
            if not path.exists():
                problems.append(f"{item.step}: {what} {path} does not exist")
            elif what == "python" and not os.access(path, os.X_OK):
                problems.append(f"{item.step}: python {path} is not executable")
    return problems


def _redo(stale: list[tuple[Step, StepState]], dry_run: bool) -> None:
    """``overwrite=true``: remove what each stale step wrote, here, before its job is submitted again."""
    for step, _ in stale:
        output_dir = Path(step.output_dir or "")
        if not output_dir.is_dir():
            continue
        _, found = recorded_manifest(output_dir)
        if found is None and unreadable_manifest(output_dir) is None:  # a cut-off manifest: its ledger still says
            raise InputError(f"{step.name}: {output_dir} was written without a manifest (an earlier version of "
                             "align): what it holds is unknown, so it is not removed; remove it yourself")
        if dry_run:
            print(f"[align submit] {step.name}: overwrite=true would remove what the step wrote in {output_dir}")
            continue
        from align.io import stage_completion_info
        from align.manifests.state import MANIFEST_FILE

        removed, kept = remove_stage_output(output_dir, started_manifest(output_dir), stage_completion_info(output_dir))
        (output_dir / MANIFEST_FILE).unlink(missing_ok=True)
        print(f"[align submit] {step.name}: overwrite=true: removed the {len(removed)} entries the step wrote in "
              f"{output_dir}" + (f"; kept {', '.join(kept[:5])}" if kept else ""))


def run(submission: Submission | Recipe) -> dict[str, str]:
    """Submit the steps that are not done, each after the steps it reads; {step: job id}."""
    if isinstance(submission, Recipe):
        submission = Submission(submission)
    recipe, dry_run = submission.recipe, submission.dry_run
    settings = recipe.settings
    workdir = Path.cwd().resolve()
    log_dir = (workdir / settings.slurm.log_dir).resolve()
    scripts_dir = (workdir / settings.slurm.scripts_dir).resolve()
    if any(step.job_kind() == "launch" for step in recipe):
        absent = [name for name in SHIPPED_SCRIPTS if not (scripts_dir / name).is_file()]
        if absent:
            raise ConfigError(f"slurm.scripts_dir: {scripts_dir} lacks {absent} (the repository's recipes/slurm; "
                              "run align submit from the repository root or set slurm.scripts_dir)")
    problems = [f"inputs that no step makes and that do not exist: {', '.join(m)}"] if (m := missing_inputs(recipe)) \
        else []
    jobs = read_jobs(log_dir)
    recorded = [str(entry.get("job_id")) for entry in jobs.values() if isinstance(entry, dict)]
    queued = {} if dry_run else active_jobs(recorded)

    outputs: Outputs = {}
    states = {step.name: step_state(step.stage, recipe.config(step), outputs) for step in recipe}
    stale = [(step, states[step.name]) for step in recipe if states[step.name].needs_redo]
    if stale and not settings.overwrite:
        raise stale_refusal(stale, recipe.source or "RECIPE")

    # everything that can refuse the submission comes before an overwrite removes anything
    log_dir.mkdir(parents=True, exist_ok=True)
    recipe_path = write_recipe(recipe, log_dir)
    code = None if dry_run else code_snapshot(log_dir)
    planned = plan(recipe, states, recipe_path, workdir, log_dir, scripts_dir, queued, jobs, code)
    problems += _missing_files(planned)
    problems += required_problems([p.job for p in planned if p.job], settings.slurm.required)
    problems += unset_variables(settings.slurm.env)
    problems += url_credentials(recipe)
    fitted, refused = fit_time_limits([p.job for p in planned if p.job], partition_limits_or_none)
    times = {job.step: job.settings.time for job in fitted}
    problems += refused
    if problems and not dry_run:
        raise ConfigError("the jobs would fail:\n  " + "\n  ".join(problems))
    for problem in problems:  # a dry run writes the scripts anyway, and says what a real submission refuses
        print(f"[align submit] dry run: a real submission would refuse: {problem}")
    for line in fetch_models(hub_models(recipe), hub_cache(settings.slurm.env), dry_run):
        print(f"[align submit] {line}")

    if stale:
        running = [step.name for step, _ in stale if str((jobs.get(step.name) or {}).get("job_id")) in queued]
        if running:
            raise InputError(f"overwrite=true: the jobs of {running} are still queued or running; cancel them first")
        _redo(stale, dry_run)
        if not dry_run:
            outputs = {}
            states = {step.name: step_state(step.stage, recipe.config(step), outputs) for step in recipe}
            planned = plan(recipe, states, recipe_path, workdir, log_dir, scripts_dir, queued, jobs, code)
    planned = [replace(p, job=replace(p.job, settings=replace(p.job.settings, time=times[p.step]))) if p.job else p
               for p in planned]
    return _submit(planned, recipe, recipe_path, workdir, log_dir, jobs, dry_run)


def _submit(planned: list[Planned], recipe: Recipe, recipe_path: Path, workdir: Path, log_dir: Path,
            jobs: dict[str, dict[str, Any]], dry_run: bool) -> dict[str, str]:
    submitted: dict[str, str] = {}
    ids: dict[str, str] = {}  # step -> the job id (or shell variable) the steps after it wait for
    chain = ["#!/bin/bash", (f"# Written by `align submit ... dry_run=true`: the jobs of {recipe_path.name}, each "
                             "after the steps it reads."), "set -euo pipefail", f"cd {shlex.quote(str(workdir))}"]
    submission_dir = log_dir / "submissions" / str(1 + sum(1 for _ in (log_dir / "submissions").glob("*"))
                                                  if (log_dir / "submissions").is_dir() else 1)
    for index, item in enumerate(planned, start=1):
        after = [ids[n] for n in item.needs if n in ids]
        if item.job is None:
            print(f"[align submit] {item.step}: {item.note}")
            if item.job_id is not None:
                ids[item.step] = item.job_id
            continue
        script = log_dir / f"{index}-{item.step}.sbatch"  # the latest; every submission's are kept apart
        script.write_text(item.job.script(recipe.source or recipe_path.name))
        kept = submission_dir / script.name
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(script.read_text())
        if dry_run:
            var = "JOB_" + "".join(c if c.isalnum() else "_" for c in item.step).upper()
            chain += [f"{var}=$(sbatch --parsable {' '.join(dependency_options(after))} {shlex.quote(str(script))})",
                      f'echo "{item.step}: job ${var}"']
            ids[item.step] = f"${var}"
            print(f"[align submit] {item.step} ({item.note}): wrote {script}")
            continue
        job_id = sbatch(script, after)
        waits = f", after job(s) {', '.join(after)}" if after else ""
        shards = f", array {shard_list(list(item.job.shards))} of {item.job.num_shards} shards" \
            if item.job.kind == "array" else ""
        print(f"[align submit] {item.step}: job {job_id}{shards}{waits} ({item.note}); logs "
              f"{item.job.logs_for(job_id)}")
        ids[item.step] = job_id
        submitted[item.step] = job_id
        jobs[item.step] = {"job_id": job_id, "script": str(kept), "logs": item.job.logs_for(job_id),
                           "recipe": str(recipe_path), "python": str(item.job.python),
                           "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_json(log_dir / JOBS_FILE, jobs)
    source = recipe.source or str(recipe_path)
    if dry_run:
        path = log_dir / "submit.sh"
        path.write_text("\n".join(chain) + "\n")
        print(f"[align submit] dry run: nothing submitted; `bash {path}` submits the scripts above")
    elif submitted:
        print(f"[align submit] {len(submitted)} job(s) submitted: squeue -j {','.join(submitted.values())}; "
              f"align status {source}")
    else:
        print(f"[align submit] nothing to submit; align status {source}")
    return submitted


__all__ = ["Config", "Planned", "Submission", "config_from_args", "input_paths", "plan", "run"]
