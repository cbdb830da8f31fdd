"""`align tiny-models`: the models the tiny recipes read, in the recipes' architectures."""

from __future__ import annotations

import json

import pytest

from align.errors import ConfigError
from align.stages.tiny_models import config_from_args, run


def model_type(path) -> str:
    return json.loads((path / "config.json").read_text())["model_type"]


def test_the_policy_takes_the_named_architecture_and_the_reward_model_stays_llama(tmp_path, capsys):
    paths = run(config_from_args([f"output_dir={tmp_path}", "architecture=apertus"]))
    assert model_type(tmp_path / "policy") == "apertus"
    assert model_type(tmp_path / "reward_model") == "llama"
    assert set(paths) == {"policy", "reward_model", "own_template"}
    assert model_type(tmp_path / "own_template") == "llama"
    run(config_from_args([f"output_dir={tmp_path}", "architecture=apertus"]))
    assert "already there" in capsys.readouterr().out


def test_a_folder_holding_another_architecture_is_not_passed_off_as_the_one_asked_for(tmp_path):
    run(config_from_args([f"output_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"holds a llama model, not apertus.*overwrite=true"):
        run(config_from_args([f"output_dir={tmp_path}", "architecture=apertus"]))
    run(config_from_args([f"output_dir={tmp_path}", "architecture=apertus", "overwrite=true"]))
    assert model_type(tmp_path / "policy") == "apertus"


def test_an_unknown_architecture_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"architecture='gpt2'.*llama, apertus, qwen3"):
        run(config_from_args([f"output_dir={tmp_path}", "architecture=gpt2"]))
    assert not (tmp_path / "policy").exists()


def test_the_stage_and_the_builder_name_the_same_models_and_a_subset_builds_only_those(tmp_path):
    from align.stages import tiny_models
    from align.testing import tiny

    assert tiny_models.MODELS == tiny.MODELS  # the stage keeps its own copy to import without torch
    paths = tiny.save_tiny_models(tmp_path, which=("policy", "reward_model"))
    assert set(paths) == {"policy", "reward_model"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", "reward_model"]
    with pytest.raises(ConfigError, match=r"unknown tiny model 'polcy'"):
        tiny.save_tiny_models(tmp_path, which=("polcy",))
