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

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from align.slurm.config import ARRAY_STAGES, LAUNCH_STAGES, SINGLE_STAGES, JobSettings
from align.stopping import STOP_FILE_ENV, STOPPED_EXIT

SHIPPED_SCRIPTS = ("annotate_array.sbatch", "train_multinode.sbatch", "launch_node.sh")
CODE_ENV = "ALIGN_CODE"  # the snapshot of align a job runs (checked when the job starts)


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


_VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def env_value(value: object) -> str:
    """A value for ``export KEY=...`` in a batch script: ``$VAR`` and ``${VAR}`` left for the job's shell to
    expand when it starts (the secret is never written into the script; ``align submit`` refuses one unset
    where it runs), everything else literal."""
    text = str(value)
    if "$" not in text:
        return shlex.quote(text)
    out, last = [], 0
    for match in _VARIABLE.finditer(text):
        out.append(_literal(text[last:match.start()]))
        out.append("${" + match.group(0).strip("${}") + "-}")  # unset: empty (the script runs under set -u)
        last = match.end()
    out.append(_literal(text[last:]))
    return '"' + "".join(out) + '"'


def _literal(text: str) -> str:
    """Text inside double quotes, with nothing the shell would expand."""
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


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
    code: Path | None = None  # the align the job runs: a snapshot made at submit, first on PYTHONPATH

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
                   "--open-mode=append",  # a requeued job's attempts share one log, each under its own header
                   f"--chdir={sbatch_value(str(self.workdir))}", "--export=ALL",
                   "--nodes=" + str(s.nodes if self.kind == "launch" else 1),
                   f"--cpus-per-task={cpus}", f"--mem={mem}"]
        for name, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("time", s.time)):
            if value is not None:
                options.append(f"--{name}={sbatch_value(str(value))}")
        if s.signal_margin:
            options.append(f"--signal=B:USR1@{s.signal_margin}")  # to the batch shell: it asks the step to stop
        options.append("--requeue" if s.requeue else "--no-requeue")
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
                    f'"$ALIGN_PYTHON" {words} &']
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
                    f"exec bash \"$LAUNCH_NODE\" \"$@\"' launch {words} &"]
        words = " ".join(q(w) for w in run)
        return [f'"$ALIGN_PYTHON" {words} &']

    def code_lines(self) -> list[str]:
        """The align this job runs: the snapshot of its submission, before any installed one."""
        if self.code is None:
            return []
        code = shlex.quote(str(self.code))
        # PYTHONSAFEPATH: `python -m align` in the repository root must not put the checkout before the snapshot
        return [f'export PYTHONPATH={code}"${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONSAFEPATH=1 {CODE_ENV}={code}']

    def attempt_lines(self) -> list[str]:
        """Around the step (started in the background by ``body``): a header per attempt, the cluster's signals
        turned into the stop file every rank reads, the wait, and a requeue when the step saved and stopped."""
        stop_file = shlex.quote(str(self.log_dir / ".stop-")) + '"${SLURM_JOB_ID}"'
        step = self.step
        requeue = (['  target="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"',
                    '  if scontrol requeue "${target:-$SLURM_JOB_ID}"; then',
                    f'    echo "[align submit] {step}: saved and requeued: the next attempt resumes where it stopped"',
                    "    exit 0",
                    "  fi"] if self.settings.requeue else [])
        return [
            f'echo "[align submit] {step}: attempt $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) started $(date '
            f"'+%Y-%m-%d %H:%M:%S') on $(hostname), job ${{SLURM_JOB_ID}}\"",
            f"export {STOP_FILE_ENV}={stop_file}",
            f'rm -f "${STOP_FILE_ENV}" "${STOP_FILE_ENV}.stopped"',
            f"trap 'echo \"[align submit] {step}: USR1 (the time limit is near): saving, then stopping\"; "
            f"touch \"${STOP_FILE_ENV}\"' USR1",
            f"trap 'echo \"[align submit] {step}: TERM: saving, then stopping\"; touch \"${STOP_FILE_ENV}\"' TERM",
            *self.body(),
            "child=$!",
            "while true; do  # a trapped signal interrupts wait: wait again until the step exits",
            '  status=0; wait "$child" || status=$?',
            '  kill -0 "$child" 2>/dev/null || break',
            "done",
            f'rm -f "${STOP_FILE_ENV}"',
            f'if [ -e "${STOP_FILE_ENV}.stopped" ]; then  # the step saved and stopped (the file says where)',
            f'  rm -f "${STOP_FILE_ENV}.stopped"',
            *requeue,
            f'  echo "[align submit] {step}: saved and stopped; align submit RECIPE submits it again, and it resumes"',
            f"  exit {STOPPED_EXIT}",
            "fi",
            'exit "$status"',
        ]

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
                 *self.code_lines(),
                 *(f"export {key}={env_value(value)}" for key, value in self.settings.env.items()),
                 *self.attempt_lines()]
        return "\n".join(lines) + "\n"
