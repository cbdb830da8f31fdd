"""AdEMAMix against a float64 implementation of the formulas in docs/method.md, AdEMAMix, written here."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from align.optim import AdEMAMix, alpha_schedule, beta3_schedule, build_optimizer


def spec_alpha(t, alpha, t_alpha):
    return alpha if not t_alpha else min(t * alpha / t_alpha, alpha)


def spec_beta3(t, beta1, beta3, t_beta3):
    if not t_beta3:
        return beta3
    s = min(t, t_beta3) / t_beta3
    return min(
        math.exp(
            math.log(beta1) * math.log(beta3) / ((1 - s) * math.log(beta3) + s * math.log(beta1))
        ),
        beta3,
    )


def spec_run(theta, grads, *, lr, betas, alpha, t_alpha, t_beta3, eps, weight_decay):
    """docs/method.md, AdEMAMix, step by step on plain float64 tensors, no in-place tricks."""
    beta1, beta2, beta3 = betas
    m1 = m2 = nu = torch.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        b3 = spec_beta3(t, beta1, beta3, t_beta3)
        a = spec_alpha(t, alpha, t_alpha)
        m1 = beta1 * m1 + (1 - beta1) * g
        m2 = b3 * m2 + (1 - b3) * g
        nu = beta2 * nu + (1 - beta2) * g * g
        m1_hat = m1 / (1 - beta1**t)
        nu_hat = nu / (1 - beta2**t)
        theta = theta - lr * ((m1_hat + a * m2) / (torch.sqrt(nu_hat) + eps) + weight_decay * theta)
    return theta


def random_grads(shape, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(steps)]


def run_optimizer(optimizer, params, grads_per_param):
    for step_grads in zip(*grads_per_param):
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        optimizer.step()


SETTINGS = {
    "lr": 0.01,
    "betas": (0.9, 0.999, 0.99),
    "alpha": 8.0,
    "t_alpha": 5,
    "t_beta3": 8,
    "eps": 1e-8,
    "weight_decay": 0.1,
}


def test_matches_spec_formulas_through_warmups_and_weight_decay():
    theta0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = random_grads((4, 3), steps=12, seed=1)  # past both warmups (5 and 8 steps)
    param = torch.nn.Parameter(theta0.clone())
    run_optimizer(AdEMAMix([param], **SETTINGS), [param], [grads])
    want = spec_run(theta0, grads, **SETTINGS)
    torch.testing.assert_close(param.detach(), want, rtol=1e-12, atol=1e-14)


def test_without_warmups_alpha_and_beta3_are_constant():
    settings = dict(SETTINGS, t_alpha=None, t_beta3=None, weight_decay=0.0)
    theta0 = torch.ones(5, dtype=torch.float64)
    grads = random_grads((5,), steps=4, seed=2)
    param = torch.nn.Parameter(theta0.clone())
    run_optimizer(AdEMAMix([param], **settings), [param], [grads])
    torch.testing.assert_close(
        param.detach(), spec_run(theta0, grads, **settings), rtol=1e-12, atol=1e-14
    )


def test_first_step_by_hand():
    """t = 1, g = 2, θ = 1, no warmups, β = (0.9, 0.999, 0.99), α = 8, λ = 0.

    m1 = 0.2, m̂1 = 2; m2 = 0.02; ν = 0.004, ν̂ = 4, √ν̂ = 2;
    update = (2 + 8·0.02)/2 = 1.08; θ = 1 − 0.1·1.08 = 0.892 (ε = 0).
    """
    param = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    param.grad = torch.tensor([2.0], dtype=torch.float64)
    AdEMAMix([param], lr=0.1, betas=(0.9, 0.999, 0.99), alpha=8.0, eps=0.0).step()
    assert param.item() == pytest.approx(0.892, abs=1e-15)


def test_schedule_values():
    """α: linear to α at T_α. β3: at t = T/2 the slow EMA's half-life is the mean of the
    end points' half-lives: 1/ln β3(T/2) = (1/ln 0.9 + 1/ln 0.99)/2 = (−9.49122 − 99.49916)/2
    = −54.49519, so β3(50) = exp(−1/54.49519) = 0.981817 for T = 100.
    """
    assert alpha_schedule(5, 8.0, 10) == 4.0
    assert alpha_schedule(10, 8.0, 10) == 8.0
    assert alpha_schedule(25, 8.0, 10) == 8.0
    assert alpha_schedule(1, 8.0, None) == 8.0
    assert beta3_schedule(0, 0.9, 0.99, 100) == pytest.approx(0.9, abs=1e-15)
    assert beta3_schedule(50, 0.9, 0.99, 100) == pytest.approx(0.981817, abs=1e-6)
    assert beta3_schedule(100, 0.9, 0.99, 100) == pytest.approx(0.99, abs=1e-15)
    assert beta3_schedule(400, 0.9, 0.99, 100) == pytest.approx(0.99, abs=1e-15)
    assert beta3_schedule(3, 0.9, 0.9999, 0) == 0.9999
    values = [beta3_schedule(t, 0.9, 0.99, 100) for t in range(0, 101, 10)]
    assert values == sorted(values)
    for t in (1, 7, 33, 99):
        assert beta3_schedule(t, 0.9, 0.99, 100) == pytest.approx(
            spec_beta3(t, 0.9, 0.99, 100), rel=1e-14
        )


def test_state_dict_round_trip_resumes_identically():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    groups = [
        {"params": model[0].parameters()},
        {"params": model[2].parameters(), "weight_decay": 0.0, "alpha": 2.0},
    ]
    optimizer = AdEMAMix(groups, **SETTINGS)
    data = torch.randn(6, 16, 4, generator=torch.Generator().manual_seed(3))

    def train(m, opt, batches):
        for x in batches:
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()

    train(model, optimizer, data[:3])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)

    resumed_model = copy.deepcopy(model)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed = AdEMAMix(
        [
            {"params": resumed_model[0].parameters()},
            {"params": resumed_model[2].parameters(), "weight_decay": 0.0, "alpha": 2.0},
        ],
        lr=1.0,  # overwritten by the checkpoint's param groups
    )
    resumed.load_state_dict(checkpoint["optim"])
    assert resumed.param_groups[1]["alpha"] == 2.0 and resumed.param_groups[0]["t_beta3"] == 8

    train(model, optimizer, data[3:])
    train(resumed_model, resumed, data[3:])
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)
    assert all(s["step"] == 6 for s in resumed.state.values())


def test_params_without_grad_are_untouched():
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    a.grad = torch.ones(2)
    optimizer = AdEMAMix([a, b], lr=0.1, weight_decay=0.5)
    optimizer.step()
    assert torch.equal(b.detach(), torch.ones(2)) and b not in optimizer.state
    assert not torch.equal(a.detach(), torch.ones(2))


def test_sparse_gradient_is_a_clear_error():
    embedding = torch.nn.Embedding(5, 2, sparse=True)
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(
        ValueError, match=r"param_groups\[0\]\['params'\]\[0\] has a sparse gradient"
    ):
        AdEMAMix(embedding.parameters(), lr=0.1).step()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"betas": (0.9, 0.999)}, "betas"),
        ({"betas": (0.9, 1.0, 0.99)}, "beta2"),
        ({"t_alpha": -1}, "t_alpha"),
        ({"t_beta3": 2.5}, "t_beta3"),
        ({"betas": (0.0, 0.999, 0.99), "t_beta3": 10}, "t_beta3"),
        ({"lr": -1.0}, "lr"),
        ({"weight_decay": -0.1}, "weight_decay"),
    ],
)
def test_bad_hyperparameters_name_the_setting(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AdEMAMix([torch.nn.Parameter(torch.ones(1))], **kwargs)


def test_build_optimizer_fills_warmups_from_total_steps():
    params = [torch.nn.Parameter(torch.ones(1))]
    opt = build_optimizer("ademamix", params, lr=5e-7, beta3=0.99, alpha=8.0, total_steps=300)
    group = opt.param_groups[0]
    assert isinstance(opt, AdEMAMix)
    assert (group["t_alpha"], group["t_beta3"], group["betas"]) == (300, 300, (0.9, 0.999, 0.99))
    no_warmup = build_optimizer("AdEMAMix", params, lr=1e-3, t_alpha=0, total_steps=300)
    assert (no_warmup.param_groups[0]["t_alpha"], no_warmup.param_groups[0]["t_beta3"]) == (0, 300)


def test_build_optimizer_adamw_and_rejected_keys():
    params = [torch.nn.Parameter(torch.ones(1))]
    adamw = build_optimizer("adamw", params, lr=1e-3, beta2=0.95, total_steps=10)
    assert isinstance(adamw, torch.optim.AdamW)
    assert (
        adamw.param_groups[0]["betas"] == (0.9, 0.95)
        and adamw.param_groups[0]["weight_decay"] == 0.0
    )
    with pytest.raises(ValueError, match="beta3"):
        build_optimizer("adamw", params, lr=1e-3, beta3=0.99)
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        build_optimizer("sgd", params, lr=1e-3)
    with pytest.raises(ValueError, match="lr is required"):
        build_optimizer("ademamix", params)
    with pytest.raises(ValueError, match="total_steps"):
        build_optimizer("ademamix", params, lr=1e-3, total_steps=0)
