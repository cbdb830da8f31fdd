"""The demo's settings: one dataclass (its recipe keys) and the presets that shrink it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from align.demo.reward import MAX_WEIGHT
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
    # The same grids as the defaults, over few steps: the path, not a result.
    "ci": {
        "num_sft_examples": 4000, "num_prompts": 256, "num_held_out": 100, "num_validation": 100,
        "sft_batch_size": 64, "sft_max_steps": 150, "batch_pairs": 16, "steps": 8, "validation_samples": 2,
        "num_judge_prompts": 2,
    },
}
# The grids QRPO and DPO each start from: the same number of points and the same learning
# rates for both, beta in steps of 4 (length-normalised: QRPO's beta/|y|, DPO's beta on
# log-ratio/|y|). DPO's range sits higher: on seed 0 its validation score still rose at 16,
# the top of an earlier grid 1-16. A chosen point without a trained neighbour gets one
# (align.demo.grids, ``search_points``).
QRPO_BETAS = (0.25, 1.0, 4.0)
DPO_BETAS = (4.0, 16.0, 64.0)
LEARNING_RATES = (3e-5, 1e-4, 3e-4)
# The demo's rewards: "exact" checks the answer (0 or 1); "graded" is the reward-model
# stand-in of align.demo.reward (partial credit, a length bias, a fixed per-answer noise).
REWARDS = ("exact", "graded")


@dataclass
class DemoConfig:
    output_dir: str = field(default="demo_out", metadata={
        "help": "where the report, plots and models go: a new or empty directory, or an earlier demo run's "
                "(whose files, listed in its _demo.json, a new run replaces)"})
    preset: str = field(default="full", metadata={
        "help": "'full' (the defaults below) or 'ci' (fewer examples, prompts and steps: a quick path check)"})
    seed: int = field(default=0, metadata={"help": "seeds data, model init, sampling and training",
                                           "max": 2**32 - 2})  # sampling takes seed + 1
    length: int = field(default=5, metadata={"help": "digits per problem (the task sorts them)"})
    num_sft_examples: int = field(default=40000, metadata={"help": "SFT conversations"})
    tool_fraction: float = field(default=0.05, metadata={"help": "share of SFT conversations that call the calculator"})
    num_prompts: int = field(default=2048, metadata={"help": "prompts the pairs come from (each gets n reference "
                                                     "samples)"})
    num_held_out: int = field(default=500, metadata={"help": "held-out prompts for the before/after evaluation"})
    num_validation: int = field(default=200, metadata={
        "help": "validation prompts: they decide when SFT stops and choose each method's point of its grid "
                "(disjoint from the held-out prompts)"})
    n: int = field(default=10, metadata={"help": "reference samples per prompt"})
    sft_learning_rate: float = field(default=3e-3, metadata={"help": "SFT AdamW learning rate"})
    sft_batch_size: int = field(default=128, metadata={"help": "SFT batch size"})
    sft_max_steps: int = field(default=400, metadata={"help": "SFT step limit (0.55-1.2 s a step on 2 shared cores)"})
    sft_stop_accuracy: float = field(default=0.75, metadata={"help": "stop SFT at this greedy validation accuracy"})
    sft_eval_every: int = field(default=25, metadata={"help": "SFT steps between validation checks"})
    qrpo_betas: list[float] = field(default_factory=lambda: list(QRPO_BETAS), metadata={
        "help": "QRPO's beta grid (length-normalised: beta/|y|)"})
    dpo_betas: list[float] = field(default_factory=lambda: list(DPO_BETAS), metadata={
        "help": "DPO's beta grid (length-normalised: on log-ratio/|y|), as many values as qrpo_betas"})
    learning_rates: list[float] = field(default_factory=lambda: list(LEARNING_RATES), metadata={
        "help": "the AdamW learning rates of both grids"})
    search_points: int = field(default=2, metadata={
        "help": "points each method may add to its starting grid, one at a time, while its chosen point lacks a "
                "trained neighbour on either side (past an edge: one more value at the grid's ratio); the same "
                "rule and number for both methods (align/demo/grids.py); 0: the starting grids only"})
    steps: int = field(default=128, metadata={"help": "optimizer steps of every QRPO and DPO point"})
    batch_pairs: int = field(default=32, metadata={"help": "pairs per step, QRPO and DPO alike (QRPO trains on "
                                                   "both completions of a pair as two samples)"})
    reward: str = field(default="exact", metadata={
        "help": "what the pairs and the choice on validation are made from: 'exact' (the sorted digits, 0 or 1) or "
                "'graded' (a reward-model stand-in: partial credit, a length bias, noise; align/demo/reward.py). The "
                "held-out evaluation reports both"})
    reward_noise: float = field(default=0.1, metadata={
        "help": "graded reward: the noise's standard deviation (a fixed draw per prompt and answer)",
        "min": 0, "max": MAX_WEIGHT})
    reward_length_bias: float = field(default=0.05, metadata={
        "help": "graded reward: the bonus per digit beyond the prompt's count (a bias a policy can exploit)",
        "min": 0, "max": MAX_WEIGHT})
    metric: str = field(default="reward_sampled", metadata={
        "help": "what chooses each method's point on the validation prompts (align.sweep.METRICS)"})
    select_on: str = field(default="goal", metadata={
        "help": "whose metric chooses, with reward=graded: 'goal' (exact accuracy of the same validation answers) "
                "or 'reward' (the graded reward, as a team with only a reward model chooses); the report names the "
                "other's choice beside it and evaluates both on the held-out prompts"})
    validation_samples: int = field(default=4, metadata={
        "help": "samples per validation prompt (T=1) when a grid point is scored, besides its greedy answer"})
    along_training_checks: int = field(default=4, metadata={
        "help": "times during each grid point's training (and once at its start) that its greedy answers to the "
                "validation prompts are scored under both measures, exact and graded (reward against accuracy along "
                "training); 0: none"})
    along_training_prompts: int = field(default=100, metadata={
        "help": "how many of the validation prompts (the first ones) those checks answer: each check is a greedy "
                "answer to each"})
    rounds: int = field(default=1, metadata={
        "help": "rounds of sampling, rewards and training: round k >= 2 samples from each method's round k-1 "
                "policy and trains it again with round 1's chosen beta and learning rate (reference: the round "
                "k-1 policy); the evaluation compares each round with the one before"})
    num_judge_prompts: int = field(default=4, metadata={"help": "prompts scored by the tiny judge (path check)"})
    threads: int = field(default=2, metadata={
        "help": "torch threads: 2 (the CI machine's count) gives every machine the same float sums, so the same "
                "report (docs/results.md, Reproducing); 0: all cores, faster on a big CPU, other digits"})

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
        if not self.qrpo_betas or not self.learning_rates:
            raise ConfigError("qrpo_betas, learning_rates: give at least one value each")
        if len(self.qrpo_betas) != len(self.dpo_betas):
            raise ConfigError(f"dpo_betas: {len(self.dpo_betas)} values against {len(self.qrpo_betas)} in qrpo_betas; "
                              "a fair comparison gives both methods grids of the same size")
        if self.reward not in REWARDS:
            raise ConfigError(f"reward: unknown {self.reward!r}; choose one of {list(REWARDS)}")
        if self.select_on not in ("goal", "reward"):
            raise ConfigError(f"select_on: unknown {self.select_on!r}; choose 'goal' or 'reward'")
        self.reward_provider("graded")  # its settings checked now: every run reports the graded reward too
        if self.search_points < 0:
            raise ConfigError(f"search_points: 0 or more, got {self.search_points}")
        if self.rounds < 1:
            raise ConfigError(f"rounds: at least 1, got {self.rounds}")
        if self.steps < 1 or self.batch_pairs < 1:
            raise ConfigError("steps, batch_pairs: at least 1")
        if self.along_training_prompts < 1:
            raise ConfigError(f"along_training_prompts: at least 1, got {self.along_training_prompts}")
        if not 0 <= self.along_training_checks <= self.steps:
            raise ConfigError(f"along_training_checks: 0 to steps ({self.steps}), got {self.along_training_checks}")
        for key in ("qrpo_betas", "dpo_betas", "learning_rates"):
            if not all(value > 0 for value in getattr(self, key)):
                raise ConfigError(f"{key}: every value must be > 0, got {getattr(self, key)}")
        for method in ("qrpo", "dpo"):
            self.sweep_settings(method)  # the metric and the grids checked now, not after SFT

    def grid(self, method: str) -> dict[str, list[float]]:
        """The grid one method is tuned over: its betas and the shared learning rates."""
        return {"beta": list(self.qrpo_betas if method == "qrpo" else self.dpo_betas),
                "learning_rate": list(self.learning_rates)}

    def sweep_settings(self, method: str, grid: dict[str, list[float]] | None = None) -> Any:
        """How a method's grid (default: its starting grid) is scored and chosen: a greedy answer
        and ``validation_samples`` samples per validation prompt, the point with the best ``metric`` chosen."""
        from align.eval.evaluate import EvalSettings
        from align.sweep.settings import SweepSettings

        return SweepSettings(grid=grid or self.grid(method), metric=self.metric, select_on=self.sweep_select_on,
                             validation=EvalSettings(
            greedy=True, n=self.validation_samples, temperature=1.0, max_tokens=self.max_tokens, seed=self.seed + 1,
            batch_size=GENERATE_BATCH, kl=False, plots=False))

    @property
    def sweep_select_on(self) -> str:
        """What ``align.sweep`` chooses by: the measure ``exact`` (the goal) when the run trains on the
        graded reward and ``select_on`` is ``goal``; else the reward the validation answers are scored with."""
        return "exact" if self.reward != "exact" and self.select_on == "goal" else "reward"

    def sweep_measures(self) -> dict[str, Any]:
        """The measures a sweep scores the validation answers with besides the reward: exact accuracy when
        the run trains on another reward (so each choice is shown beside the other's)."""
        return {} if self.reward == "exact" else {"exact": self.reward_provider("exact")}

    def reward_provider(self, reward: str | None = None) -> Any:
        """The reward ``reward`` names (default: the one the run trains on), as a reward provider."""
        reward = reward or self.reward
        if reward == "exact":  # the sorted digits exactly (``0123`` is not ``00123``), as the task says
            from rewards.verifiable import VerifiableReward

            return VerifiableReward(match="exact")
        from align.demo.reward import GradedSortingReward

        return GradedSortingReward(noise=self.reward_noise, length_bias=self.reward_length_bias)

    @property
    def max_tokens(self) -> int:
        """Generation limit: the answer, the end of turn and a little slack."""
        return self.length + 3
