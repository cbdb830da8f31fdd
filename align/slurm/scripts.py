"""A stage as a SLURM batch script: the resources as ``#SBATCH`` lines, then the shipped script.

The generated script holds everything a stage's job needs (resources, log path, working
directory, environment), so ``sbatch SCRIPT`` alone submits it and ``sbatch --test-only
SCRIPT`` checks it. The run itself is the shipped scripts' (``recipes/slurm``): an array
stage runs ``annotate_array.sbatch`` with ``NUM_SHARDS``, a training stage
``train_multinode.sbatch`` (one ``accelerate launch`` per node), a one-task stage ``align
STAGE`` directly. Only the dependency on the previous stage is given at submission.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from align.slurm.config import ARRAY_STAGES, LAUNCH_STAGES, SINGLE_STAGES, JobSettings

SHIPPED_SCRIPTS = ("annotate_array.sbatch", "train_multinode.sbatch", "launch_node.sh")


def kind_of(stage: str) -> str:
    """``array``, ``launch`` or ``single``: how a stage runs as a job."""
    for kind, stages in (("array", ARRAY_STAGES), ("launch", LAUNCH_STAGES), ("single", SINGLE_STAGES)):
        if stage in stages:
            return kind
    raise KeyError(f"no SLURM job kind for stage {stage!r}")


def array_spec(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (the form of ``sbatch --array=``)."""
    parts, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(parts)


@dataclass(frozen=True)
class StageJob:
    """One stage's job: what it runs and with what; ``shards`` are the array tasks (array stages)."""

    stage: str
    settings: JobSettings
    recipe: Path  # absolute
    workdir: Path  # absolute: the job's working directory (recipe paths are relative to it)
    log_dir: Path  # absolute
    scripts_dir: Path  # absolute
    shards: tuple[int, ...] = ()
    python_bin: Path = Path(sys.executable).parent

    @property
    def kind(self) -> str:
        return kind_of(self.stage)

    @property
    def log_pattern(self) -> str:
        """The log file name SLURM writes, with its ``%A``/``%a``/``%j`` placeholders."""
        suffix = "%A_%a" if self.kind == "array" else "%j"
        return str(self.log_dir / f"{self.stage}-{suffix}.out")

    def logs_for(self, job_id: str) -> str:
        """Where this job's logs go, once its id is known."""
        return self.log_pattern.replace("%A", job_id).replace("%a", "*").replace("%j", job_id)

    def sbatch_options(self) -> list[str]:
        """The job's resources and places, as ``sbatch`` options."""
        s = self.settings
        options = [f"--job-name=align-{self.stage}", f"--output={self.log_pattern}", f"--chdir={self.workdir}",
                   "--export=ALL", "--nodes=" + str(s.nodes if self.kind == "launch" else 1)]
        for name, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("time", s.time),
                            ("mem", s.mem), ("cpus-per-task", s.cpus_per_task)):
            if value is not None:
                options.append(f"--{name}={value}")
        if self.kind == "array":
            spec = array_spec(list(self.shards))
            options += [f"--array={spec}" + (f"%{s.array_parallel}" if s.array_parallel else ""), "--ntasks=1"]
            if s.gpus_per_task:
                options.append(f"--gpus-per-task={s.gpus_per_task}")
        elif self.kind == "launch":
            options.append("--ntasks-per-node=1")
            if s.gpus_per_node:
                options.append(f"--gpus-per-node={s.gpus_per_node}")
        else:
            options.append("--ntasks=1")
        return options + list(s.sbatch_options)

    def body(self) -> list[str]:
        """The shell lines that run the stage (after the environment is set)."""
        recipe, scripts = shlex.quote(str(self.recipe)), self.scripts_dir
        if self.kind == "array":
            return [f"export STAGE={self.stage} NUM_SHARDS={self.settings.array}",
                    f"exec bash {shlex.quote(str(scripts / 'annotate_array.sbatch'))} {recipe}"]
        if self.kind == "launch":
            accelerate_config = (self.workdir / self.settings.accelerate_config).resolve()
            return [f"export STAGE={self.stage} GPUS_PER_NODE={self.settings.ranks_per_node}",
                    f"export ACCELERATE_CONFIG={shlex.quote(str(accelerate_config))}",
                    f"export LAUNCH_NODE={shlex.quote(str(scripts / 'launch_node.sh'))}",
                    f"exec bash {shlex.quote(str(scripts / 'train_multinode.sbatch'))} {recipe}"]
        return [f'exec "${{PYTHON:-python}}" -m align {self.stage} {recipe}']

    def script(self, source: str) -> str:
        """The whole batch script; ``source`` says where it came from (the recipe as given)."""
        what = {"array": f"an array of {self.settings.array} shards (tasks {array_spec(list(self.shards))})",
                "launch": f"{self.settings.nodes} node(s) x {self.settings.ranks_per_node} rank(s)",
                "single": "one task"}[self.kind]
        lines = ["#!/bin/bash",
                 (f"# align {self.stage} of {source}, as {what}. Written by `align submit`; "
                  "`sbatch THIS_FILE` runs it alone."),
                 *(f"#SBATCH {option}" for option in self.sbatch_options()),
                 "",
                 "set -euo pipefail",
                 # the submitting environment's python, accelerate and align come first
                 f"export PATH={shlex.quote(str(self.python_bin))}:\"$PATH\"",
                 *(f"export {key}={shlex.quote(str(value))}" for key, value in self.settings.env.items()),
                 *self.body()]
        return "\n".join(lines) + "\n"
