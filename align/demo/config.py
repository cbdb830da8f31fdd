"""The demo's settings: one dataclass (its recipe keys) and the presets that shrink it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from align.errors import ConfigError

# The Apertus default system text's date, the same in every step (SFT, sampling, the pass,
# training, evaluation).
DATE = "2026-01-01"
# Tokens per training row in the log-prob pass and the preference trainers (prompt +
# completion: the longest sorting answer with tool calls fits), and in SFT.
MAX_LENGTH = 128
SFT_MAX_LENGTH = 64
# Prompts per generate call and per job batch in sampling, annotation and evaluation.
GENERATE_BATCH = 256


# Smaller settings for a quick run (CI): every key here replaces the default of the same
# name unless the recipe or command line set that key to something else.
PRESETS: dict[str, dict[str, Any]] = {
    "full": {},
    "ci": {
        "num_sft_examples": 4000, "num_prompts": 256, "num_held_out": 100, "num_validation": 100,
        "sft_batch_size": 64, "sft_max_steps": 150, "qrpo_batch_size": 32, "qrpo_steps": 32,
        "dpo_steps": 16, "watch_every": 16, "num_judge_prompts": 2,
    },
}


@dataclass
class DemoConfig:
    output_dir: str = field(default="demo_out", metadata={
        "help": "where the report, plots and models go: a new or empty directory, or an earlier demo run's "
                "(whose files, listed in its _demo.json, a new run replaces)"})
    preset: str = field(default="full", metadata={
        "help": "'full' (the defaults below) or 'ci' (fewer examples, prompts and steps: a quick path check)"})
    seed: int = field(default=0, metadata={"help": "seeds data, model init, sampling and training"})
    length: int = field(default=5, metadata={"help": "digits per problem (the task sorts them)"})
    num_sft_examples: int = field(default=40000, metadata={"help": "SFT conversations"})
    tool_fraction: float = field(default=0.05, metadata={"help": "share of SFT conversations that call the calculator"})
    num_prompts: int = field(default=2048, metadata={"help": "QRPO prompts (each gets n reference samples)"})
    num_held_out: int = field(default=500, metadata={"help": "held-out prompts for the before/after evaluation"})
    num_validation: int = field(default=200, metadata={"help": "prompts that decide when SFT stops"})
    n: int = field(default=10, metadata={"help": "reference samples per prompt"})
    sft_learning_rate: float = field(default=3e-3, metadata={"help": "SFT AdamW learning rate"})
    sft_batch_size: int = field(default=128, metadata={"help": "SFT batch size"})
    sft_max_steps: int = field(default=400, metadata={"help": "SFT step limit (0.55-1.2 s a step on 2 shared cores)"})
    sft_stop_accuracy: float = field(default=0.75, metadata={"help": "stop SFT at this greedy validation accuracy"})
    sft_eval_every: int = field(default=25, metadata={"help": "SFT steps between validation checks"})
    qrpo_beta: float = field(default=1.0, metadata={"help": "QRPO beta (length-normalised: beta/|y|)"})
    qrpo_learning_rate: float = field(default=3e-5, metadata={"help": "QRPO AdamW learning rate (>=1e-4 overshoots)"})
    qrpo_batch_size: int = field(default=64, metadata={"help": "QRPO samples per step"})
    qrpo_steps: int = field(default=256, metadata={"help": "QRPO optimizer steps"})
    dpo_beta: float = field(default=0.5, metadata={"help": "DPO beta (length-normalised: on log-ratio/|y|)"})
    dpo_learning_rate: float = field(default=3e-5, metadata={"help": "DPO AdamW learning rate"})
    dpo_steps: int = field(default=128, metadata={"help": "DPO optimizer steps (one pair per QRPO sample pair)"})
    watch_every: int = field(default=32, metadata={"help": "QRPO/DPO steps between greedy checks on the validation prompts"})
    num_judge_prompts: int = field(default=4, metadata={"help": "prompts scored by the tiny judge (path check)"})
    threads: int | None = field(default=None, metadata={"help": "torch threads (default: all cores)"})

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"preset: unknown {self.preset!r}; choose one of {sorted(PRESETS)}")
        defaults = {f.name: f.default for f in fields(self)}
        for key, value in PRESETS[self.preset].items():
            if getattr(self, key) == defaults[key]:
                setattr(self, key, value)
        if self.length < 2:
            raise ConfigError("length: at least 2 digits, or there is nothing to sort")
        if self.n < 2:
            raise ConfigError("n: at least 2 reference samples are needed for quantile rewards")


    @property
    def max_tokens(self) -> int:
        """Generation limit: the answer, the end of turn and a little slack."""
        return self.length + 3
