"""`run_sweep`: train every point of a grid from the same start, score each on validation prompts, choose one."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from align.errors import ConfigError, InputError
from align.sweep.grid import Point, check_grid
from align.sweep.inputs import (
    check_sweep_dir,
    identify_provider,
    start_fingerprint,
    validation_overlap,
)
from align.sweep.points import SamplerFactory, train_point, validate_point
from align.sweep.report import PointResult, SweepResult, choose, write_report
from align.sweep.settings import REWARD, SweepSettings


def point_config(base: Any, point: Point, output_dir: Path) -> Any:
    """The base training settings with the point's values, writing into ``output_dir``."""
    try:
        return dataclasses.replace(base, **point.settings, output_dir=str(output_dir))
    except ValueError as error:
        raise ConfigError(f"grid point {point.label}: {error}") from None


def in_memory_sampler(config: Any, settings: Any, tokenizer: Any) -> SamplerFactory:
    """Validation samplers on the transformers backend, over a model object or a directory."""
    from align.sampling.hf import TransformersSampler

    def build(name: str, model: Any) -> Any:
        if not isinstance(model, (str, Path)):
            model.eval()
        return TransformersSampler(model if not isinstance(model, Path) else str(model), tokenizer,
                                   chat_format=config.chat_format, chat_date=config.chat_date,
                                   enable_thinking=config.enable_thinking, batch_size=settings.batch_size,
                                   model_name=name)

    return build


# Settings that change how training runs but not how its rows are tokenized and checked
# (`align.trainers.preference_data`): a grid over these alone tokenizes the pairs once, for
# every point. A grid over any other key (max_length, loss_type, chat_date, ...) lets each
# point's trainer prepare the rows with its own settings.
TRAINING_ONLY_KEYS = frozenset({
    "beta", "beta_clamp", "normalize_loss_by_length", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs",
    "warmup_steps", "warmup_ratio", "weight_decay", "max_grad_norm", "max_steps", "num_train_epochs", "seed",
    "data_seed", "optimizer", "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "ademamix_beta3",
    "ademamix_alpha", "ademamix_t_alpha", "ademamix_t_beta3", "per_device_train_batch_size",
    "gradient_accumulation_steps", "global_batch_size", "lora_r", "lora_alpha", "lora_dropout",
})


def prepared_once(config: Any, rows: list[dict], tokenizer: Any, model: Any,
                  grid: Mapping[str, Any]) -> tuple[Any, dict]:
    """The pair rows tokenized once for every point when the grid varies only ``TRAINING_ONLY_KEYS``
    (with what the preparation counted: rows over max_length left out or cut); else the rows as given."""
    from align.trainers.preference_data import prepare_dataset

    if not set(grid) <= TRAINING_ONLY_KEYS:
        return rows, {}
    counted: dict[str, Any] = {}
    return prepare_dataset(rows, tokenizer, config, model, counted), counted


