"""How close a float32 result must be to its float64 reference: the one rule the tests use.

A float32 computation of ``y = f(x)`` differs from the float64 value by the rounding of its
inputs carried through ``f``, plus the rounding of ``y`` itself (first order):

    |Δy| ≤ Σ_j |∂f/∂x_j| · |Δx_j|  +  u·|y|,     u = 2⁻²⁴ (float32's unit roundoff)

An input that float32 code accumulated as a sum of ``terms`` values (a sequence's
log-probability is a sum over its tokens; each token's log-probability comes from a float32
log-softmax over float32 logits) carries up to ``terms`` roundings of its own size:
``|Δx_j| ≤ terms_j · u · |x_j|`` (the bound for recursive summation, with every term of the
sum's sign). The tolerance is that bound times ``SAFETY`` (a few roundings per operation:
the log-softmax, the subtraction of the reference, the square); it comes from the dtype and
the magnitudes alone, so it holds on any platform's float32 kernels, and it stays orders of
magnitude below the difference a wrong formula makes (the tests check that difference too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
SAFETY = 4.0


def float_tolerance(f: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], terms: Sequence[torch.Tensor | float],
                    dtype: torch.dtype = torch.float32, output_terms: float = 1.0) -> torch.Tensor:
    """Per-element absolute tolerance for ``f(*inputs)`` computed in ``dtype`` against float64.

    ``terms[j]`` is how many values ``dtype`` code summed to make ``inputs[j]`` (1 for a value it
    was given as is); ``output_terms``, how many it summed to make the output (a mean over a
    batch: the batch's size).
    """
    u = UNIT_ROUNDOFF[dtype]
    xs = [x.detach().to(torch.float64).requires_grad_(True) for x in inputs]
    y = f(*xs)
    grads = torch.autograd.grad(y.sum(), xs, allow_unused=True)
    bound = output_terms * u * y.detach().abs()
    for x, grad, count in zip(xs, grads, terms):
        if grad is not None:
            bound = bound + grad.abs() * torch.as_tensor(count, dtype=torch.float64) * u * x.detach().abs()
    return SAFETY * bound


def assert_float_close(got: torch.Tensor, want: torch.Tensor, tolerance: torch.Tensor) -> None:
    """``got`` within ``tolerance`` of ``want``, element by element (no relative slack on top)."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    excess = (got - want).abs() - tolerance
    worst = int(excess.argmax())
    assert excess.max() <= 0, (f"element {worst}: {got[worst].item()!r} against {want[worst].item()!r}, off by "
                               f"{(got - want).abs()[worst].item():.3g} where float rounding allows "
                               f"{tolerance[worst].item():.3g}")
