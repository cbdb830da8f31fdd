"""Preference losses as pure tensor functions: QRPO and DPO, plain and length-normalised.

Source: the Apertus report §3.4 / Appendix E.4 (docs/method.md, QRPO), QRPO (Matrenok et al., 2025,
arXiv:2507.08068), DPO (Rafailov et al., 2023, arXiv:2305.18290).

All log-probabilities are *sums* over completion tokens, one value per sample (shape
``(B,)``); ``lengths`` are completion token counts |y| including the end-of-turn token.
Every function returns per-sample values; the trainer takes the mean.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from align.errors import ConfigError

__all__ = [
    "LossType",
    "QRPOTerms",
    "dpo_loss",
    "qrpo_beta_log_z",
    "qrpo_log_z",
    "qrpo_loss",
    "qrpo_terms",
]


class LossType(str, enum.Enum):
    """The preference losses; trainers ask these properties instead of comparing names.

    Both are defined on log π_θ − log π_ref, so every type needs reference log-probs (from
    the offline pass, or from a reference model or adapter during training).
    """

    QRPO = "qrpo"
    DPO = "dpo"

    @property
    def pairwise(self) -> bool:
        """DPO needs chosen and rejected in the same batch; QRPO scores each sample alone."""
        return self is LossType.DPO

    @property
    def uses_quantile_rewards(self) -> bool:
        """QRPO regresses on R_q (docs/method.md, Quantile rewards); DPO only needs the order of the pair."""
        return self is LossType.QRPO


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision sums of log-probs lose the small differences the losses are made of."""
    return torch.promote_types(dtype, torch.float32)


def _as_vector(
    value: Tensor | Sequence[float], name: str, size: int, like: Tensor, dtype: torch.dtype
) -> Tensor:
    """A 1-D ``dtype`` tensor of ``size`` on ``like``'s device, or a ValueError naming ``name``."""
    tensor = torch.as_tensor(value, dtype=dtype, device=like.device)
    if tensor.dim() != 1 or tensor.shape[0] != size:
        raise ValueError(f"{name}: expected shape ({size},), got {tuple(tensor.shape)}")
    return tensor


def _check_lengths(lengths: Tensor, name: str) -> None:
    """|y| ≤ 0 gives β/|y| = ∞ and a NaN loss (docs/method.md, What the trainer computes): refuse it, naming the sample."""
    bad = torch.nonzero(~(lengths > 0)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"{name}[{i}] = {lengths[i].item()}: completion lengths must be positive "
            "(count the end-of-turn token; skip completions with no scored tokens)"
        )


def _check_same_size(tensors: dict[str, Tensor]) -> int:
    """All per-sample inputs must be 1-D and the same size; return that size."""
    sizes = {name: tuple(t.shape) for name, t in tensors.items()}
    first_name, first = next(iter(tensors.items()))
    if first.dim() != 1:
        raise ValueError(
            f"{first_name}: expected a 1-D tensor of per-sample sums, got {sizes[first_name]}"
        )
    for name, shape in sizes.items():
        if shape != sizes[first_name]:
            raise ValueError(f"{name}: shape {shape} differs from {first_name} {sizes[first_name]}")
    return first.shape[0]


def _log1mexp(u: Tensor) -> Tensor:
    """log(1 − exp(−u)) for u > 0, accurate at both ends (Mächler 2012: switch at ln 2)."""
    return torch.where(
        u < 0.6931471805599453, torch.log(-torch.expm1(-u)), torch.log1p(-torch.exp(-u))
    )


def qrpo_log_z(beta_i: Tensor) -> Tensor:
    """log Z for Z = β(exp(1/β) − 1) (docs/method.md, log Z in log space), in log space so it never overflows.

    log Z = log β + log(exp(u) − 1) with u = 1/β and log(exp(u) − 1) = u + log(1 − exp(−u)).
    Finite for any β > 0 (u = 800 at β/|y| = 5/4000, where exp(u) overflows float64).
    The sum cancels for large β (log Z ≈ 0.05 at β = 10), so it runs in float64 and is
    cast back: a constant per sample (no gradient), cheap at any batch size.
    """
    b = beta_i.detach().to(torch.float64)
    u = torch.reciprocal(b)
    return (torch.log(b) + u + _log1mexp(u)).to(beta_i.dtype)


def qrpo_beta_log_z(beta_i: Tensor) -> Tensor:
    """β·log Z, the offset in the QRPO target; tends to 1 + β·log β as β → 0 (docs/method.md, log Z in log space)."""
    return beta_i * qrpo_log_z(beta_i)


def _check_quantiles(rewards: Tensor) -> None:
    """R_q lies in [0, 1] (docs/method.md, Quantile rewards); anything else is most likely a raw reward passed by mistake."""
    bad = torch.nonzero(~((rewards >= 0) & (rewards <= 1))).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"quantile_rewards[{i}] = {rewards[i].item()}: quantile rewards lie in [0, 1] "
            "(pass R_q from the pairs stage, not the raw reward)"
        )


def _qrpo_beta_i(
    beta: float, lengths: Tensor | None, beta_clamp: float | None, like: Tensor
) -> Tensor:
    """β_i = β/|y_i| (or β where ``lengths`` is None), capped at ``beta_clamp``; no gradient."""
    beta_i = torch.full_like(like, float(beta)) if lengths is None else beta / lengths
    if beta_clamp is not None:
        beta_i = beta_i.clamp(max=beta_clamp)
    return beta_i.detach()


