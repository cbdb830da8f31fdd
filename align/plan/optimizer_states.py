"""What an optimizer keeps per parameter, read off the optimizer itself.

The plan does not keep its own table of state counts: it builds the named optimizer
(``align.optim``, or torch's AdamW for transformers' ``adamw_*`` names) on a three-element
parameter, takes one step, and counts what the state holds: tensors shaped like the
parameter (AdEMAMix: m1, m2 and ν; AdamW: m and v) and scalar tensors per parameter tensor
(AdamW's float32 ``step``; AdEMAMix counts steps in a Python int).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from align.errors import ConfigError


@dataclass(frozen=True)
class OptimizerLayout:
    """``per_element``: state tensors shaped like each parameter (their dtype is the
    parameter's); ``scalar_bytes``: bytes of scalar state per parameter tensor."""

    name: str
    per_element: int
    scalar_bytes: int


def _probe(build) -> tuple[int, int]:
    import torch

    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.ones(3)
    optimizer = build([param])
    optimizer.step()
    state = optimizer.state[param]
    tensors = [v for v in state.values() if torch.is_tensor(v)]
    per_element = sum(1 for v in tensors if v.shape == param.shape)
    scalar_bytes = sum(v.numel() * v.element_size() for v in tensors if v.shape != param.shape)
    return per_element, scalar_bytes


@cache
def optimizer_layout(name: str) -> OptimizerLayout:
    """The layout of an ``align.optim`` optimizer (``ademamix``, ``adamw``) or of one of
    transformers' ``optim`` names of the AdamW family (``adamw_torch``, ``adamw_torch_fused``, ...)."""
    import torch

    from align.optim import OPTIMIZERS, build_optimizer

    key = name.lower()
    if key in OPTIMIZERS:
        per_element, scalar = _probe(lambda params: build_optimizer(key, params, lr=1e-3, total_steps=10))
    elif key.startswith("adamw") and "8bit" not in key and "4bit" not in key:
        per_element, scalar = _probe(lambda params: torch.optim.AdamW(params, lr=1e-3))
    else:
        raise ConfigError(f"optimizer {name!r}: the plan knows align's optimizers ({', '.join(sorted(OPTIMIZERS))}) "
                          "and transformers' AdamW names (optim=adamw_torch, adamw_torch_fused)")
    return OptimizerLayout(name=key, per_element=per_element, scalar_bytes=scalar)
