"""AdEMAMix (Pagliardini et al., 2025, arXiv:2409.03137): Adam plus a slow EMA of gradients.

Apertus trains SFT and QRPO with it (report §E.3, §E.4: β3 = 0.99, α = 8, T_α = T_β3 =
total steps). Update rule, exactly as in docs/method.md, AdEMAMix, at step t = 1, 2, ...::

    m1 ← β1·m1 + (1−β1)·g          (fast EMA, bias-corrected)
    m2 ← β3(t)·m2 + (1−β3(t))·g    (slow EMA, not bias-corrected)
    ν  ← β2·ν + (1−β2)·g²          (bias-corrected)
    θ  ← θ − η·((m̂1 + α(t)·m2) / (√ν̂ + ε) + λ·θ)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from align.errors import ConfigError, InputError

__all__ = ["AdEMAMix", "alpha_schedule", "beta3_schedule"]


def alpha_schedule(step: int, alpha: float, t_alpha: int | None) -> float:
    """α(t) = min(t·α/T_α, α): a linear warmup, since a large α early on diverges (docs/method.md, AdEMAMix)."""
    if not t_alpha:
        return alpha
    return min(step * alpha / t_alpha, alpha)


def beta3_schedule(step: int, beta1: float, beta3: float, t_beta3: int | None) -> float:
    """β3(t) = min(exp(ln β1·ln β3 / ((1−t/T)·ln β3 + (t/T)·ln β1)), β3) (docs/method.md, AdEMAMix).

    Starts at β1 and grows so that the slow EMA's half-life rises linearly in t; t is
    capped at T, where the formula reaches β3 exactly.
    """
    if not t_beta3:
        return beta3
    frac = min(step, t_beta3) / t_beta3
    log_b1, log_b3 = math.log(beta1), math.log(beta3)
    return min(math.exp(log_b1 * log_b3 / ((1.0 - frac) * log_b3 + frac * log_b1)), beta3)


def _check_hyperparameters(
    lr: float,
    betas: tuple[float, float, float],
    alpha: float,
    t_alpha: int | None,
    t_beta3: int | None,
    eps: float,
    weight_decay: float,
) -> None:
    """Reject settings the update rule is undefined or meaningless for, naming the setting."""
    if not lr >= 0:
        raise ConfigError(f"lr must be >= 0, got {lr}")
    if len(betas) != 3:
        raise ConfigError(f"betas must be (beta1, beta2, beta3), got {betas!r}")
    for name, value in zip(("beta1", "beta2", "beta3"), betas):
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{name} must be in [0, 1), got {value}")
    if t_beta3 and (betas[0] == 0.0 or betas[2] == 0.0):
        raise ConfigError("t_beta3 needs beta1 > 0 and beta3 > 0 (the schedule takes their logs)")
    if not alpha >= 0:
        raise ConfigError(f"alpha must be >= 0, got {alpha}")
    for name, value in (("t_alpha", t_alpha), ("t_beta3", t_beta3)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ConfigError(f"{name} must be a non-negative int or None, got {value!r}")
    if not eps >= 0:
        raise ConfigError(f"eps must be >= 0, got {eps}")
    if not weight_decay >= 0:
        raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")


class AdEMAMix(torch.optim.Optimizer):
    """AdEMAMix with the α and β3 warmups and decoupled weight decay (docs/method.md, AdEMAMix).

    Args:
        lr: learning rate η.
        betas: (β1, β2, β3): fast EMA, second moment, slow EMA. Apertus uses (0.9, 0.999, 0.99).
        alpha: weight α of the slow EMA (8 in Apertus).
        t_alpha: warmup steps for α; None or 0 keeps α constant.
        t_beta3: warmup steps for β3 (from β1 up to β3); None or 0 keeps β3 constant.
        eps: added to √ν̂.
        weight_decay: λ, decoupled: θ ← θ − η·λ·θ alongside the update.

    State per parameter: ``step`` (int), ``exp_avg_fast`` (m1), ``exp_avg_slow`` (m2),
    ``exp_avg_sq`` (ν); it round-trips through ``state_dict()`` so a resumed run continues
    identically.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 8.0,
        t_alpha: int | None = None,
        t_beta3: int | None = None,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        betas = tuple(betas)
        _check_hyperparameters(lr, betas, alpha, t_alpha, t_beta3, eps, weight_decay)
        defaults = {
            "lr": lr,
            "betas": betas,
            "alpha": alpha,
            "t_alpha": t_alpha,
            "t_beta3": t_beta3,
            "eps": eps,
            "weight_decay": weight_decay,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g_index, group in enumerate(self.param_groups):
            for p_index, param in enumerate(group["params"]):
                if param.grad is None:
                    continue
                self._check_grad(param, g_index, p_index)
                self._update(param, group)
        return loss

    @staticmethod
    def _check_grad(param: Tensor, g_index: int, p_index: int) -> None:
        """Sparse or complex gradients would be silently mishandled; say so instead."""
        where = f"param_groups[{g_index}]['params'][{p_index}]"
        if param.grad.is_sparse:
            raise InputError(f"{where} has a sparse gradient; AdEMAMix needs dense gradients")
        if torch.is_complex(param):
            raise InputError(f"{where} is complex; AdEMAMix supports real parameters only")

    def _update(self, param: Tensor, group: dict[str, Any]) -> None:
        """Apply the update rule (docs/method.md, AdEMAMix) to one parameter, advancing its step count."""
        grad = param.grad
        state = self.state[param]
        if not state:
            state["step"] = 0
            state["exp_avg_fast"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_slow"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["step"] = int(state["step"]) + 1
        step = state["step"]
        beta1, beta2, beta3_final = group["betas"]
        alpha = alpha_schedule(step, group["alpha"], group["t_alpha"])
        beta3 = beta3_schedule(step, beta1, beta3_final, group["t_beta3"])
        m1, m2, nu = state["exp_avg_fast"], state["exp_avg_slow"], state["exp_avg_sq"]

        m1.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        m2.mul_(beta3).add_(grad, alpha=1.0 - beta3)
        nu.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)

        denom = (nu / (1.0 - beta2**step)).sqrt_().add_(group["eps"])
        update = (m1 / (1.0 - beta1**step)).add_(m2, alpha=alpha).div_(denom)
        if group["weight_decay"]:
            update.add_(param, alpha=group["weight_decay"])
        param.add_(update, alpha=-group["lr"])
