"""Recipes: a key given twice in one YAML mapping is an error naming it and both lines.

Plain YAML keeps the last value, so a second `train:` section in a pipeline recipe, or
a `beta:` repeated further down, would silently replace the first.
"""

from __future__ import annotations

import pytest

from align.config import ConfigError, read_yaml


def _recipe(tmp_path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,key,lines", [
    ("seed: 1\ninput: x.jsonl\nseed: 2\n", "seed", (1, 3)),
    ("pairs:\n  input: a\ntrain:\n  beta: 1\ntrain:\n  beta: 2\n", "train", (3, 5)),
    ("train:\n  beta: 1\n  lr: 0.1\n  beta: 2\n", "beta", (2, 4)),
    ("policies:\n  - {name: a, model: m, name: b}\n", "name", (2, 2)),
    ("1: a\n'1': b\n1: c\n", 1, (1, 3)),
])
def test_a_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path, text, key, lines):
    with pytest.raises(ConfigError) as error:
        read_yaml(_recipe(tmp_path, text))
    message = str(error.value)
    assert f"key {key!r} is given twice (lines {lines[0]} and {lines[1]})" in message, message
    assert "recipe.yaml" in message


def test_keys_merged_in_may_be_overridden(tmp_path):
    text = "base: &b {seed: 1, input: a}\npairs:\n  <<: *b\n  seed: 3\n"
    assert read_yaml(_recipe(tmp_path, text))["pairs"] == {"seed": 3, "input": "a"}


def test_the_same_key_in_different_mappings_is_fine(tmp_path):
    text = "sample:\n  seed: 1\npairs:\n  seed: 2\n"
    assert read_yaml(_recipe(tmp_path, text)) == {"sample": {"seed": 1}, "pairs": {"seed": 2}}


def test_pipeline_recipe_with_two_train_sections_is_refused_by_the_cli(tmp_path, capsys):
    from align.cli import main

    path = _recipe(tmp_path, "train:\n  beta: 1\npairs:\n  seed: 1\ntrain:\n  beta: 5\n")
    assert main(["pipeline", str(path)]) == 2
    assert "ConfigError" in capsys.readouterr().err


def test_every_shipped_recipe_still_loads():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "recipes"
    recipes = sorted(root.rglob("*.yaml"))
    assert recipes
    for path in recipes:
        read_yaml(path)
