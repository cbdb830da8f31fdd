"""The recipe's ``slurm:`` section: where and how big each step's SLURM job is, and which Python runs it.

The top-level keys apply to every step; ``stages: {NAME: {key: value}}`` changes them for
the steps of one stage type (``train``) or for one step by its name (``annotate_judge``; a
step's name wins over its stage's): ``stages: {train: {nodes: 8}, annotate_judge: {array:
16, gpus_per_task: 2, python: .venv-vllm/bin/python}}``. ``align submit`` reads it; ``align
pipeline`` and ``align status`` accept it and ignore it.

Resources a cluster admin expects on every job are written on every script: GPUs, CPUs
(default 8 per GPU the task holds, 4 for a task without GPUs), memory (default 8 GiB per
CPU for array and one-task steps; training launches hold their nodes whole: ``--exclusive``
and ``--mem=0``), time, partition, account.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from align.config import ConfigError, from_dict
from align.stage_table import STAGES, stages_of_job

# How each stage runs as a job (the stage table's ``job``): an array of shards, one launch over
# nodes, or one task.
ARRAY_STAGES = stages_of_job("array")
LAUNCH_STAGES = stages_of_job("launch")
SINGLE_STAGES = stages_of_job("single")
# Every stage a recipe step may run.
STEP_STAGES = tuple(STAGES)


@dataclass
class JobSettings:
    """One stage's SLURM resources (every key also at the top of ``slurm:``)."""

    partition: str | None = field(default=None, metadata={"help": "SLURM partition (--partition); none: the cluster's default"})
    account: str | None = field(default=None, metadata={"help": "SLURM account (--account)"})
    qos: str | None = field(default=None, metadata={"help": "SLURM quality of service (--qos)"})
    time: int | str | None = field(default=None, metadata={
        "help": "time limit per job or array task, quoted (--time, e.g. \"12:00:00\", \"2-00:00:00\"); none: the partition's"})
    nodes: int = field(default=1, metadata={"help": "training stages (sft, logprobs, train): nodes, one launcher each"})
    gpus_per_node: int = field(default=8, metadata={"help": "training stages: GPUs per node (--gpus-per-node); 0: none asked for"})
    processes_per_node: int | None = field(default=None, metadata={
        "help": "training stages: ranks per node (default: gpus_per_node, at least 1)"})
    gpus_per_task: int = field(default=1, metadata={
        "help": "array stages (sample, annotate, evaluate) and one-task stages: GPUs per task; 0: none asked for"})
    cpus_per_task: int | None = field(default=None, metadata={
        "help": "CPUs per task (--cpus-per-task; a training launch's task is one node's launcher); none: 8 per GPU "
                "the task holds (4 without GPUs)"})
    mem: str | None = field(default=None, metadata={
        "help": "memory per node (--mem, e.g. 200G; 0: all of it); none: 8G per CPU for array and one-task steps, "
                "0 (the whole node) for training launches"})
    exclusive: bool | None = field(default=None, metadata={
        "help": "--exclusive: no other job on the nodes; none: on for training launches, off otherwise"})
    python: str | None = field(default=None, metadata={
        "help": "the Python that runs the step (e.g. .venv-vllm/bin/python for the vLLM steps, .venv/bin/python for "
                "training; relative to the directory align submit runs in); none: the Python align submit runs in"})
    array: int = field(default=1, metadata={"help": "array stages: shards, one array task each (--array=0-(array-1))"})
    array_parallel: int | None = field(default=None, metadata={"help": "array stages: at most this many tasks at once (--array=...%N)"})
    accelerate_config: str = field(default="recipes/accelerate/zero3.yaml", metadata={
        "help": "training stages: the accelerate config each node launches with"})
    sbatch_options: list[str] = field(default_factory=list, metadata={
        "help": "more sbatch options, as written (e.g. [--exclusive, --constraint=h100])"})
    env: dict = field(default_factory=dict, metadata={
        "help": "environment variables the job exports (e.g. {HF_HOME: /scratch/hf}); a step's or stage's entry "
                "adds to (and overrides keys of) the top-level one; $VAR in a value is the job's own variable, "
                "expanded when the job starts (HF_TOKEN: $HF_TOKEN), never written out"})
    signal_margin: int = field(default=600, metadata={
        "help": "seconds before the time limit at which SLURM signals the job (--signal=B:USR1@N): the step saves "
                "(a trainer its checkpoint, a job its last batch), stops and requeues itself; 0: no signal"})
    requeue: bool = field(default=True, metadata={
        "help": "a step stopped by that signal, or preempted, requeues itself (--requeue, scontrol requeue) and "
                "resumes where it stopped; false: it stops, and align submit resubmits it"})
    over_time_limit: str = field(default="refuse", metadata={
        "help": "a time longer than the partition's maximum (read at submit, scontrol show partition): refuse | "
                "chain (ask for the maximum and run as chained attempts, each saving and requeueing at its limit)"})

    def __post_init__(self) -> None:
        if isinstance(self.time, int):
            raise ConfigError(f"time: {self.time} is a number (YAML reads an unquoted 12:00:00 as seconds): "
                              "quote it, e.g. \"12:00:00\"")
        for name in ("nodes", "array"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("gpus_per_node", "gpus_per_task"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be 0 or more, got {getattr(self, name)}")
        for name in ("processes_per_node", "cpus_per_task", "array_parallel"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}: must be at least 1 (or null), got {value}")
        if self.mem is not None and not re.fullmatch(r"\d+[KMGT]?", str(self.mem)):
            raise ConfigError(f"mem: {self.mem!r} is not a SLURM memory size (e.g. 64G, 500M, 0 for all of a node)")
        names = [k for k in self.env if not (isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k))]
        if names:
            raise ConfigError(f"env: {names} are not environment variable names")
        if self.signal_margin < 0:
            raise ConfigError(f"signal_margin: seconds before the time limit, 0 or more, got {self.signal_margin}")
        if self.over_time_limit not in ("refuse", "chain"):
            raise ConfigError(f"over_time_limit: refuse or chain, got {self.over_time_limit!r}")
        if self.over_time_limit == "chain" and not (self.requeue and self.signal_margin):
            raise ConfigError("over_time_limit: chain runs a step as attempts that save and requeue at their limit: "
                              "it needs requeue: true and a signal_margin above 0")
        bad = [o for o in self.sbatch_options if not o.startswith("-")]
        if bad:
            raise ConfigError(f"sbatch_options: {bad} are not options (each starts with '-', e.g. --exclusive)")

    @property
    def ranks_per_node(self) -> int:
        return self.processes_per_node or max(self.gpus_per_node, 1)

    def cpus_for(self, kind: str) -> int:
        """CPUs per task: the setting, else 8 per GPU the task holds (4 without GPUs)."""
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        gpus = self.gpus_per_node if kind == "launch" else self.gpus_per_task
        return 8 * gpus if gpus else 4

    def mem_for(self, kind: str) -> str:
        """Memory per node: the setting, else the whole node for a launch, 8G per CPU otherwise."""
        if self.mem is not None:
            return str(self.mem)
        return "0" if kind == "launch" else f"{8 * self.cpus_for(kind)}G"

    def exclusive_for(self, kind: str) -> bool:
        return self.exclusive if self.exclusive is not None else kind == "launch"


@dataclass
class SlurmConfig(JobSettings):
    """``align submit``'s section: the job settings of every stage, then per-stage changes."""

    stages: dict = field(default_factory=dict, metadata={
        "help": "per-stage changes of the keys above: {STAGE: {key: value}} (e.g. {train: {nodes: 8}})"})
    required: list[str] = field(default_factory=list, metadata={
        "help": "keys every job must have set before align submit submits anything (e.g. [partition, account]: "
                "most clusters refuse a job without an account)"})
    log_dir: str = field(default="runs/slurm", metadata={
        "help": "where the job scripts, their logs and the submitted job ids go"})
    scripts_dir: str = field(default="recipes/slurm", metadata={
        "help": "the directory holding annotate_array.sbatch, train_multinode.sbatch and launch_node.sh"})

    def __post_init__(self) -> None:
        super().__post_init__()
        known = {f.name for f in dataclasses.fields(JobSettings)}
        unknown = [key for key in self.required if key not in known]
        if unknown:
            raise ConfigError(f"required: {unknown} are not job settings; one of {sorted(known)}")
        for stage, changes in self.stages.items():  # step names are checked against the recipe's steps
            if not isinstance(changes, dict):
                raise ConfigError(f"stages.{stage}: expected a mapping of keys to values, got {changes!r}")
            self.for_stage(stage)  # every key checked at load time

    def for_stage(self, stage: str, *steps: str | None) -> JobSettings:
        """The settings of one step: the section's keys, under its stage type's ``stages`` entry, under its
        own (by its name in the recipe, then its full name: ``evaluate.kl``, ``round-2.train``)."""
        base = {f.name: getattr(self, f.name) for f in dataclasses.fields(JobSettings)}
        changes: dict[str, Any] = dict(self.stages.get(stage) or {})
        env = {**self.env, **(changes.get("env") or {})}  # env adds up: the step's over its stage's over the top
        for step in steps:
            if step and step != stage and step in self.stages:
                changes.update(self.stages[step] or {})
                env.update((self.stages[step] or {}).get("env") or {})
        changes["env"] = env
        # every entry was checked alone when the section was read (by this method, under its own name)
        return from_dict(JobSettings, {**base, **changes}, where=f"stages.{stage}.")
