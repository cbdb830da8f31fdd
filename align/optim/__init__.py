"""Optimizers by name, so a recipe can say ``optim: ademamix`` with flat keys.

Recipe keys (all optional but ``lr``)::

    adamw:    lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0
    ademamix: lr, beta1=0.9, beta2=0.999, beta3=0.99, alpha=8.0,
              t_alpha=total_steps, t_beta3=total_steps, eps=1e-8, weight_decay=0.0

The defaults are Apertus's (report §E.3/§E.4; docs/method.md, AdEMAMix) and the same as
the trainer configs': beta3=0.99, alpha=8 and both warmups over all training steps, which
is what ``t_alpha``/``t_beta3`` default to when ``total_steps`` is given; pass 0 to turn a warmup off. A key the chosen optimizer does not
use is an error, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from align.errors import ConfigError
from align.optim.ademamix import AdEMAMix, alpha_schedule, beta3_schedule

__all__ = ["OPTIMIZERS", "AdEMAMix", "alpha_schedule", "beta3_schedule", "build_optimizer"]


def _adamw(
    params: Iterable[Any],
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    total_steps: int | None = None,
) -> torch.optim.Optimizer:
    """torch AdamW; ``weight_decay`` defaults to 0 like transformers' TrainingArguments."""
    del total_steps  # AdamW has no step-dependent setting
    return torch.optim.AdamW(
        params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay
    )


def _ademamix(
    params: Iterable[Any],
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    beta3: float = 0.99,
    alpha: float = 8.0,
    t_alpha: int | None = None,
    t_beta3: int | None = None,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    total_steps: int | None = None,
) -> torch.optim.Optimizer:
    """AdEMAMix with T_α and T_β3 defaulting to ``total_steps`` as in the report."""
    return AdEMAMix(
        params,
        lr=lr,
        betas=(beta1, beta2, beta3),
        alpha=alpha,
        t_alpha=total_steps if t_alpha is None else t_alpha,
        t_beta3=total_steps if t_beta3 is None else t_beta3,
        eps=eps,
        weight_decay=weight_decay,
    )


OPTIMIZERS: dict[str, tuple[Callable[..., torch.optim.Optimizer], frozenset[str]]] = {
    "adamw": (_adamw, frozenset({"lr", "beta1", "beta2", "eps", "weight_decay", "total_steps"})),
    "ademamix": (
        _ademamix,
        frozenset(
            {
                "lr",
                "beta1",
                "beta2",
                "beta3",
                "alpha",
                "t_alpha",
                "t_beta3",
                "eps",
                "weight_decay",
                "total_steps",
            }
        ),
    ),
}


def build_optimizer(name: str, params: Iterable[Any], **kwargs: Any) -> torch.optim.Optimizer:
    """Build the optimizer a recipe names, rejecting keys it would not use.

    ``params`` is what torch optimizers take (tensors or param-group dicts); ``kwargs`` are
    the recipe keys listed in this module's docstring, plus ``total_steps``.
    """
    key = name.lower()
    if key not in OPTIMIZERS:
        raise ConfigError(f"optim: unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    builder, accepted = OPTIMIZERS[key]
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(f"optim {key!r} does not use {unknown}; it accepts {sorted(accepted)}")
    if "lr" not in kwargs:
        raise ConfigError(f"optim {key!r}: lr is required")
    total_steps = kwargs.get("total_steps")
    if total_steps is not None and (
        isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1
    ):
        raise ConfigError(f"total_steps must be a positive int, got {total_steps!r}")
    return builder(params, **kwargs)
