"""One point of a sweep: train it, then evaluate it on the validation prompts, each step an
output directory with a manifest, so a rerun skips what is finished and resumes the rest.

``points/<name>/`` is the trained policy (the trainer's ``save_model`` output); its
manifest records the point's training settings and the fingerprints of the start policy,
its tokenizer and the pair rows. ``validation/<name>/`` is `align.evaluate` of the start
policy and the point on the validation prompts (``report.json``, ``report.md``,
``eval.jsonl``); its manifest binds it to the trained point's output id, so a point
trained again is evaluated again. A complete directory made from the same settings and
inputs is skipped; a partial one resumes (trainer checkpoints under ``save_strategy``,
the evaluation's job shards); one made from others stops the sweep naming each difference,
unless ``overwrite`` (then what that step wrote is removed and redone).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.config import to_dict
from align.io import stage_completion_info
from align.manifests import StageRun
from align.sweep.grid import Point

POINT_STAGE = "sweep-point"
VALIDATION_STAGE = "sweep-validation"
START = "start"  # the start policy's name in each validation report
# Validation settings that group work without changing a figure (job batches, shards, plots).
NEUTRAL_VALIDATION_KEYS = frozenset({"batch_size", "kl_batch_size", "shard_index", "num_shards", "plots"})

SamplerFactory = Callable[[str, Any], Any]  # (policy name, model object or directory) -> Sampler


@dataclass
class PointSpec:
    """What a trained point is made from: its manifest's settings."""

    output_dir: str
    training: dict[str, Any]  # the point's PreferenceConfig
    start: dict[str, Any]  # the start policy's fingerprint
    tokenizer: str  # the tokenizer's fingerprint
    rows: str  # a digest of the pair rows


@dataclass
class ValidationSpec:
    """What a point's validation is made from."""

    output_dir: str
    point: str  # the trained point's output id (a point trained again is other weights)
    start: dict[str, Any]
    prompts: str  # a digest of the validation prompts
    provider: str  # the reward provider's fingerprint
    settings: dict[str, Any]  # the evaluation settings that change a figure
    measures: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> fingerprint of each measure


@dataclass
class Trained:
    """A trained point: its summary, and its model when it was trained in this process."""

    summary: dict[str, Any]
    output_id: str
    model: Any = None
    now: bool = False


def train_point(point: Point, config: Any, rows: Callable[[], tuple[Any, Mapping[str, Any]]], *,
                fingerprints: Mapping[str, Any], model: Any = None, tokenizer: Any = None,
                callbacks: Sequence[Any] | None = None, overwrite: bool = False) -> Trained:
    """Train ``config`` (the point's settings, ``output_dir`` its directory) unless that output is done.

    ``rows()``: the pair rows, or the dataset the trainer prepared from them once for every
    point, with what that preparation counted (called only when the point trains).
    ``model``: the start policy in memory (a copy is trained), else ``config.model_name_or_path``
    is loaded. ``fingerprints``: ``start``, ``tokenizer`` and ``rows`` (of the rows as given;
    computed once per sweep).
    """
    from transformers.trainer_utils import get_last_checkpoint

    from align.trainers.common import last_loss
    from align.trainers.preference_trainer import train

    out = Path(config.output_dir)
    spec = PointSpec(output_dir=str(out), training=to_dict(config), start=dict(fingerprints["start"]),
                     tokenizer=fingerprints["tokenizer"], rows=fingerprints["rows"])
    run = StageRun.begin(POINT_STAGE, spec, output_dir=out, overwrite=overwrite)
    if run.skip:
        info = stage_completion_info(out) or {}
        return Trained(summary=info.get("summary") or {}, output_id=str(info.get("output_id")))
    run.start()
    last = get_last_checkpoint(str(out)) if out.is_dir() else None
    if last:
        print(f"[align sweep] {point.label}: resuming from {last}", flush=True)
        config = dataclasses.replace(config, resume_from_checkpoint=last)
    policy = copy.deepcopy(model).train() if model is not None else None
    data, counted = rows()
    trainer = train(config, data, policy, tokenizer=tokenizer, callbacks=list(callbacks or []))
    summary = {"settings": point.settings, "steps": trainer.state.global_step, "train_loss": last_loss(trainer),
               "log_history": trainer.state.log_history, "target_tracking": trainer.target_watch.summary(),
               **counted, **trainer.data_summary}
    run.finish(summary, announce=False)
    output_id = str((stage_completion_info(out) or {}).get("output_id"))
    return Trained(summary=summary, output_id=output_id, model=trainer.model, now=True)


