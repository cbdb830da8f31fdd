"""Every stage from one recipe, in order, each skipped when its output is already complete.

A pipeline recipe has one section per stage (``sft``, ``sample``, ``annotate``,
``pairs``, ``logprobs``, ``train``, ``evaluate``; ``decontaminate`` optional) and an optional
``defaults`` section merged under each of them: a default key reaches every stage that has
the key and every nested component config that has it (``defaults: {chat_date: ...}`` sets
``sft.chat_date``, ``logprobs.chat_date``, ``train.chat_date``, ``sample.sampler.chat_date``
and ``evaluate.sampler.chat_date``); a key given in a section wins over the default there,
and a default key that no stage knows is an error. Sections that are absent are not run.
Each stage marks its output complete only when it has finished, and the long stages
resume inside themselves (job shards, trainer checkpoints), so a killed pipeline rerun
with the same command picks up where it stopped and redoes nothing that finished.

Each output records what it was made from (its manifest). A stage whose output was made
from other settings or inputs stops the pipeline and names each difference; with
``overwrite=true`` (the pipeline's key) every such stage is redone instead, and since a
redone stage's output is new, every later stage that reads it is redone too, while stages
whose outputs are current are skipped. ``align status RECIPE`` shows which stages are
done, stale (and why), partial or not started, without running anything.

Example: ``align pipeline recipes/tiny/pipeline.yaml``. One stage of the same recipe:
``align train recipes/tiny/pipeline.yaml``.

Rounds (docs/rounds.md). With ``rounds: K`` the stages after SFT run K times: round k
samples from π_{k−1}, the policy round k−1 trained (π₀: the SFT output, or
``initial_policy``), annotates, builds pairs, runs the reference log-prob pass and trains
from π_{k−1}, then evaluates [sft, round k−1, round k] when the recipe has an ``evaluate``
section. ``reference`` says which policy is π_ref in round k: ``previous`` (π_{k−1}: the
quantile rewards against its samples, the log-probs under it) or ``initial`` (π₀ in every
round: its samples stay the quantiles' references and the pass scores under it).
``round_prompts`` says which prompts a round samples: ``all`` of ``sample.prompts``, or
``split``: part k of K (``align split``). Round k writes under ``output_dir/round-k/``, one
directory per stage; the pipeline sets the keys that tie the rounds together (each round
stage's ``output_dir``, input and models, the evaluated policies), so a rounds recipe leaves
them out. A killed run resumes in the round it stopped in; a changed setting redoes what
depends on it and nothing else. ``align status`` shows every round.

Example: ``align pipeline recipes/tiny/rounds.yaml``; from Python,
``align.pipeline("recipes/tiny/rounds.yaml", rounds=3, reference="initial")``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.config import (
    apply_defaults,
    default_keys,
    from_dict,
    merge,
    parse_overrides,
    read_yaml,
    renamed_key_hint,
)
from align.errors import ConfigError
from align.slurm import SlurmConfig
from align.stages import stage_module

ORDER = ("decontaminate", "sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")
# With rounds: the stages each round runs (decontaminate and sft run once, before the rounds).
ROUND_STAGES = ("sample", "annotate", "pairs", "logprobs", "train", "evaluate")
# The keys a rounds pipeline sets in every round: a rounds recipe leaves them out of its sections.
ROUND_KEYS: dict[str, tuple[str, ...]] = {
    "sample": ("output_dir", "sampler.model"),
    "annotate": ("input", "output_dir"),
    "pairs": ("input", "output_dir"),
    "logprobs": ("input", "model_name_or_path", "output_dir", "cache_dir"),
    "train": ("input", "model_name_or_path", "ref_model_name_or_path", "output_dir"),
    "evaluate": ("policies", "kl_reference", "output_dir"),
}
INITIAL_NAME = "sft"  # π₀'s name among the policies each round evaluates
REFERENCES = ("previous", "initial")  # π_ref of round k: π_{k-1}, or π₀ throughout
ROUND_PROMPTS = ("all", "split")


@dataclass
class Step:
    """One stage run of a pipeline: ``key`` names it (``train``; ``round-2.train`` in round 2)."""

    key: str
    stage: str
    config: Any
    round: int | None = None
    what: str = ""  # what the step does in its round, for the log and ``align status``


@dataclass
class Config:
    defaults: dict = field(default_factory=dict, metadata={
        "help": "keys merged under every stage section and its nested sections (sampler, reward) that have them"})
    decontaminate: dict | None = field(default=None, metadata={"help": "`align decontaminate` keys"})
    sft: dict | None = field(default=None, metadata={"help": "`align sft` keys"})
    sample: dict | None = field(default=None, metadata={"help": "`align sample` keys"})
    annotate: dict | None = field(default=None, metadata={"help": "`align annotate` keys"})
    pairs: dict | None = field(default=None, metadata={"help": "`align pairs` keys"})
    logprobs: dict | None = field(default=None, metadata={"help": "`align logprobs` keys"})
    train: dict | None = field(default=None, metadata={"help": "`align train` keys"})
    evaluate: dict | None = field(default=None, metadata={"help": "`align evaluate` keys"})
    output_dir: str = field(default="runs", metadata={
        "help": "with rounds: round k writes under output_dir/round-k/; without: unused (each stage names its own)"})
    stop_after: str | None = field(default=None, metadata={
        "help": "stop after this stage (e.g. pairs); with rounds also round-K (after round K) or round-K.STAGE "
                "(a stage name stops in round 1)"})
    overwrite: bool = field(default=False, metadata={
        "help": "redo every stage whose output was made from other settings or inputs (each removes only "
                "what it wrote); stages whose output is current are still skipped"})
    slurm: SlurmConfig = field(default_factory=SlurmConfig, metadata={
        "help": "`align submit`'s SLURM job settings (docs/slurm.md); the pipeline itself ignores them"})
    rounds: int | None = field(default=None, metadata={
        "help": "K rounds of sample, annotate, pairs, logprobs, train (and evaluate), each from the policy of "
                "the round before, under output_dir/round-k (docs/rounds.md); None: one round, each stage "
                "writing where its section says"})
    reference: str | None = field(default=None, metadata={
        "help": "with rounds, π_ref of round k: previous (π_{k-1}, the policy the round starts from) | initial "
                "(π₀ in every round: its samples stay the quantiles' references, the pass scores under it)"})
    round_prompts: str | None = field(default=None, metadata={
        "help": "with rounds, the prompts round k samples: all (every prompt of sample.prompts) | split (part k "
                "of K: row i in part i mod K + 1)"})
    initial_policy: str | None = field(default=None, metadata={
        "help": "with rounds and no sft section: π₀, the model round 1 starts from (with an sft section: its "
                "output)"})

    def __post_init__(self) -> None:
        self.steps()  # validate every section, and every round's wiring, at load time, not mid-run

    def stage_configs(self) -> list[tuple[str, Any]]:
        """Each present stage's validated config, in pipeline order (a recipe without rounds)."""
        if self.rounds is not None:
            raise ConfigError("a recipe with rounds runs each stage once per round, with other inputs each time: "
                              "run it with `align pipeline` (docs/rounds.md); from Python, Config.steps() gives "
                              "every round's stages with their configs")
        return [(step.stage, step.config) for step in self.steps()]

    def steps(self) -> list[Step]:
        """Every stage run of this recipe, in order, each with its validated config, up to ``stop_after``."""
        self._check_round_keys()
        once = [name for name in ORDER if getattr(self, name) is not None
                and (self.rounds is None or name not in ROUND_STAGES)]
        steps = [Step(name, name, self._config(name)) for name in once]
        if self.rounds is not None:
            steps += self._round_steps(self._initial_policy(steps))
        if not steps:
            raise ConfigError(f"a pipeline recipe needs at least one stage section of {list(ORDER)}")
        steps = steps[: self._stop_index(steps) + 1]
        known = set().union(*(default_keys(type(step.config)) for step in steps))
        unused = set(self.defaults) - known
        if unused:
            hints = [h for k in sorted(unused) if (h := renamed_key_hint(k, sorted(known)))]
            raise ConfigError(f"defaults: keys {sorted(unused)} are known to no stage in this recipe"
                              + "".join(f". {h}" for h in hints))
        return steps

    def _config(self, name: str, wiring: Mapping[str, Any] | None = None, where: str = "") -> Any:
        """Stage ``name``'s config: its section over the defaults it knows, then ``wiring`` (a round's keys)."""
        module = stage_module(name)
        section = (getattr(self, name) if name in ORDER else None) or {}
        if name == "evaluate" and self.rounds is not None:
            section = {k: v for k, v in section.items() if k != "baseline"}  # sft | previous: a name per round
        try:
            values = merge(apply_defaults(module.Config, self.defaults, section), wiring or {})
            return from_dict(module.Config, values, where=f"{name}.")
        except ConfigError as exc:
            raise ConfigError(f"pipeline section {name!r}{where}: {exc}") from exc

    def _check_round_keys(self) -> None:
        """The round settings are set together, and a rounds recipe leaves the pipeline's keys to it."""
        if self.rounds is None:
            for key in ("reference", "round_prompts", "initial_policy"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"{key}: a setting of rounds; set rounds: K too, or leave {key} out")
            return
        if self.rounds < 1:
            raise ConfigError(f"rounds={self.rounds}: must be at least 1 (or leave it out for one round)")
        if self.reference not in REFERENCES:
            raise ConfigError(f"reference: {self.reference!r}; with rounds, set reference: previous (π_ref of round "
                              "k is π_{k-1}, the policy it starts from) or initial (π₀ in every round)")
        if self.round_prompts not in ROUND_PROMPTS:
            raise ConfigError(f"round_prompts: {self.round_prompts!r}; with rounds, set round_prompts: all (each "
                              "round samples every prompt) or split (round k samples part k of K)")
        missing = [name for name in ROUND_STAGES[:-1] if getattr(self, name) is None]
        if missing:
            raise ConfigError(f"rounds: the recipe needs the sections {missing} (each round samples, annotates, "
                              "pairs, runs the reference pass and trains)")
        if (self.sft is None) == (self.initial_policy is None):
            raise ConfigError("rounds: π₀ is the sft section's output; without an sft section set initial_policy "
                              "(the model round 1 starts from), and with one leave initial_policy out")
        for name, keys in ROUND_KEYS.items():
            for key in keys:
                if _given(getattr(self, name) or {}, key):
                    raise ConfigError(f"{name}.{key}: set by the pipeline in each round (docs/rounds.md); leave it "
                                      "out of a rounds recipe")
        baseline = (self.evaluate or {}).get("baseline", INITIAL_NAME)
        if baseline not in (INITIAL_NAME, "previous"):
            raise ConfigError(f"evaluate.baseline: {baseline!r}; with rounds, {INITIAL_NAME} (π₀) or previous "
                              "(the policy of the round before)")

    def _initial_policy(self, steps: list[Step]) -> str:
        """π₀: the sft stage's output, or ``initial_policy``."""
        return next((str(s.config.output_dir) for s in steps if s.stage == "sft"), None) or str(self.initial_policy)

    def _round_steps(self, initial: str) -> list[Step]:
        """Every round's steps, each config wired to the round's prompts, policy and π_ref (docs/rounds.md)."""
        rounds = int(self.rounds or 0)
        root = Path(self.output_dir)
        models, names = {0: initial}, {0: INITIAL_NAME}
        sample = self._config("sample")
        if sample.mode != "reference":
            raise ConfigError(f"sample.mode: {sample.mode!r}; with rounds, reference (each round draws n completions "
                              "per prompt from a policy at the section's temperature, docs/rounds.md)")
        if not sample.prompts:
            raise ConfigError("sample.prompts: set the prompts the rounds sample")
        source = sample.prompts  # the whole prompt set
        out: list[Step] = []
        for k in range(1, rounds + 1):
            here = root / f"round-{k}"
            policy, ref = k - 1, (k - 1 if self.reference == "previous" else 0)

            def add(key: str, stage: str, wiring: dict[str, Any], what: str, k: int = k) -> None:
                out.append(Step(f"round-{k}.{key}", stage, self._config(stage, wiring, f" (round {k})"), k, what))

            prompts = source
            if self.round_prompts == "split":
                prompts = str(here / "prompts")
                add("split", "split", {"input": source, "part": k, "parts": rounds, "output_dir": prompts},
                    f"part {k} of {rounds} of the prompts")
            samples = str(here / "sample")
            if ref == policy:  # π_ref is the policy the round samples: its samples are the references
                references = samples
            elif self.round_prompts == "split":  # π₀ on this round's prompts
                references = str(here / "references")
                add("references", "sample", {"prompts": prompts, "output_dir": references,
                                             "sampler": {"model": models[0]}},
                    f"reference samples from {names[0]} (π_ref)")
            else:  # π₀ on every prompt: round 1 drew them
                references = str(root / "round-1" / "sample")
            add("sample", "sample", {"prompts": prompts, "output_dir": samples, "sampler": {"model": models[policy]}},
                f"samples from {names[policy]}" + (" (π_ref too)" if ref == policy else ""))
            annotated = samples
            if references != samples:
                annotated = str(here / "join")
                add("join", "join", {"input": references, "completions": samples, "output_dir": annotated},
                    f"{names[policy]}'s samples beside {names[ref]}'s reference samples")
            add("annotate", "annotate", {"input": annotated, "output_dir": str(here / "annotate")}, "rewards")
            add("pairs", "pairs", {"input": str(here / "annotate"), "output_dir": str(here / "pairs")},
                f"quantile rewards against {names[ref]}'s samples, pairs")
            add("logprobs", "logprobs", {"input": str(here / "pairs" / "pairs.jsonl"), "model_name_or_path": models[ref],
                                         "output_dir": str(here / "logprobs")}, f"log-probs under {names[ref]} (π_ref)")
            add("train", "train", {"input": str(here / "logprobs"), "model_name_or_path": models[policy],
                                   "ref_model_name_or_path": models[ref], "output_dir": str(here / "train")},
                f"from {names[policy]}")
            models[k], names[k] = str(here / "train"), f"round-{k}"
            if self.evaluate is not None:
                chosen = sorted({0, k - 1, k})
                baseline = policy if (self.evaluate or {}).get("baseline") == "previous" else 0
                add("evaluate", "evaluate", {
                    "policies": [{"name": names[j], "model": models[j]} for j in chosen],
                    "baseline": names[baseline], "kl_reference": names[ref], "output_dir": str(here / "evaluate")},
                    f"{', '.join(names[j] for j in chosen)} against {names[baseline]}")
        trainer = next(step.config for step in out if step.stage == "train")
        if trainer.reference != "precomputed":
            raise ConfigError(f"train.reference: {trainer.reference!r}; with rounds, precomputed (each round's "
                              "reference pass, align logprobs, scores the pairs under π_ref)")
        return out

    def _stop_index(self, steps: list[Step]) -> int:
        """The index of the last step to run: ``stop_after`` names a stage, a step or (with rounds) a round."""
        wanted = self.stop_after
        if wanted is None:
            return len(steps) - 1
        for i, step in enumerate(steps):
            if wanted in (step.key, step.stage):
                return i
        rounds = [i for i, step in enumerate(steps) if step.round is not None and f"round-{step.round}" == wanted]
        if rounds:
            return rounds[-1]
        if wanted in ORDER:  # a stage this recipe does not run: nothing to stop at
            return len(steps) - 1
        allowed = list(ORDER) if self.rounds is None else \
            [*ORDER, *(f"round-{k}" for k in range(1, self.rounds + 1)), *(s.key for s in steps if s.round)]
        raise ConfigError(f"stop_after: {wanted!r} is not one of {allowed}")


