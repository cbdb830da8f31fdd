"""QRPO and DPO losses against the formulas of docs/method.md (QRPO; DPO and length-normalised DPO), computed independently in the test."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import pytest
import torch

from align.losses import (
    LossType,
    dpo_loss,
    qrpo_beta_log_z,
    qrpo_log_z,
    qrpo_loss,
    qrpo_terms,
)


def exact_beta_log_z(beta: float) -> float:
    """β·log(β·(exp(1/β) − 1)) straight from the formula, in 60-digit decimal (no overflow)."""
    with localcontext() as ctx:
        ctx.prec = 60
        b = Decimal(beta)
        return float(b * (b * ((1 / b).exp() - 1)).ln())


def reference_qrpo(
    policy, ref, rq, lengths, beta, length_normalize=True, clamp=None, per_token=False
):
    """Per-sample QRPO loss in float64 Python arithmetic, one sample at a time."""
    out = []
    for p, r, q, n in zip(policy, ref, rq, lengths):
        b = beta / n if length_normalize else beta
        if clamp is not None:
            b = min(b, clamp)
        value = (q - exact_beta_log_z(b) - b * (p - r)) ** 2
        out.append(value / n if per_token else value)
    return out


def random_batch(size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    policy = -torch.rand(size, generator=gen, dtype=torch.float64) * 200
    ref = policy + torch.randn(size, generator=gen, dtype=torch.float64) * 3
    rq = torch.randint(0, 11, (size,), generator=gen).double() / 10
    lengths = torch.randint(1, 400, (size,), generator=gen)
    return policy, ref, rq, lengths


@pytest.mark.parametrize(
    "options",
    [
        {"length_normalize": True},
        {"length_normalize": False},
        {"length_normalize": True, "beta_clamp": 0.1},
        {"length_normalize": True, "normalize_loss_by_length": True},
    ],
)
def test_qrpo_matches_float64_formula_on_random_batch(options):
    policy, ref, rq, lengths = random_batch()
    beta = 5.0 if options.get("length_normalize") else 0.05
    got = qrpo_loss(policy, ref, rq, lengths, beta=beta, **options)
    want = reference_qrpo(
        policy.tolist(),
        ref.tolist(),
        rq.tolist(),
        lengths.tolist(),
        beta,
        length_normalize=options["length_normalize"],
        clamp=options.get("beta_clamp"),
        per_token=options.get("normalize_loss_by_length", False),
    )
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


def test_qrpo_hand_worked_value():
    """β = 2, |y| = 4 → β_i = 0.5, u = 1/β_i = 2.

    Z = 0.5·(e² − 1) = 0.5·6.389056099 = 3.194528050, log Z = 1.161439362,
    β_i·log Z = 0.580719681. logratio = −1.0 − (−1.4) = 0.4 → β_i·logratio = 0.2.
    R_q = 0.9: residual = 0.9 − 0.580719681 − 0.2 = 0.119280319; loss = 0.014227795.
    """
    policy, ref = (
        torch.tensor([-1.0], dtype=torch.float64),
        torch.tensor([-1.4], dtype=torch.float64),
    )
    loss = qrpo_loss(policy, ref, [0.9], [4], beta=2.0)
    assert loss.item() == pytest.approx(0.014227795, abs=1e-9)
    terms = qrpo_terms(policy, ref, [0.9], [4], beta=2.0)
    assert terms.beta_i.item() == 0.5
    assert terms.log_z.item() == pytest.approx(1.161439362, abs=1e-9)
    assert terms.targets.item() == pytest.approx(0.9 - 0.580719681, abs=1e-9)
    assert terms.beta_logratio.item() == pytest.approx(0.2, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_beta_log_z_is_exact_from_1e_minus_4_to_10(dtype):
    betas = torch.logspace(-4, 1, 61, dtype=torch.float64)
    got = qrpo_beta_log_z(betas.to(dtype)).double()
    assert torch.isfinite(got).all()
    want = torch.tensor(
        [exact_beta_log_z(b) for b in betas.to(dtype).double().tolist()], dtype=torch.float64
    )
    rtol = 1e-13 if dtype is torch.float64 else 1.2e-7
    torch.testing.assert_close(got, want, rtol=rtol, atol=0.0)
    # where exp(1/β) fits in float64, log Z must agree with the naive formula
    naive_ok = betas > 1 / 700  # exp(1/β) representable in float64
    naive = torch.log(betas[naive_ok] * torch.expm1(1 / betas[naive_ok]))
    torch.testing.assert_close(qrpo_log_z(betas[naive_ok]), naive, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-10), (torch.float32, 1e-3)])
def test_qrpo_u_800_stays_finite_and_exact(dtype, rel):
    """|y| = 4000 with β = 5: u = 800, exp(u) overflows float64 but the loss must not.

    The residual 1 − 0.9916 − 0.00625 is small, so float32 inputs only carry ~4 digits of it.
    """
    policy = torch.tensor([-900.0], dtype=dtype, requires_grad=True)
    ref = torch.tensor([-905.0], dtype=dtype)
    loss = qrpo_loss(policy, ref, [1.0], [4000], beta=5.0)
    want = reference_qrpo([-900.0], [-905.0], [1.0], [4000], 5.0)[0]
    assert torch.isfinite(loss).all()
    assert loss.item() == pytest.approx(want, rel=rel)
    loss.sum().backward()
    assert torch.isfinite(policy.grad).all()


def test_small_beta_target_tends_to_one_plus_beta_log_beta():
    """docs/method.md, log Z in log space: for small b, b·log Z → 1 + b·log b (so the targets grow as b shrinks)."""
    b = torch.tensor([1e-4, 1e-3], dtype=torch.float64)
    torch.testing.assert_close(qrpo_beta_log_z(b), 1 + b * torch.log(b), rtol=1e-12, atol=1e-15)


def test_beta_clamp_caps_beta_i():
    """β = 5, |y| = 10 → β_i = 0.5, clamped to 0.1: the same loss as β = 1 unclamped."""
    policy, ref = (
        torch.tensor([-3.0, -7.0], dtype=torch.float64),
        torch.tensor([-2.0, -9.0], dtype=torch.float64),
    )
    clamped = qrpo_terms(policy, ref, [0.3, 1.0], [10, 100], beta=5.0, beta_clamp=0.1)
    torch.testing.assert_close(clamped.beta_i, torch.tensor([0.1, 0.05], dtype=torch.float64))
    same_beta = qrpo_loss(policy[:1], ref[:1], [0.3], [10], beta=1.0)
    torch.testing.assert_close(clamped.losses[:1], same_beta)


def test_qrpo_terms_are_consistent_with_the_loss():
    policy, ref, rq, lengths = random_batch(seed=3)
    terms = qrpo_terms(policy, ref, rq, lengths, beta=5.0, normalize_loss_by_length=True)
    torch.testing.assert_close(terms.beta_i, 5.0 / lengths.double())
    torch.testing.assert_close(terms.targets, rq - terms.beta_i * terms.log_z)
    torch.testing.assert_close(terms.beta_logratio, terms.beta_i * (policy - ref))
    torch.testing.assert_close(
        terms.losses, (terms.targets - terms.beta_logratio) ** 2 / lengths.double()
    )
    torch.testing.assert_close(
        terms.losses, qrpo_loss(policy, ref, rq, lengths, beta=5.0, normalize_loss_by_length=True)
    )


def test_qrpo_gradcheck():
    policy, ref, rq, lengths = random_batch(size=6, seed=1)
    policy.requires_grad_(True)
    for options in ({}, {"length_normalize": False}, {"normalize_loss_by_length": True}):
        beta = 5.0 if options.get("length_normalize", True) else 0.1
        assert torch.autograd.gradcheck(
            lambda p, o=options, b=beta: qrpo_loss(p, ref, rq, lengths, beta=b, **o), (policy,)
        )


@pytest.mark.parametrize("bad", [0, -3])
def test_qrpo_nonpositive_length_names_the_sample(bad):
    policy = torch.zeros(3)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        qrpo_loss(policy, policy, [0.1, 0.2, 0.3], [5, bad, 7], beta=5.0)


def test_qrpo_bad_input_names_the_field():
    with pytest.raises(ValueError, match="ref_logps"):
        qrpo_loss(torch.zeros(3), torch.zeros(2), [0.0] * 3, [1] * 3, beta=1.0)
    with pytest.raises(ValueError, match="quantile_rewards"):
        qrpo_loss(torch.zeros(3), torch.zeros(3), [0.0] * 2, [1] * 3, beta=1.0)
    with pytest.raises(ValueError, match=r"quantile_rewards\[2\] = 3.5"):
        qrpo_loss(torch.zeros(3), torch.zeros(3), [0.0, 1.0, 3.5], [1] * 3, beta=1.0)
    with pytest.raises(ValueError, match=r"quantile_rewards\[0\] = nan"):
        qrpo_loss(torch.zeros(1), torch.zeros(1), [float("nan")], [1], beta=1.0)
    with pytest.raises(ValueError, match="lengths are required"):
        qrpo_loss(torch.zeros(3), torch.zeros(3), [0.0] * 3, None, beta=1.0)


def test_qrpo_bf16_inputs_are_computed_in_float32():
    policy = torch.tensor([-10.0, -20.0], dtype=torch.bfloat16)
    loss = qrpo_loss(policy, policy, [0.5, 0.5], [10, 20], beta=5.0)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(
        loss.double(),
        torch.tensor(
            [(0.5 - exact_beta_log_z(0.5)) ** 2, (0.5 - exact_beta_log_z(0.25)) ** 2],
            dtype=torch.float64,
        ),
        rtol=1e-6,
        atol=0,
    )


def reference_dpo(pc, pr, rc, rr, beta, len_c=None, len_r=None):
    out = []
    for i in range(len(pc)):
        c, r = pc[i] - rc[i], pr[i] - rr[i]
        if len_c is not None:
            c, r = c / len_c[i], r / len_r[i]
        z = beta * (c - r)
        out.append(math.log1p(math.exp(-z)) if z > 0 else -z + math.log1p(math.exp(z)))
    return out


def test_dpo_hand_worked_value():
    """β = 0.1, logratio_c = −1 − (−2) = 1, logratio_r = −3 − (−1) = −2.

    margin = 0.1·(1 − (−2)) = 0.3; loss = −log σ(0.3) = log(1 + e^−0.3) = 0.554355244.
    """
    t = lambda v: torch.tensor([v], dtype=torch.float64)
    loss = dpo_loss(t(-1.0), t(-3.0), t(-2.0), t(-1.0), beta=0.1)
    assert loss.item() == pytest.approx(0.554355244, abs=1e-9)


@pytest.mark.parametrize("length_normalize", [False, True])
def test_dpo_matches_float64_formula(length_normalize):
    gen = torch.Generator().manual_seed(7)
    pc, pr, rc, rr = (-torch.rand(12, generator=gen, dtype=torch.float64) * 100 for _ in range(4))
    len_c = torch.randint(1, 300, (12,), generator=gen)
    len_r = torch.randint(1, 300, (12,), generator=gen)
    got = dpo_loss(
        pc,
        pr,
        rc,
        rr,
        beta=2.0,
        chosen_lengths=len_c,
        rejected_lengths=len_r,
        length_normalize=length_normalize,
    )
    lens = (len_c.tolist(), len_r.tolist()) if length_normalize else (None, None)
    want = reference_dpo(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist(), 2.0, *lens)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


def test_dpo_extreme_margins_stay_finite():
    zero = torch.zeros(2, dtype=torch.float64)
    chosen = torch.tensor([1e4, -1e4], dtype=torch.float64, requires_grad=True)
    loss = dpo_loss(chosen, zero, zero, zero, beta=1.0)
    torch.testing.assert_close(loss.detach(), torch.tensor([0.0, 1e4], dtype=torch.float64))
    loss.sum().backward()
    torch.testing.assert_close(chosen.grad, torch.tensor([0.0, -1.0], dtype=torch.float64))


def test_dpo_gradcheck():
    gen = torch.Generator().manual_seed(2)
    pc, pr, rc, rr = (-torch.rand(5, generator=gen, dtype=torch.float64) * 50 for _ in range(4))
    len_c, len_r = torch.tensor([3, 9, 27, 81, 5]), torch.tensor([4, 4, 40, 8, 1])
    inputs = (pc.requires_grad_(True), pr.requires_grad_(True))
    for normalize in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, n=normalize: dpo_loss(
                a,
                b,
                rc,
                rr,
                beta=0.5,
                chosen_lengths=len_c,
                rejected_lengths=len_r,
                length_normalize=n,
            ),
            inputs,
        )


def test_dpo_length_normalize_needs_lengths_and_positive_ones():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="chosen_lengths is required"):
        dpo_loss(x, x, x, x, beta=0.1, length_normalize=True)
    with pytest.raises(ValueError, match=r"rejected_lengths\[0\]"):
        dpo_loss(
            x,
            x,
            x,
            x,
            beta=0.1,
            chosen_lengths=[1, 2],
            rejected_lengths=[0, 2],
            length_normalize=True,
        )


def test_loss_type_capabilities():
    assert LossType("qrpo") is LossType.QRPO and LossType("dpo") is LossType.DPO
    assert LossType.DPO.pairwise and not LossType.QRPO.pairwise
    assert LossType.QRPO.uses_quantile_rewards and not LossType.DPO.uses_quantile_rewards