def validate_point(point: Point, trained: Trained, output_dir: Path, prompts: Sequence[Mapping[str, Any]],
                   provider: Any, settings: Any, *, fingerprints: Mapping[str, Any], policy: Any, start_policy: Any,
                   sampler: SamplerFactory, release: bool = True, overwrite: bool = False,
                   measures: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate the start policy and the point on the validation prompts (``align.evaluate``), unless done.

    ``policy`` / ``start_policy``: a model object or a directory, handed to ``sampler``.
    ``release``: build each sampler when its policy's turn to generate comes and release it
    after (an engine holding a GPU); else both are built now (samplers over models already in
    memory). ``measures``: name -> provider scoring the same answers again (``align.eval.rescore``),
    each with its fingerprint in ``fingerprints["measures"]``. Returns the summary: the point's
    figures (``point_metrics``) and the start policy's, and the same under each measure.
    """
    from align.eval.evaluate import EvalPolicy, evaluate
    from align.sweep.settings import point_metrics, start_metrics

    measures = dict(measures or {})
    figures = {k: v for k, v in to_dict(settings).items() if k not in NEUTRAL_VALIDATION_KEYS}
    spec = ValidationSpec(output_dir=str(output_dir), point=trained.output_id, start=dict(fingerprints["start"]),
                          prompts=fingerprints["validation"], provider=fingerprints["provider"], settings=figures,
                          measures={name: fingerprints["measures"][name] for name in measures})
    # a point trained in this run is other weights than any validation already there: that one is redone
    run = StageRun.begin(VALIDATION_STAGE, spec, output_dir=output_dir, overwrite=overwrite or trained.now)
    if run.skip:
        return (stage_completion_info(output_dir) or {}).get("summary") or {}
    run.start()
    builders = {START: lambda: sampler(START, start_policy), point.name: lambda: sampler(point.name, policy)}
    policies = [EvalPolicy(name, sampler=build if release else build()) for name, build in builders.items()]
    report = evaluate(prompts, policies, provider, output_dir, baseline=START, settings=settings,
                      source="validation prompts")
    summary = {"settings": point.settings, "metrics": point_metrics(report, point.name),
               "start": start_metrics(report, START), "prompts": report["prompts"]}
    if measures:
        summary["measures"] = measure_figures(output_dir, prompts, measures, point.name, settings)
    run.finish(summary, announce=False)
    return summary


def measure_figures(output_dir: Path, prompts: Sequence[Mapping[str, Any]], measures: Mapping[str, Any], name: str,
                    settings: Any) -> dict[str, dict[str, Any]]:
    """The validation answers (``eval.jsonl``) scored again by each measure: the point's figures and the
    start policy's under it, as ``point_metrics`` and ``start_metrics`` give them (KL is the reward's own)."""
    from align.eval.rescore import rescore_rows
    from align.eval.summary import build_report
    from align.io import read_records
    from align.sweep.settings import point_metrics, start_metrics

    rows = read_records(output_dir / "eval.jsonl")
    out = {}
    for measure, given in measures.items():
        provider = given if hasattr(given, "score") else given()  # a builder: built now, released after
        scored = rescore_rows(rows, prompts, provider, batch_size=settings.batch_size)
        provider = None
        report = {"overall": build_report(scored, [START, name], START, settings, provider_name=measure)["overall"]}
        out[measure] = {"metrics": point_metrics(report, name), "start": start_metrics(report, START)}
    return out


__all__ = ["NEUTRAL_VALIDATION_KEYS", "POINT_STAGE", "START", "VALIDATION_STAGE", "PointSpec", "Trained",
           "ValidationSpec", "train_point", "validate_point"]
