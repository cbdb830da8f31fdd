"""align: post-training the Apertus way (tool-aware SFT, QRPO/DPO, reward models, judge).

The pipeline's stages as Python functions over lists of records or `datasets.Dataset`
(each also a CLI stage, `align <stage> RECIPE.yaml`)::

    import align, rewards
    align.train_sft(align.SFTConfig(...), conversations)           # SFT
    align.sample(prompts, align.TransformersSampler(...), output_dir=...)  # n references
    rewards.annotate(records, rewards.RewardModel(...), output_dir)  # rewards
    pairs, skipped = align.make_pairs(annotated, seed=0)             # quantiles + pairs
    align.compute_ref_logprobs(pairs, model, tokenizer, output_dir=..., ...)
    align.train(align.PreferenceConfig(loss_type="qrpo", ...), rows)  # QRPO / DPO
    align.PreferenceTrainer(model, args=config, train_dataset=rows).train()  # as TRL's DPOTrainer
    align.evaluate(held_out, [align.EvalPolicy("sft", sampler=...), ...], provider,
                   output_dir, baseline="sft")                     # win rates, KL, CIs
    align.pipeline("recipes/tiny/rounds.yaml", rounds=3)           # a recipe, rounds included
    align.run_sweep(config, rows, validation, provider,
                    align.SweepSettings(grid={"beta": [1, 5, 20]}))   # tuning, chosen on validation

Names load on first use, so `import align` stays light. A mistake the user can fix raises
one of the classes of `align.errors` (`align.AlignError` and its subclasses: `ConfigError`,
`InputError`, `MissingInputError`, `RecordError`, `ServiceError`,
`MissingDependencyError`), each also the built-in exception it replaced (`ValueError`,
`FileNotFoundError`, `RuntimeError`, `ImportError`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, tuple[str, str]] = {
    "render": ("align.chat", "render"),
    "encode": ("align.chat", "encode"),
    "install_format": ("align.chat", "install_format"),
    "SFTConfig": ("align.trainers.sft_config", "SFTConfig"),
    "train_sft": ("align.trainers.sft_trainer", "train_sft"),
    "TransformersSampler": ("align.sampling.hf", "TransformersSampler"),
    "VLLMSampler": ("align.sampling.vllm_backend", "VLLMSampler"),
    "OpenAISampler": ("align.sampling.openai_backend", "OpenAISampler"),
    "sample": ("align.sampling.stages", "sample_references"),
    "sample_references": ("align.sampling.stages", "sample_references"),
    "sample_offline": ("align.sampling.stages", "sample_offline"),
    "quantile_rewards": ("align.data.quantiles", "quantile_rewards"),
    "make_pairs": ("align.data.pairs", "make_pairs"),
    "compute_ref_logprobs": ("align.logprobs", "compute_ref_logprobs"),
    "load_ref_logprobs": ("align.logprobs", "load_ref_logprobs"),
    "PreferenceConfig": ("align.trainers.preference_config", "PreferenceConfig"),
    "PreferenceTrainer": ("align.trainers.preference_trainer", "PreferenceTrainer"),
    "from_trl_row": ("align.data.trl_rows", "from_trl_row"),
    "train": ("align.trainers.preference_trainer", "train"),
    "evaluate": ("align.eval.evaluate", "evaluate"),
    "EvalPolicy": ("align.eval.evaluate", "EvalPolicy"),
    "EvalSettings": ("align.eval.evaluate", "EvalSettings"),
    "run_sweep": ("align.sweep.run", "run_sweep"),
    "SweepSettings": ("align.sweep.settings", "SweepSettings"),
    "SweepResult": ("align.sweep.report", "SweepResult"),
    "decontaminate": ("align.data.decontaminate", "decontaminate"),
    "read_records": ("align.io", "read_records"),
    "pipeline": ("align.drivers.pipeline", "pipeline"),
    "read_output": ("align.io", "read_output"),
    # the errors a user can fix (align.errors): each also its former built-in
    "AlignError": ("align.errors", "AlignError"),
    "ConfigError": ("align.errors", "ConfigError"),
    "InputError": ("align.errors", "InputError"),
    "MissingInputError": ("align.errors", "MissingInputError"),
    "RecordError": ("align.errors", "RecordError"),
    "ServiceError": ("align.errors", "ServiceError"),
    "MissingDependencyError": ("align.errors", "MissingDependencyError"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'align' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(module), attribute)


def __dir__() -> list[str]:
    """The lazy names too, so completion in a notebook finds the API (``dir(align)``)."""
    return sorted(set(globals()) | set(_LAZY))
