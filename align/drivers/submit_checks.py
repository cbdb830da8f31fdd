"""What ``align submit`` settles on the login node before a job is queued, so that a job never waits for ever,
never downloads, and never runs other code than was submitted.

- **Required keys** (``slurm.required``: most clusters refuse a job without an account).
- **Time limits**: each job's ``time`` against its partition's maximum (``scontrol show
  partition``). SLURM accepts a longer request and leaves the job ``PENDING
  (PartitionTimeLimit)`` for good; here it is refused naming the maximum, or, with
  ``over_time_limit: chain``, asked for at the maximum and run as chained attempts (each
  saves and requeues itself at its limit, ``align.stopping``).
- **Models fetched once**: every hub id a step names is resolved into the cache its jobs
  read (``slurm.env``'s ``HF_HOME``) here; with ``HF_HUB_OFFLINE=1`` in ``slurm.env`` (the
  Apertus recipes) the jobs only read it: 16 judge tasks never download a 32B model each.
- **Variables**: a ``$VAR`` in ``slurm.env`` unset here is refused (the jobs take this
  shell's environment, and would run without it).
- **Keys**: a URL setting that carries credentials (``base_url: http://user:pw@host/v1``,
  ``?api_key=``) is refused: the recipe the jobs read leaves them out, so the jobs would reach
  the server without a key; the key goes in the variable ``api_key_env`` names.
- **Code frozen per submission**: the ``align`` the jobs run is a snapshot of this one
  (``log_dir/code/DIGEST``, first on the jobs' ``PYTHONPATH``); editing the checkout during a
  three-day run changes nothing, and a job checks it runs the snapshot (``ALIGN_CODE``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from align.errors import ConfigError, ServiceError
from align.io.fingerprint import file_digest, json_digest
from align.io.http import has_credentials, safe_url
from align.io.records import looks_local
from align.manifests.settings import flatten, init_settings
from align.recipe import Recipe
from align.slurm.commands import partition_max_time, slurm_seconds, slurm_time
from align.slurm.scripts import CODE_ENV

PACKAGES = ("align", "rewards", "charter")
MODEL_KEYS = frozenset({"model", "model_name_or_path", "ref_model_name_or_path", "tokenizer", "kl_reference_model"})
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


# --------------------------------------------------------------------------- required keys


def required_problems(jobs: Iterable[Any], required: Iterable[str]) -> list[str]:
    """One line per required job setting left unset, naming the steps that lack it."""
    jobs = list(jobs)
    lacking = {key: [job.step for job in jobs if getattr(job.settings, key) in (None, "")] for key in required}
    return [f"slurm.{key} is required by this recipe (slurm.required) and unset for "
            f"{'every job' if len(steps) == len(jobs) > 1 else steps}: set it, e.g. `align submit RECIPE "
            f"slurm.{key}=...`" for key, steps in lacking.items() if steps]


# --------------------------------------------------------------------------- time limits


def fit_time_limits(jobs: list[Any], max_time: Callable[[str | None], tuple[str, int | None]] = partition_max_time
                    ) -> tuple[list[Any], list[str]]:
    """Each job's time against its partition's maximum: (the jobs, a chained one asking for the maximum;
    the refusals)."""
    maxima: dict[str | None, tuple[str, int | None]] = {}
    out, problems = [], []
    for job in jobs:
        asked = slurm_seconds(job.settings.time)
        if asked is None:
            out.append(job)
            continue
        if job.settings.partition not in maxima:
            maxima[job.settings.partition] = max_time(job.settings.partition)
        partition, limit = maxima[job.settings.partition]
        if limit is None or asked <= limit:
            out.append(job)
        elif job.settings.over_time_limit == "chain":
            print(f"[align submit] {job.step}: time {job.settings.time} is over partition {partition}'s maximum "
                  f"{slurm_time(limit)}: asked for the maximum, run as chained attempts (each saves and requeues)")
            out.append(dataclasses.replace(job, settings=dataclasses.replace(job.settings, time=slurm_time(limit))))
        else:
            out.append(job)
            problems.append(f"{job.step}: time {job.settings.time} is over partition {partition}'s maximum "
                            f"{slurm_time(limit)} (SLURM would keep the job PENDING (PartitionTimeLimit) for good): "
                            f"set slurm.stages.{job.step}.time to at most that, or slurm.over_time_limit: chain to "
                            "run it as chained attempts")
    return out, problems


def partition_limits_or_none(partition: str | None) -> tuple[str, int | None]:
    """``partition_max_time`` where SLURM answers; where it cannot be asked (a dry run off the cluster), no limit."""
    try:
        return partition_max_time(partition)
    except ServiceError:
        return partition or "(default)", None


# --------------------------------------------------------------------------- models


def hub_models(recipe: Recipe) -> dict[str, list[str]]:
    """Hub id -> the ``step.key`` settings that name it: model keys whose value is no local path, no output of a
    step and no model a server holds (``backend: openai``)."""
    made = [os.path.realpath(step.output_dir) for step in recipe if step.output_dir]
    found: dict[str, list[str]] = {}
    for step in recipe:
        if step.phase:
            continue
        flat = flatten(init_settings(recipe.config(step)))
        for key, value in flat.items():
            leaf = re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])
            if leaf not in MODEL_KEYS or not isinstance(value, str) or not _HUB_ID.fullmatch(value):
                continue
            if _served(flat, key) or looks_local(value) or os.path.exists(value):
                continue
            if any(os.path.realpath(value).startswith(m) for m in made):
                continue
            found.setdefault(value, []).append(f"{step.name}.{key}")
    return found


def _served(flat: dict[str, Any], key: str) -> bool:
    """Whether the model a key names is held by a server (``backend: openai``): the backend of its own section,
    of that section's sampler (an evaluated policy's), or of the sections above it (the stage's sampler)."""
    parts = key.split(".")[:-1]
    for depth in range(len(parts), -1, -1):
        section = "".join(f"{p}." for p in parts[:depth])
        for backend in (f"{section}backend", f"{section}sampler.backend"):
            if flat.get(backend) is not None:
                return flat[backend] == "openai"
    return False


def url_credentials(recipe: Recipe) -> list[str]:
    """One line per setting whose URL carries credentials (``user:password@``, ``?api_key=``): the recipe the
    jobs read is written without them (``redact``), so a job would reach its server without the key."""
    problems = []
    for step in recipe:
        if step.phase:
            continue
        for key, value in flatten(init_settings(recipe.config(step))).items():
            if isinstance(value, str) and has_credentials(value):
                problems.append(f"{step.name}.{key}={safe_url(value)!r} carries credentials, and the recipe the "
                                "jobs read is written without them: give the URL without them and put the key in "
                                "an environment variable named by api_key_env (the jobs take this environment)")
    return problems


def unset_variables(env: dict[str, Any]) -> list[str]:
    """``KEY=$VAR`` entries of ``slurm.env`` whose variable is not set here: the jobs take this environment."""
    names = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
    return [f"slurm.env.{key}={value}: ${name} is not set here" for key, value in env.items()
            for name in names.findall(str(value)) if name not in os.environ]


def hub_cache(env: dict[str, Any]) -> str | None:
    """The cache the jobs read: ``HF_HOME`` (``HF_HUB_CACHE``) of the recipe's ``slurm.env``, expanded here; None:
    the default, as on this machine."""
    for key, sub in (("HF_HUB_CACHE", ""), ("HF_HOME", "hub")):
        if env.get(key):
            value = os.path.expandvars(str(env[key]))
            return os.path.join(value, sub) if sub else value
    return None


def fetch_models(models: dict[str, list[str]], cache_dir: str | None, dry_run: bool,
                 download: Callable[..., Any] | None = None) -> list[str]:
    """Every hub model into ``cache_dir`` (already there: nothing to do); the lines printed."""
    lines = []
    if models and not dry_run and cache_dir and "$" in cache_dir:
        raise ConfigError(f"slurm.env: the jobs' model cache {cache_dir} names a variable not set here; the models "
                          "are fetched into it before submitting: set the variable, or write the path out")
    for repo, where in models.items():
        if dry_run:
            lines.append(f"would fetch {repo} into {cache_dir or 'the default Hugging Face cache'} (named by "
                         f"{', '.join(where)})")
            continue
        if download is None:
            from huggingface_hub import snapshot_download as download
        try:
            download(repo, cache_dir=cache_dir, local_files_only=True)
            continue  # cached
        except Exception:  # noqa: BLE001 - not cached (any of the hub client's errors): fetch it
            pass
        try:
            download(repo, cache_dir=cache_dir)
        except Exception as exc:  # noqa: BLE001 - the hub client raises many kinds; each is one line here
            raise ServiceError(f"fetching {repo} (named by {', '.join(where)}) into {cache_dir or 'the default cache'} "
                               f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; the "
                               "jobs run offline (HF_HUB_OFFLINE=1), so fetch it here first (or name a local path)"
                               ) from None
        lines.append(f"fetched {repo} into {cache_dir or 'the default Hugging Face cache'}")
    return lines


# --------------------------------------------------------------------------- code


def package_root() -> Path:
    """The directory holding the ``align`` package this process runs."""
    import align

    return Path(align.__file__).resolve().parent.parent


def code_snapshot(log_dir: Path, root: Path | None = None) -> Path:
    """A copy of align, rewards and the charters under ``log_dir/code/DIGEST`` (made once per content)."""
    root = package_root() if root is None else root
    files = sorted(p for name in PACKAGES for p in (root / name).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    digest = json_digest([[str(p.relative_to(root)), file_digest(p)] for p in files])[:16]
    target = log_dir / "code" / digest
    if not target.is_dir():
        staging = log_dir / "code" / f".{digest}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        for path in files:
            copy = staging / path.relative_to(root)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)
        os.replace(staging, target)
    return target


def check_frozen_code() -> None:
    """In a job: the align this process runs is the snapshot its submission froze (``ALIGN_CODE``)."""
    frozen = os.environ.get(CODE_ENV)
    if not frozen:
        return
    here = package_root()
    if Path(frozen).resolve() != here:
        raise ConfigError(f"this job runs align from {here}, not the code its submission froze ({frozen}): a Python "
                          "that puts its own align before PYTHONPATH; submit again from that Python's environment")
