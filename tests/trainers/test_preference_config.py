"""PreferenceConfig: resolved defaults, and errors that name the fix."""

from __future__ import annotations

import pytest

from align.trainers import PreferenceConfig


def make(tmp_path, **kwargs) -> PreferenceConfig:
    return PreferenceConfig(output_dir=str(tmp_path), report_to="none", **kwargs)


def test_defaults_follow_the_apertus_recipe_on_cpu(tmp_path):
    cfg = make(tmp_path)
    assert (cfg.loss_type, cfg.beta, cfg.length_normalize, cfg.beta_clamp) == ("qrpo", 5.0, True, None)
    assert (cfg.reference, cfg.optimizer, cfg.ademamix_beta3, cfg.ademamix_alpha) == ("precomputed", "ademamix", 0.99, 8.0)
    assert cfg.learning_rate == 5e-7
    assert cfg.bf16 is False  # no CUDA here


def test_beta_default_depends_on_length_normalisation(tmp_path):
    assert make(tmp_path, loss_type="dpo", length_normalize=False).beta == 0.1
    assert make(tmp_path, loss_type="dpo").beta == 5.0
    assert make(tmp_path, beta=2.0).beta == 2.0


def test_optimizer_kwargs_default_the_warmups_to_total_steps(tmp_path):
    kwargs = make(tmp_path, learning_rate=1e-6, weight_decay=0.1).optimizer_kwargs(total_steps=100)
    assert kwargs == {"lr": 1e-6, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1, "total_steps": 100,
                          "beta3": 0.99, "alpha": 8.0, "t_alpha": None, "t_beta3": None}
    assert "beta3" not in make(tmp_path, optimizer="adamw").optimizer_kwargs(total_steps=10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_type": "ipo"}, r"loss_type='ipo': choose one of \['qrpo', 'dpo'\]"),
        ({"beta": 0.0}, "beta=0.0: must be > 0"),
        ({"loss_type": "dpo", "beta_clamp": 0.1}, "beta_clamp applies to QRPO only"),
        ({"loss_type": "dpo", "normalize_loss_by_length": True}, "normalize_loss_by_length applies to QRPO only"),
        ({"reference": "live"}, r"reference='live': choose one of \['precomputed', 'model', 'adapter'\]"),
        ({"optimizer": "sgd"}, "optimizer='sgd': choose one of"),
        ({"optim": "adafactor"}, "set optimizer=None to use transformers' optimizers"),
        ({"num_ref_rewards": 0}, "num_ref_rewards=0: must be >= 1"),
        ({"max_length": 1}, "max_length=1"),
        ({"ademamix_beta3": 1.0}, r"ademamix_beta3=1.0: must be in \[0, 1\)"),
        ({"ademamix_t_alpha": -1}, "ademamix_t_alpha=-1: must be >= 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_fix(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kwargs)


def test_transformers_optimizer_is_usable_when_optimizer_is_none(tmp_path):
    cfg = make(tmp_path, optimizer=None, optim="adamw_torch")
    assert cfg.optimizer is None
