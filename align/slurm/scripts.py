"""A recipe step as a SLURM batch script: every resource as an ``#SBATCH`` line, then the run.

The generated script holds everything the job needs (resources, log path, working
directory, the Python that runs it, its environment), so ``sbatch SCRIPT`` alone submits it
and ``sbatch --test-only SCRIPT`` checks it; only the dependency on earlier steps is given
at submission. Each job runs ``python -m align step RECIPE NAME``: an array step with the
shard count (each task takes shard ``SLURM_ARRAY_TASK_ID``), a training launch through
``recipes/slurm/launch_node.sh`` (one ``accelerate launch`` per node, under ``srun``), a
one-task step directly. Every path is quoted (a working directory with a space works).
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


def sbatch_value(value: str) -> str:
    """A value on an ``#SBATCH`` line: double-quoted when it holds a space or a quote (SLURM's own parser
    reads double quotes; a shell quote would be taken literally)."""
    text = str(value)
    if any(c in text for c in " \t\"'\\#"):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


@dataclass(frozen=True)
class StepJob:
    """One step's job: what it runs and with what; ``shards`` are the array tasks (array steps)."""

    step: str  # the step's name (``annotate_judge``, ``round-2.train``)
    stage: str
    kind: str  # array | launch | single
    settings: JobSettings
    recipe: Path  # absolute
    workdir: Path  # absolute: the job's working directory (recipe paths are relative to it)
    log_dir: Path  # absolute
    scripts_dir: Path  # absolute
    shards: tuple[int, ...] = ()
    num_shards: int = 1  # array steps: the shard count the output is (or will be) written with
    extra: tuple[str, ...] = ()  # more key=value arguments of the step (a report task's shard)

    @property
    def python(self) -> Path:
        """The interpreter the job runs (``slurm.python``, else the one align submit runs in), absolute."""
        if self.settings.python:
            path = Path(self.settings.python).expanduser()
            return path if path.is_absolute() else self.workdir / path
        return Path(sys.executable)

    @property
    def job_name(self) -> str:
        return f"align-{self.step}"

    @property
    def log_pattern(self) -> str:
        """The log file name SLURM writes, with its ``%A``/``%a``/``%j`` placeholders."""
        suffix = "%A_%a" if self.kind == "array" else "%j"
        return str(self.log_dir / f"{self.step}-{suffix}.out")

    def logs_for(self, job_id: str) -> str:
        """Where this job's logs go, once its id is known."""
        return self.log_pattern.replace("%A", job_id).replace("%a", "*").replace("%j", job_id)

    def sbatch_options(self) -> list[str]:
        """The job's resources and places, as ``sbatch`` options (values quoted for an ``#SBATCH`` line)."""
        s = self.settings
        cpus, mem = s.cpus_for(self.kind), s.mem_for(self.kind)
        options = [f"--job-name={sbatch_value(self.job_name)}", f"--output={sbatch_value(self.log_pattern)}",
                   f"--chdir={sbatch_value(str(self.workdir))}", "--export=ALL",
                   "--nodes=" + str(s.nodes if self.kind == "launch" else 1),
                   f"--cpus-per-task={cpus}", f"--mem={mem}"]
        for name, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("time", s.time)):
            if value is not None:
                options.append(f"--{name}={sbatch_value(str(value))}")
        if s.exclusive_for(self.kind):
            options.append("--exclusive")
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
            if s.gpus_per_task:
                options.append(f"--gpus-per-task={s.gpus_per_task}")
        return options + list(s.sbatch_options)

    def files_needed(self) -> dict[str, Path]:
        """Every file the job opens before align does (checked at submit time)."""
        needed = {"python": self.python, "recipe": self.recipe}
        if self.kind == "launch":
            needed["accelerate_config"] = (self.workdir / self.settings.accelerate_config).resolve()
            needed["launch script"] = self.scripts_dir / "launch_node.sh"
        return needed

    def body(self) -> list[str]:
        """The shell lines that run the step (after the environment is set)."""
        q = shlex.quote
        run = ["-m", "align", "step", str(self.recipe), self.step, *self.extra]
        if self.kind == "array":
            words = " ".join(q(w) for w in [*run, f"num_shards={self.num_shards}"])
            return ['export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"',
                    f'echo "[align submit] {self.step}: task ${{SLURM_ARRAY_TASK_ID}} of {self.num_shards} shards on '
                    f'$(hostname)"',
                    f'exec "$ALIGN_PYTHON" {words}']
        if self.kind == "launch":
            accelerate_config = (self.workdir / self.settings.accelerate_config).resolve()
            nodes, ranks = self.settings.nodes, self.settings.ranks_per_node
            words = " ".join(q(w) for w in run)
            return [f"export ACCELERATE_CONFIG={q(str(accelerate_config))}",
                    f"export NNODES={nodes} NUM_PROCESSES={nodes * ranks}",
                    'export MAIN_PROCESS_IP="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
                    'export MAIN_PROCESS_PORT="${MAIN_PROCESS_PORT:-29500}"',
                    'export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"',
                    f"export LAUNCH_NODE={q(str(self.scripts_dir / 'launch_node.sh'))}",
                    f'echo "[align submit] {self.step}: {nodes} node(s) x {ranks} rank(s)"',
                    "srun --kill-on-bad-exit=1 bash -c 'export MACHINE_RANK=$SLURM_PROCID; "
                    f"exec bash \"$LAUNCH_NODE\" \"$@\"' launch {words}"]
        words = " ".join(q(w) for w in run)
        return [f'exec "$ALIGN_PYTHON" {words}']

    def script(self, source: str) -> str:
        """The whole batch script; ``source`` says where it came from (the recipe as given)."""
        what = {"array": f"an array of {self.num_shards} shards (tasks {array_spec(list(self.shards))})",
                "launch": f"{self.settings.nodes} node(s) x {self.settings.ranks_per_node} rank(s)",
                "single": "one task"}[self.kind]
        python = self.python
        lines = ["#!/bin/bash",
                 (f"# align step {self.step} ({self.stage}) of {source}, as {what}. Written by `align submit`; "
                  "`sbatch THIS_FILE` runs it alone."),
                 *(f"#SBATCH {option}" for option in self.sbatch_options()),
                 "",
                 "set -euo pipefail",
                 f"export ALIGN_PYTHON={shlex.quote(str(python))}",
                 # that Python's environment first: its accelerate, its align
                 f"export PATH={shlex.quote(str(python.parent))}:\"$PATH\"",
                 *(f"export {key}={shlex.quote(str(value))}" for key, value in self.settings.env.items()),
                 *self.body()]
        return "\n".join(lines) + "\n"
