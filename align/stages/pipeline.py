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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from align.config import ConfigError, apply_defaults, default_keys, from_dict, renamed_key_hint
from align.slurm import SlurmConfig
from align.stages import stage_module

ORDER = ("decontaminate", "sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")


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
    output_dir: str = field(default="runs", metadata={"help": "unused by the pipeline itself; each stage names its own"})
    stop_after: str | None = field(default=None, metadata={"help": "stop after this stage (e.g. pairs)"})
    overwrite: bool = field(default=False, metadata={
        "help": "redo every stage whose output was made from other settings or inputs (each removes only "
                "what it wrote); stages whose output is current are still skipped"})
    slurm: SlurmConfig = field(default_factory=SlurmConfig, metadata={
        "help": "`align submit`'s SLURM job settings (docs/slurm.md); the pipeline itself ignores them"})

    def __post_init__(self) -> None:
        if self.stop_after is not None and self.stop_after not in ORDER:
            raise ConfigError(f"stop_after: {self.stop_after!r} is not one of {list(ORDER)}")
        self.stage_configs()  # validate every section at load time, not mid-run

    def stage_configs(self) -> list[tuple[str, Any]]:
        """Each present stage's validated config, in pipeline order."""
        configs = []
        for name in ORDER:
            section = getattr(self, name)
            if section is None:
                continue
            module = stage_module(name)
            try:
                configs.append((name, from_dict(module.Config, apply_defaults(module.Config, self.defaults, section),
                                                where=f"{name}.")))
            except ConfigError as exc:
                raise ConfigError(f"pipeline section {name!r}: {exc}") from exc
            if name == self.stop_after:
                break
        known = set().union(*(default_keys(type(c)) for _, c in configs)) if configs else set()
        unused = set(self.defaults) - known
        if unused:
            hints = [h for k in sorted(unused) if (h := renamed_key_hint(k, sorted(known)))]
            raise ConfigError(f"defaults: keys {sorted(unused)} are known to no stage in this recipe"
                              + "".join(f". {h}" for h in hints))
        if not configs:
            raise ConfigError(f"a pipeline recipe needs at least one stage section of {list(ORDER)}")
        return configs


def run(config: Config) -> dict[str, Any]:
    """Run the stages in order; a stage whose output is complete and current skips itself."""
    results = {}
    for name, stage_config in config.stage_configs():
        print(f"[align pipeline] stage {name}")
        if config.overwrite:
            stage_config.overwrite = True
        results[name] = stage_module(name).run(stage_config)
    return results
