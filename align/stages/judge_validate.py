"""Qualify a judge before trusting its rewards: synthetic degradation ladders (Apertus report, Appendix E.4.5).

Reads prompts with good completions (``messages`` plus ``completion``, or the first of
``completions``, or ``chosen``; an optional ``language`` column), builds ladders of
``steps`` flaws each (rule-based degrader, or an LLM one through transformers or vLLM),
scores every ladder item with the constitutional judge the recipe describes (the same
keys as ``align annotate provider=judge``: model, backend, charter, scale, ...) and
measures how well the judge's scores follow the ladder order: Kendall τ and Spearman ρ
(pointwise and pairwise), adjacent-step accuracy, position bias, order agreement, with 95%
bootstrap intervals over prompts, per language. A language qualifies when its τ reaches
``min_kendall_tau`` (and, with ``require_significant``, its interval lies above 0).

Writes ``report.json``, ``report.md``, ``ladders.jsonl`` and ``score_by_step.png``.

Examples: ``align judge-validate recipes/tiny/judge_validate.yaml`` (after ``align pipeline
recipes/tiny/pipeline.yaml``: the tiny SFT model as the judge, on CPU, in seconds);
``align judge-validate recipes/apertus-8b/judge_validate.yaml charter=charter/example_de.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from align.errors import ConfigError
from align.manifests import StageRun
from align.manifests.lifecycle import check_model_path, run_stage
from rewards.config import GeneratorConfig, JudgeModelConfig, build_generator, build_judge

# what `align judge-validate --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "prompts with good completions",
    "model": "the judge",
}


def _degrader_generator() -> GeneratorConfig:
    """The LLM degrader's generation defaults: a whole rewritten response fits (1,024 tokens), greedy."""
    return GeneratorConfig(max_tokens=1024)


@dataclass
class Config(JudgeModelConfig):
    """The judge's keys (`rewards.config.JudgeModelConfig`, as ``align annotate provider=judge``
    takes them), the LLM degrader's generation model under ``generator.`` (a
    `rewards.config.GeneratorConfig`), then the stage's own keys."""

    input: str = field(default="", metadata={"help": "prompts with good completions (file or stage dir)"})
    output_dir: str = field(default="runs/judge_validate", metadata={"help": "where the report and plot go"})
    completion_field: str = field(default="completion", metadata={
        "help": "field holding the good completion (else the first of completions, else chosen)"})
    language_field: str = field(default="language", metadata={"help": "column to break results down by, if present"})
    max_prompts: int = field(default=0, metadata={"help": "use at most this many prompts (0: all)"})
    degrader: Literal["rules", "llm"] = field(default="rules", metadata={
        "help": "rules (text transforms, no model) | llm (generator.model rewrites with charter/degrade.txt)"})
    degrader_template: str = field(default="degrade", metadata={
        "help": "llm degrader: prompt template (name in charter/ or a file)"})
    generator: GeneratorConfig = field(default_factory=_degrader_generator, metadata={
        "help": "llm degrader: the generation model that rewrites (model, backend, max_tokens, temperature, ...)"})
    steps: int = field(default=4, metadata={"help": "flaws per ladder (each step adds one new flaw)"})
    kinds: list[str] = field(default_factory=list, metadata={
        "help": "flaw kinds to draw from (empty: every kind the degrader can imitate)"})
    pairwise: bool = field(default=True, metadata={"help": "also compare every pair of a ladder, in both orders"})
    min_kendall_tau: float = field(default=0.5, metadata={"help": "qualification threshold on Kendall tau"})
    qualify_on: Literal["pointwise", "pairwise"] = field(default="pointwise", metadata={
        "help": "which tau the verdict uses"})
    require_significant: bool = field(default=True, metadata={"help": "the tau interval must also lie above 0"})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples for the 95% intervals"})
    seed: int = field(default=0, metadata={"help": "seed of the ladders and the bootstrap"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1:
            raise ConfigError(f"steps: must be >= 1, got {self.steps}")
        if self.degrader == "llm" and not self.generator.model:
            raise ConfigError("generator.model: the llm degrader needs a generation model")
        if self.qualify_on == "pairwise" and not self.pairwise:
            raise ConfigError("qualify_on: pairwise needs pairwise=true")


def build_degrader(config: Config) -> Any:
    """The rule-based degrader, or an LLM one on the recipe's generation model."""
    from rewards.degrade import LLMDegrader, RuleDegrader

    if config.degrader == "rules":
        return RuleDegrader()
    return LLMDegrader(build_generator(config.generator), template=config.degrader_template,
                       model=config.generator.model)


def run(config: Config) -> dict:
    """Build ladders, score them with the judge, write the report and the verdicts."""
    if not config.model:
        raise ConfigError("judge-validate: set model (the judge to validate: a model path or name)")
    return run_stage("judge-validate", config, _validate, prepare=_check_model)


def _check_model(run: StageRun) -> None:
    """The judge is a saved model (or a hub name), unless a server holds it."""
    if run.config.backend != "openai":
        check_model_path(run.config.model, "judge-validate", "model")


def _validate(run: StageRun) -> dict[str, Any]:
    from rewards.validation import validate_judge

    config, records = run.config, run.rows["input"]
    if config.max_prompts:
        records = records[: config.max_prompts]
    judge = build_judge(config)
    report = validate_judge(
        records, judge, degrader=build_degrader(config), steps=config.steps, kinds=config.kinds or None,
        pairwise=config.pairwise, min_kendall_tau=config.min_kendall_tau, qualify_on=config.qualify_on,
        require_significant=config.require_significant, completion_field=config.completion_field,
        language_field=config.language_field, output_dir=config.output_dir, resamples=config.resamples,
        seed=config.seed,
    )
    for group, verdict in report["verdicts"].items():
        word = "qualified" if verdict["qualified"] else "NOT qualified"
        print(f"[align judge-validate] {group}: {word}: {verdict['reason']}")
    tau = report["all"]["kendall_tau"]
    summary = {
        "ladders": report["ladders"],
        "skipped": len(report["skipped"]),
        "kendall_tau": {mode: round(iv["estimate"], 4) for mode, iv in tau.items() if iv},
        "qualified": {group: v["qualified"] for group, v in report["verdicts"].items()},
    }
    return summary
