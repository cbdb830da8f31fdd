"""A plan as a table for people and as JSON for tools.

One ``JobPlan`` per job a stage runs (a training step, a log-prob pass, a vLLM engine):
its model, its setting, its bytes per GPU by part, whether it fits and, when it does not,
the smallest change that fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from align.plan.advice import Change
from align.plan.memory import GIB, Estimate
from align.plan.shapes import ModelShape


@dataclass
class Verdict:
    """Whether a job fits, and in words why (or why not)."""

    fits: bool
    reason: str


@dataclass
class JobPlan:
    """The plan of one job of one stage."""

    stage: str
    job: str
    model: str
    model_source: str
    shape: ModelShape | None
    setting: str
    estimate: Estimate | None
    verdict: Verdict
    gpu_memory: int
    headroom: int
    change: Change | None = None
    change_note: str = ""
    alternatives: list[tuple[str, Estimate, Verdict]] = field(default_factory=list)
    deepspeed_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    step: str = ""  # the recipe step (or phase: evaluate.kl) whose job this is; "" for a stage file


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def _estimate_lines(estimate: Estimate) -> list[str]:
    lines = [f"    {'part':<18} {'phase':<9} {'GiB/GPU':>8}   formula"]
    for part in estimate.parts:
        lines.append(f"    {part.name:<18} {part.phase:<9} {gib(part.bytes):>8}   {part.formula}")
    phases = [p.phase for p in estimate.parts]
    if "step" in phases and "backward" in phases:
        lines.append(f"    {'peak':<18} {estimate.peak_phase:<9} {gib(estimate.total):>8}   always + max(backward "
                     f"{gib(estimate.phase_bytes('backward'))}, step {gib(estimate.phase_bytes('step'))})")
    else:
        lines.append(f"    {'peak':<18} {'':<9} {gib(estimate.total):>8}")
    return lines


def render(plans: list[JobPlan], title: str) -> str:
    """The readable table of every job's plan."""
    out = [title, ""]
    for plan in plans:
        mark = "fits" if plan.verdict.fits else "DOES NOT FIT"
        where = plan.stage if not plan.step or plan.step == plan.stage else f"{plan.step} ({plan.stage})"
        out.append(f"[{where}] {plan.job}: {mark}")
        if plan.shape is not None:
            out.append(f"  model: {plan.model} ({plan.shape.num_params / 1e9:.2f}B parameters, "
                       f"{plan.shape.num_layers} layers, h {plan.shape.hidden_size}, config: {plan.model_source})")
        if plan.setting:
            out.append(f"  setting: {plan.setting}")
        if plan.estimate is not None:
            out.extend(_estimate_lines(plan.estimate))
        out.append(f"  {plan.verdict.reason}")
        if plan.deepspeed_bytes is not None:
            out.append(f"  DeepSpeed's estimator (Adam, model states only): {gib(plan.deepspeed_bytes)} GiB per GPU")
        for name, estimate, verdict in plan.alternatives:
            out.append(f"  alternative, {name}: {gib(estimate.total)} GiB per GPU: "
                       f"{'fits' if verdict.fits else 'does not fit'} ({verdict.reason})")
        if not plan.verdict.fits:
            if plan.change is not None:
                out.append(f"  smallest change that fits: {plan.change.label()} "
                           f"({gib(plan.change.estimate.total)} GiB per GPU){plan.change_note}")
            else:
                out.append(f"  no change tried fits{plan.change_note}")
        out.extend(f"  note: {note}" for note in plan.notes + (plan.estimate.notes if plan.estimate else []))
        out.append("")
    fitting = sum(p.verdict.fits for p in plans)
    out.append(f"{fitting} of {len(plans)} jobs fit.")
    return "\n".join(out)


def _estimate_json(estimate: Estimate | None) -> dict[str, Any] | None:
    if estimate is None:
        return None
    return {"kind": estimate.kind, "gpus": estimate.gpus, "total_bytes": estimate.total,
            "peak_phase": estimate.peak_phase,
            "parts": [dataclasses.asdict(p) for p in estimate.parts], "notes": estimate.notes,
            "extra": estimate.extra}


def to_json(plans: list[JobPlan], header: dict[str, Any]) -> dict[str, Any]:
    """The plan as a JSON-ready mapping."""
    jobs = []
    for plan in plans:
        jobs.append({
            "stage": plan.stage, "step": plan.step or plan.stage, "job": plan.job, "model": plan.model, "model_source": plan.model_source,
            "shape": dataclasses.asdict(plan.shape) if plan.shape is not None else None,
            "setting": plan.setting, "fits": plan.verdict.fits, "reason": plan.verdict.reason,
            "gpu_memory_bytes": plan.gpu_memory, "headroom_bytes": plan.headroom,
            "estimate": _estimate_json(plan.estimate),
            "deepspeed_model_states_bytes": plan.deepspeed_bytes,
            "alternatives": [{"name": n, "fits": v.fits, "reason": v.reason, "estimate": _estimate_json(e)}
                             for n, e, v in plan.alternatives],
            "smallest_change": None if plan.change is None else {
                "settings": plan.change.settings, "recipe_keys": list(plan.change.recipe_keys),
                "label": plan.change.label(), "estimate": _estimate_json(plan.change.estimate)},
            "notes": plan.notes,
        })
    return {**header, "fits": all(p.verdict.fits for p in plans), "jobs": jobs}