def _given(section: Mapping[str, Any], dotted: str) -> bool:
    """Whether a section sets ``a`` or ``a.b`` (``sampler.model``)."""
    head, _, leaf = dotted.partition(".")
    if not leaf:
        return head in section
    nested = section.get(head)
    return isinstance(nested, Mapping) and leaf in nested


def _output_id(output_dir: str | Path | None) -> str | None:
    """The id of a complete stage output (a new one each time it is made), else None."""
    from align.io import stage_completion_info

    if output_dir is None or not Path(output_dir).is_dir():
        return None
    return (stage_completion_info(output_dir) or {}).get("output_id")


def run(config: Config) -> dict[str, Any]:
    """Run the steps in order; a stage whose output is complete and current skips itself.

    Returns, per step key (``sample``; ``round-2.sample`` with rounds): the ``stage``, its
    ``round``, ``output_dir``, the ``outcome`` (``made`` now; ``skipped``, complete and current;
    ``unfinished``, job shards left to other processes; ``keyed``, an output under its cache
    key) and the ``summary`` the stage returned.
    """
    report: dict[str, Any] = {}
    for step in config.steps():
        if step.round is None:
            print(f"[align pipeline] stage {step.stage}")
        else:
            print(f"[align pipeline] round {step.round} stage {step.stage}: {step.what}")
        if config.overwrite:
            step.config.overwrite = True
        output_dir = getattr(step.config, "output_dir", None)
        before = _output_id(output_dir)
        summary = stage_module(step.stage).run(step.config)
        after = _output_id(output_dir)
        if output_dir is None:
            outcome = "keyed"
        elif after is None:
            outcome = "unfinished"
        else:
            outcome = "skipped" if after == before else "made"
        report[step.key] = {"stage": step.stage, "round": step.round, "output_dir": output_dir,
                            "outcome": outcome, "summary": summary}
    return report


def pipeline(recipe: str | Path | Mapping[str, Any] | None = None, *overrides: str, **keys: Any) -> dict[str, Any]:
    """``align pipeline RECIPE key=value ...`` from Python; returns ``run``'s report.

    ``recipe``: a YAML file or the recipe as a mapping. ``keys``: top-level keys over it
    (``rounds=3``, ``reference="initial"``; a mapping such as ``train={"beta": 3.0}`` is merged
    into its section). ``overrides``: ``key=value`` strings as on the command line
    (``"train.beta=3"``), applied last.
    """
    data = read_yaml(recipe) if isinstance(recipe, (str, Path)) else dict(recipe or {})
    return run(from_dict(Config, merge(merge(data, keys), parse_overrides(overrides))))
