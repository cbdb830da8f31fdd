"""The top-level keys of a pipeline recipe (either shape): its steps and how they run."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

from align.errors import ConfigError
from align.slurm import SlurmConfig
from align.stage_table import sections

# The stage sections of a pipeline recipe of the first shape, in the order they run (the stage table's).
SECTIONS = sections("main")
# Stages that may have a section too, after those above (a sweep over the pipeline's outputs, a judge's
# validation); a recipe of only these is still read by section: `align sweep recipes/tiny/sweep.yaml`.
EXTRA_SECTIONS = sections("extra")
REFERENCES = ("previous", "initial")  # π_ref of round k: π_{k-1}, or π₀ throughout
ROUND_PROMPTS = ("all", "split")


@dataclass
class _Graph:
    steps: dict | None = field(default=None, metadata={
        "help": "named steps, each {stage: TYPE, ...its keys} (or from: a stage file); @NAME is step NAME's "
                "output (docs/pipeline.md)"})
    defaults: dict = field(default_factory=dict, metadata={
        "help": "keys merged under every step and its nested sections (sampler, reward) that have them; keys "
                "naming a step's own work (model, input, output_dir, batch sizes...) are refused here"})


# one field per section, in the stage table's order: `sft: {...}` holds `align sft`'s keys
_Sections = make_dataclass("_Sections", [(name, dict | None, field(default=None, metadata={
    "help": f"`align {name}` keys"})) for name in SECTIONS], bases=(_Graph,))


@dataclass
class PipelineSettings(_Sections):  # type: ignore[valid-type, misc]
    """``align pipeline``'s keys (and ``align status`` / ``align submit``'s, which read the same recipe)."""

    output_dir: str | None = field(default=None, metadata={
        "help": "steps: where a step without an output_dir of its own writes (output_dir/NAME); with rounds: "
                "round k writes under output_dir/round-k/"})
    stop_after: str | None = field(default=None, metadata={
        "help": "stop after this step or stage (e.g. pairs); with rounds also round-K (after round K) or "
                "round-K.STEP (a bare name stops in round 1)"})
    overwrite: bool = field(default=False, metadata={
        "help": "redo every step whose output was made from other settings or inputs (each removes only "
                "what it wrote); steps whose output is current are still skipped"})
    slurm: SlurmConfig = field(default_factory=SlurmConfig, metadata={
        "help": "`align submit`'s SLURM job settings (docs/slurm.md); the pipeline itself ignores them"})
    rounds: int | None = field(default=None, metadata={
        "help": "K rounds of the steps that depend on the policy, each from the policy of the round before, "
                "under output_dir/round-k (docs/rounds.md); None: one round"})
    reference: str | None = field(default=None, metadata={
        "help": "with rounds, π_ref of round k: previous (π_{k-1}, the policy it starts from) | initial (π₀ "
                "in every round)"})
    round_prompts: str | None = field(default=None, metadata={
        "help": "with rounds, in a recipe of sections: all (each round samples every prompt of "
                "sample.prompts) | split (round k samples part k of K)"})
    initial_policy: str | None = field(default=None, metadata={
        "help": "with rounds, π₀: the model round 1 starts from (a path, or @STEP: that step's output; a "
                "recipe of sections with an sft section: its output)"})
    policy_step: str | None = field(default=None, metadata={
        "help": "with rounds, in a step graph: the step whose output is the next round's policy (default: "
                "the one train step that runs every round)"})

    def __post_init__(self) -> None:
        sections = [name for name in SECTIONS if getattr(self, name) is not None]
        if self.steps is not None and sections:
            raise ConfigError(f"steps and the sections {sections}: a recipe is one or the other; move the "
                              "sections into steps (each as {stage: NAME, ...})")
        if self.steps is not None and not isinstance(self.steps, dict):
            raise ConfigError(f"steps: expected a mapping of step names to their keys, got {self.steps!r}")
        if self.rounds is None:
            for key in ("reference", "round_prompts", "initial_policy", "policy_step"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"{key}: a setting of rounds; set rounds: K too, or leave {key} out")
            return
        if self.rounds < 1:
            raise ConfigError(f"rounds={self.rounds}: must be at least 1 (or leave it out for one round)")
        if self.reference not in REFERENCES:
            raise ConfigError(f"reference: {self.reference!r}; with rounds, set reference: previous (π_ref of "
                              "round k is π_{k-1}, the policy it starts from) or initial (π₀ in every round)")
        if self.steps is None:
            if self.round_prompts not in ROUND_PROMPTS:
                raise ConfigError(f"round_prompts: {self.round_prompts!r}; with rounds, set round_prompts: all "
                                  "(each round samples every prompt) or split (round k samples part k of K)")
            if self.policy_step is not None:
                raise ConfigError("policy_step: a setting of a step graph (steps:); a recipe of sections trains "
                                  "the policy in its train section")
        elif self.round_prompts is not None:
            raise ConfigError("round_prompts: a setting of a recipe of sections; in a step graph, give each round "
                              "its prompts with a step of its own (stage: split)")
