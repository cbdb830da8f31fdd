"""Whether QRPO's log-ratios follow their regression targets, and the KL those targets imply.

QRPO regresses β_i·log(π/π_ref) of each completion onto R_q − β_i·log Z (docs/method.md,
QRPO): each completion has a target log-ratio t = R_q/β_i − log Z. Training starts at a
log-ratio of 0 and a policy that learns the regression moves each log-ratio from 0 towards
its target. At a small β_i the policy can instead push probability out of every completion
it is shown, chosen and rejected alike, into text none of them contains (in the demo: never
ending the turn): the chosen log-ratios fall the wrong way from 0 while the rejected ones
head for their very negative targets. ``off_target`` measures that: how far a log-ratio lies
outside the span from 0 to its target, in nats per token. ``TargetWatch`` warns when its
mean on either side stays above ``target_margin``, and keeps the record the run's summary
reports.

The targets describe a policy, π* ∝ π_ref·exp(R_q/β_i); since R_q is uniform on [0, 1]
under π_ref (the quantile of a reference sample), its KL from π_ref is, with u = 1/β_i,

    KL(π*‖π_ref) = u/(1 − e^{−u}) − 1 − log Z,   log Z = log((e^u − 1)/u),

the KL the regression asks for (``implied_kl``): a measured KL far above it says the policy
left the targets behind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from align.losses import qrpo_log_z

logger = logging.getLogger(__name__)

SIDES = ("chosen", "rejected")


def implied_kl(beta_i: Tensor) -> Tensor:
    """KL(π*‖π_ref) in nats of the policy the QRPO targets describe, per sample (see the module)."""
    b = beta_i.detach().to(torch.float64)
    u = torch.reciprocal(b)
    return (u / -torch.expm1(-u) - 1 - qrpo_log_z(b)).clamp(min=0).to(beta_i.dtype)


def off_target(logratio: Tensor, target: Tensor) -> Tensor:
    """How far each log-ratio lies outside the span from 0 (where training starts) to its target: 0 on
    the way there, the overshoot past it, or the distance gone the wrong way from 0."""
    low, high = torch.minimum(target, torch.zeros_like(target)), torch.maximum(target, torch.zeros_like(target))
    return (low - logratio).clamp(min=0) + (logratio - high).clamp(min=0)


def tracking_metrics(logratio: Tensor, targets: Tensor, beta_i: Tensor, lengths: Tensor) -> dict[str, Tensor]:
    """Per-sample numbers to log (first half chosen, second rejected): log-ratios, their targets, the
    distance off course in nats per token, and the targets' implied KL."""
    target_logratio = targets / beta_i
    off = off_target(logratio, target_logratio) / lengths
    metrics: dict[str, Tensor] = {"qrpo/implied_kl": implied_kl(beta_i)}
    for name, values in (("logratio", logratio), ("target_logratio", target_logratio), ("off_target", off)):
        chosen, rejected = values.detach().chunk(2)
        metrics[f"qrpo/{name}/chosen"], metrics[f"qrpo/{name}/rejected"] = chosen, rejected
    return metrics


# Logging steps in a row a side must stay past the margin: a noisy step (a high learning rate
# bounces log-ratios about their targets) is not the steady drift of the failure.
PATIENCE = 3


@dataclass
class TargetWatch:
    """Warns when the mean off-course distance of a side stays above ``margin`` (nats per token) for
    ``PATIENCE`` logging steps in a row, and records each such step for the run's summary."""

    margin: float | None
    warnings: list[dict[str, Any]] = field(default_factory=list)
    streak: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIDES, 0))

    def check(self, logs: dict[str, float], step: int) -> None:
        """Add ``qrpo/off_target_warning`` (1 once a side has stayed past the margin, else 0) to a
        training log that has the off-course means, and warn the first time."""
        if self.margin is None or not all(f"qrpo/off_target/{s}" in logs for s in SIDES):
            return
        values = {s: logs[f"qrpo/off_target/{s}"] for s in SIDES}
        for side, value in values.items():
            self.streak[side] = self.streak[side] + 1 if value > self.margin else 0
        past = {s: v for s, v in values.items() if self.streak[s] >= PATIENCE}
        logs["qrpo/off_target_warning"] = float(bool(past))
        if not past:
            return
        if not self.warnings:
            sides = ", ".join(f"{s} {v:.3g}" for s, v in past.items())
            logger.warning("QRPO step %d: log-ratios ran off their regression targets (%s nats per token, past "
                           "target_margin %s for %d logging steps): at this beta/|y| the policy pushes probability "
                           "out of the completions it is shown instead of matching the targets; raise beta "
                           "(docs/method.md, The safe beta range)", step, sides, self.margin, PATIENCE)
        self.warnings.append({"step": step, **{s: round(v, 6) for s, v in past.items()}})

    def summary(self) -> dict[str, Any] | None:
        """What the run's summary says of it: None when the margin is off, else the steps past it."""
        if self.margin is None:
            return None
        worst = max(self.warnings, key=lambda w: max(w.get(s, 0.0) for s in SIDES), default=None)
        return {"margin": self.margin, "logs_past_margin": len(self.warnings),
                "first_step": self.warnings[0]["step"] if self.warnings else None, "worst": worst}


def summary_line(summary: Mapping[str, Any] | None) -> str | None:
    """One line for the stage's output when a run went off course, else None."""
    if not summary or not summary["logs_past_margin"]:
        return None
    return (f"warning: QRPO log-ratios ran off their regression targets at {summary['logs_past_margin']} logging "
            f"step(s) from step {summary['first_step']} (beyond {summary['margin']} nats per token; worst "
            f"{summary['worst']}): raise beta (docs/method.md, The safe beta range)")


__all__ = ["PATIENCE", "TargetWatch", "implied_kl", "off_target", "summary_line", "tracking_metrics"]