def run_sweep(
    config: Any,
    records: Sequence[Mapping[str, Any]],
    prompts: Sequence[Mapping[str, Any]],
    provider: Any,
    settings: SweepSettings,
    *,
    model: Any = None,
    tokenizer: Any = None,
    sampler: SamplerFactory | None = None,
    callbacks: Callable[[Point], Sequence[Any]] | None = None,
    provider_fingerprint: str | None = None,
    overwrite: bool = False,
    measures: Mapping[str, Any] | None = None,
    measure_fingerprints: Mapping[str, str] | None = None,
) -> SweepResult:
    """Train each grid point from the same start on the same pairs; evaluate each on the ``prompts``; choose.

    Args:
        config: the `PreferenceConfig` every point shares; ``output_dir`` is the sweep's
            directory (``points/<name>/``, ``validation/<name>/``, ``sweep.json``,
            ``sweep.md``, ``sweep.png``).
        records: pair rows with reference log-probs (``align logprobs``), the same for every point.
        prompts: the validation prompt records (``id``, ``messages``, the provider's reference field),
            disjoint from the prompts any result is reported on.
        provider: the reward provider that scores validation completions, or a function that
            builds one (called after the policies generated; then give ``provider_fingerprint``).
        settings: the grid, the metric that chooses, the validation settings.
        model / tokenizer: the start policy in memory (each point trains a copy); default:
            ``config.model_name_or_path``, loaded for each point.
        sampler: ``(policy name, model) -> Sampler`` for validation, given each point's
            directory (the trainer saved it there) and the start policy as passed (the model
            object, else ``config.model_name_or_path``); default: the transformers backend over
            the models in memory.
        callbacks: ``point -> trainer callbacks`` for that point's training.
        overwrite: redo a point (or its validation) whose output was made from other settings
            or inputs; finished points made from the same ones are always kept.
        measures: name -> reward provider that scores the validation answers again (the goal
            beside the reward trained on: an answer check, a stronger judge); each point's
            figures under each go to the report, and ``settings.select_on`` may name one to choose by.
            A measure may be a function that builds the provider (built for each point's scoring and
            released after, as ``provider``); then give its ``measure_fingerprints[name]``.

    Returns the `SweepResult` (every point's figures, the chosen point), also written to
    ``sweep.json`` and ``sweep.md``.
    """
    from align.eval.evaluate import check_prompts, free_device_memory
    from align.io.fingerprint import json_digest
    from align.logprobs import tokenizer_fingerprint

    points = settings.points()
    measures = dict(measures or {})
    if settings.select_on != REWARD and settings.select_on not in measures:
        raise ConfigError(f"select_on: {settings.select_on!r} is not a measure of this sweep (measures: "
                          f"{sorted(measures) or 'none'}; {REWARD!r} chooses by the validation reward)")
    out = Path(config.output_dir)
    check_sweep_dir(out)
    configs = {p.name: point_config(config, p, out / "points" / p.name) for p in points}  # all checked first
    rows, validation = [dict(r) for r in records], [dict(p) for p in prompts]
    if not rows:
        raise InputError("records: no pair rows to train on")
    check_prompts(validation, "validation prompts", getattr(provider, "reference_field", None))
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    fingerprints = {"start": start_fingerprint(model, config.model_name_or_path),
                    "tokenizer": tokenizer_fingerprint(tokenizer), "rows": json_digest(rows),
                    "validation": json_digest(validation),
                    "provider": identify_provider(provider, provider_fingerprint),
                    "measures": {name: identify_provider(m, (measure_fingerprints or {}).get(name))
                                 for name, m in measures.items()}}
    overlap = validation_overlap(rows, validation)
    if overlap:
        print(f"[align sweep] warning: {overlap} of {len(validation)} validation prompts are prompts of the training "
              "pairs; their scores are optimistic", flush=True)
    build_sampler = sampler or in_memory_sampler(config, settings.validation, tokenizer)
    start_policy = model if model is not None else config.model_name_or_path
    prepared: list[tuple[Any, dict]] = []  # the rows as the trainers take them, made when a point first trains

    def training_rows() -> tuple[Any, dict]:
        if not prepared:
            prepared.append(prepared_once(config, rows, tokenizer, model, settings.grid))
        return prepared[0]

    results = []
    for index, point in enumerate(points, start=1):
        print(f"[align sweep] point {index}/{len(points)}: {point.label}", flush=True)
        began = time.time()
        trained = train_point(point, configs[point.name], training_rows, fingerprints=fingerprints, model=model,
                              tokenizer=tokenizer, callbacks=callbacks(point) if callbacks else None,
                              overwrite=overwrite)
        policy = trained.model if trained.model is not None and sampler is None else out / "points" / point.name
        trained.model = None  # a sampler factory loads the saved point itself
        checked = validate_point(point, trained, out / "validation" / point.name, validation, provider,
                                 settings.validation, fingerprints=fingerprints, policy=policy,
                                 start_policy=start_policy, sampler=build_sampler, release=sampler is not None,
                                 overwrite=overwrite, measures=measures)
        policy = None
        free_device_memory()  # the point's trainer and model, before the next point loads its own
        results.append(PointResult.of(point, trained.summary, checked, out, settings,
                                      trained_now=trained.now, seconds=round(time.time() - began, 1)))
    result = SweepResult(grid=check_grid(settings.grid), metric=settings.metric,
                         points=results, chosen=choose(results), validation_prompts=len(validation),
                         validation_overlap=overlap, output_dir=str(out), select_on=settings.select_on)
    write_report(out, result)
    return result


__all__ = ["TRAINING_ONLY_KEYS", "in_memory_sampler", "point_config", "prepared_once", "run_sweep"]