@dataclass(frozen=True)
class QRPOTerms:
    """Per-sample QRPO quantities, shape ``(B,)``; the trainer logs them (detach first).

    ``losses = (targets − beta_logratio)² [/ |y|]`` with ``targets = R_q − β_i·log Z``.
    """

    quantile_rewards: Tensor
    beta_i: Tensor
    log_z: Tensor
    targets: Tensor
    beta_logratio: Tensor
    losses: Tensor


def qrpo_terms(
    policy_logps: Tensor,
    ref_logps: Tensor,
    quantile_rewards: Tensor | Sequence[float],
    lengths: Tensor | Sequence[int] | None,
    *,
    beta: float,
    length_normalize: bool = True,
    beta_clamp: float | None = None,
    normalize_loss_by_length: bool = False,
) -> QRPOTerms:
    """All QRPO quantities for a batch (docs/method.md, QRPO); ``qrpo_loss`` returns their ``losses``.

    With ``length_normalize`` (the Apertus method) β_i = β/|y_i| in every term, log Z
    included; ``beta_clamp`` caps β_i (0.1 reproduces the published runs). With
    ``normalize_loss_by_length`` each squared term is divided by |y_i|. ``lengths`` may be
    None only when neither length option is on.
    """
    if not beta > 0:
        raise ConfigError(f"beta must be positive, got {beta}")
    if beta_clamp is not None and not beta_clamp > 0:
        raise ConfigError(f"beta_clamp must be positive or None, got {beta_clamp}")
    size = _check_same_size({"policy_logps": policy_logps, "ref_logps": ref_logps})
    dtype = _compute_dtype(policy_logps.dtype)
    rewards = _as_vector(quantile_rewards, "quantile_rewards", size, policy_logps, dtype)
    _check_quantiles(rewards)
    if lengths is None and (length_normalize or normalize_loss_by_length):
        raise ValueError("lengths are required with length_normalize or normalize_loss_by_length")
    lengths_t = (
        None if lengths is None else _as_vector(lengths, "lengths", size, policy_logps, dtype)
    )
    if lengths_t is not None:
        _check_lengths(lengths_t, "lengths")

    logratio = policy_logps.to(dtype) - ref_logps.to(dtype)
    beta_i = _qrpo_beta_i(beta, lengths_t if length_normalize else None, beta_clamp, logratio)
    log_z = qrpo_log_z(beta_i)
    targets = rewards - beta_i * log_z
    beta_logratio = beta_i * logratio
    losses = (targets - beta_logratio).square()
    if normalize_loss_by_length:
        losses = losses / lengths_t
    return QRPOTerms(rewards, beta_i, log_z, targets, beta_logratio, losses)


def qrpo_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    quantile_rewards: Tensor | Sequence[float],
    lengths: Tensor | Sequence[int] | None,
    *,
    beta: float,
    length_normalize: bool = True,
    beta_clamp: float | None = None,
    normalize_loss_by_length: bool = False,
) -> Tensor:
    """Per-sample QRPO loss (R_q − β_i·log Z_i − β_i·logratio)², shape ``(B,)`` (docs/method.md, QRPO).

    Arguments as in ``qrpo_terms``. A zero or negative length is a ValueError naming the
    sample index, never a NaN.
    """
    return qrpo_terms(
        policy_logps,
        ref_logps,
        quantile_rewards,
        lengths,
        beta=beta,
        length_normalize=length_normalize,
        beta_clamp=beta_clamp,
        normalize_loss_by_length=normalize_loss_by_length,
    ).losses


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float,
    chosen_lengths: Tensor | Sequence[int] | None = None,
    rejected_lengths: Tensor | Sequence[int] | None = None,
    length_normalize: bool = False,
) -> Tensor:
    """Per-sample DPO loss −log σ(β·(logratio_c − logratio_r)), shape ``(B,)`` (docs/method.md, DPO and length-normalised DPO).

    With ``length_normalize`` each log-ratio is divided by its completion length first
    (−log σ(β·(logratio_c/|y_c| − logratio_r/|y_r|)), the variant the report found better).
    Uses ``logsigmoid``, so large margins of either sign stay finite.
    """
    if not beta > 0:
        raise ConfigError(f"beta must be positive, got {beta}")
    size = _check_same_size(
        {
            "policy_chosen_logps": policy_chosen_logps,
            "policy_rejected_logps": policy_rejected_logps,
            "ref_chosen_logps": ref_chosen_logps,
            "ref_rejected_logps": ref_rejected_logps,
        }
    )
    dtype = _compute_dtype(policy_chosen_logps.dtype)
    chosen = policy_chosen_logps.to(dtype) - ref_chosen_logps.to(dtype)
    rejected = policy_rejected_logps.to(dtype) - ref_rejected_logps.to(dtype)
    if length_normalize:
        for name, value in (
            ("chosen_lengths", chosen_lengths),
            ("rejected_lengths", rejected_lengths),
        ):
            if value is None:
                raise ValueError(f"{name} is required with length_normalize=True")
        len_c = _as_vector(chosen_lengths, "chosen_lengths", size, chosen, dtype)
        len_r = _as_vector(rejected_lengths, "rejected_lengths", size, chosen, dtype)
        _check_lengths(len_c, "chosen_lengths")
        _check_lengths(len_r, "rejected_lengths")
        chosen, rejected = chosen / len_c, rejected / len_r
    return -F.logsigmoid(beta * (chosen - rejected))
