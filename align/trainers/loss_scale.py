"""How one optimizer step's loss is scaled: an exact mean over every sample of the step.

A step is several micro-batches (gradient accumulation) on several processes. Each
micro-batch backpropagates Σ its losses / the step's count of samples, and DDP and DeepSpeed
average gradients over processes, so each process multiplies by the number of processes:
the gradient is then that of the plain mean over the whole step, whatever the split
(per-device batch 8 × accumulation 1 = batch 1 × accumulation 8 = 2 processes × 4), and a
last, short accumulation window is weighted by what it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor


def samples_per_pair(uses_quantile_rewards: bool) -> int:
    """QRPO trains chosen and rejected as two samples (Apertus report, E.2); DPO one per pair."""
    return 2 if uses_quantile_rewards else 1


def local_step_samples(batches: Iterable[Mapping[str, Tensor]], per_pair: int) -> int:
    """Samples in this process's micro-batches of the step (``lengths``: 2 per pair)."""
    return sum(batch["lengths"].numel() // 2 * per_pair for batch in batches)


def step_loss(losses: Tensor, step_samples: Tensor | int | None, num_processes: int) -> Tensor:
    """This micro-batch's share of the step's mean loss (the plain mean outside training)."""
    if step_samples is None:
        return losses.mean()
    return losses.sum() / step_samples * num_processes


def token_loss(weighted_nll: Tensor, step_tokens: Tensor | int, num_processes: int,
               counted_on_all_processes: bool) -> Tensor:
    """Σ w·nll over this micro-batch / the step's Σ w (SFT); × processes when that sum counts
    every process's tokens, as the gradient average divides by the processes again."""
    loss = weighted_nll / torch.as_tensor(step_tokens).clamp(min=1e-8)
    return loss * num_processes if counted_on_all_processes else loss
