"""KL(π‖π_ref) estimated from the policy's own samples.

For completions y drawn from π at temperature 1 (top-p 1),

    KL(π‖π_ref) = E_{y∼π}[ log π(y|x) − log π_ref(y|x) ],

so the per-sequence log-ratio Σ_t [log π(y_t|x, y_<t) − log π_ref(y_t|x, y_<t)] over the
completion's tokens is an unbiased estimate of the prompt's KL, and its mean over prompts
(bootstrapped over prompts) estimates the expected KL. Samples drawn at another temperature
or with nucleus filtering are not draws from π, so the estimate is refused for them.

The log-probs come from the same scoring kernel as the reference log-prob pass and the
trainers (`align.scoring.completion_logps`: float32 token log-probs, float64 sums), over
the exact token ids the sampler generated (its prompt ids, then the completion's ids up to
and including the stop token, or up to the budget for a cut completion), so nothing is
re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from align.scoring import SequenceCollator, completion_logps

Sequences = Sequence[tuple[Sequence[int], Sequence[int]]]


def sequence_logps(model: torch.nn.Module, sequences: Sequences, *, pad_token_id: int,
                   batch_size: int = 32) -> list[float]:
    """Σ_t log π(y_t | x, y_<t) of each (prompt ids, completion ids), in input order."""
    device = next(model.parameters()).device
    collator = SequenceCollator(pad_token_id=pad_token_id)
    out: list[float] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(sequences), batch_size):
            chunk = [(list(p), list(c)) for p, c in sequences[start : start + batch_size]]
            empty = [i for i, (_, c) in enumerate(chunk) if not c]
            if empty:
                raise ValueError(f"sequence {start + empty[0]}: no completion tokens to score")
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                     for k, v in collator.collate(chunk).items()}
            with torch.inference_mode():
                out.extend(completion_logps(model, batch).tolist())
    finally:
        model.train(was_training)
    return out


def sequence_logratios(
    policy: torch.nn.Module,
    reference: torch.nn.Module,
    sequences: Sequences,
    *,
    pad_token_id: int,
    batch_size: int = 32,
) -> list[float]:
    """log π(y|x) − log π_ref(y|x) per sequence: each an unbiased sample of KL(π‖π_ref)."""
    mine = sequence_logps(policy, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
    theirs = sequence_logps(reference, sequences, pad_token_id=pad_token_id, batch_size=batch_size)
    return [a - b for a, b in zip(mine, theirs)]


def check_kl_sampling(temperature: float, top_p: float) -> str | None:
    """None when samples at these settings are draws from π, else why the KL estimate is off."""
    if temperature != 1.0 or top_p != 1.0:
        return (f"KL(π‖π_ref) needs samples from π itself (temperature 1, top_p 1); these were drawn at "
                f"temperature {temperature}, top_p {top_p}")
    return None
