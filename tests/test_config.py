"""Recipes: unknown keys and wrong types fail at load time, overrides win, sections merge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from align.config import ConfigError, from_dict, load_config, parse_overrides, to_dict


@dataclass
class Inner:
    lr: float = 1e-3
    steps: int = 10


@dataclass
class Outer:
    name: str = "x"
    loss: Literal["qrpo", "dpo"] = "qrpo"
    beta: float = 5.0
    clamp: float | None = None
    tags: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    flag: bool = False


def test_parse_overrides_nests_dotted_keys_and_parses_yaml_scalars():
    assert parse_overrides(["a=1", "b.c=x", "d=true", "e=[1, 2]", "f=5e-7"]) == {
        "a": 1, "b": {"c": "x"}, "d": True, "e": [1, 2], "f": "5e-7"
    }


def test_override_wins_over_recipe_and_yaml_exponent_strings_become_floats(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("beta: 1.0\ninner:\n  lr: 5e-7\n  steps: 3\n")
    config = load_config(Outer, recipe, ["beta=2", "inner.steps=4", "tags=[a, b]"])
    assert config.beta == 2.0 and isinstance(config.beta, float)
    assert config.inner == Inner(lr=5e-7, steps=4)
    assert config.tags == ["a", "b"]


def test_unknown_key_names_the_key_suggests_and_lists_allowed():
    with pytest.raises(ConfigError) as info:
        from_dict(Outer, {"betta": 1})
    message = str(info.value)
    assert "'betta'" in message and "Did you mean 'beta'" in message and "clamp" in message


def test_unknown_nested_key_names_its_path():
    with pytest.raises(ConfigError, match=r"inner\.'stepz'|'stepz'"):
        from_dict(Outer, {"inner": {"stepz": 1}})


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"beta": "five"}, "beta: expected a number"),
        ({"loss": "ppo"}, "not one of ['qrpo', 'dpo']"),
        ({"flag": "yes please"}, "flag: expected true/false"),
        ({"inner": {"steps": 1.5}}, "inner.steps: expected an integer"),
        ({"tags": "a"}, "tags: expected a list"),
    ],
)
def test_wrong_types_are_named(data, fragment):
    with pytest.raises(ConfigError) as info:
        from_dict(Outer, data)
    assert fragment in str(info.value)


def test_optional_accepts_none_and_values():
    assert from_dict(Outer, {"clamp": None}).clamp is None
    assert from_dict(Outer, {"clamp": 0.1}).clamp == 0.1


def section(cls, recipe, name, overrides=()):
    """One section of a pipeline-shaped mapping over its defaults, as align.recipe builds a step."""
    from align.config import apply_defaults, merge, parse_overrides, read_yaml

    data = read_yaml(recipe)
    values = merge(apply_defaults(cls, data.get("defaults") or {}, data[name]), parse_overrides(overrides))
    return from_dict(cls, values)


def test_pipeline_recipe_section_merges_over_defaults(tmp_path):
    recipe = tmp_path / "p.yaml"
    recipe.write_text("defaults:\n  name: shared\n  beta: 3\ntrain:\n  beta: 4\nother:\n  beta: 9\n")
    config = section(Outer, recipe, "train")
    assert (config.name, config.beta) == ("shared", 4.0)


@dataclass
class Component:
    chat_date: str | None = None
    backend: str = "vllm"


@dataclass
class Stage:
    chat_date: str | None = None
    sampler: Component = field(default_factory=lambda: Component(backend="transformers"))
    optional: Component | None = None
    items: list[Component] = field(default_factory=list)


@pytest.fixture()
def stand_ins(monkeypatch):
    """Nested sections are the project's own configs (a library's dataclass stays one key):
    let the stand-ins above count as such."""
    import typing

    import align.config

    own = align.config._nested_dataclass
    monkeypatch.setattr(align.config, "_nested_dataclass", lambda annotation: own(annotation) or next(
        (c for c in (annotation, *typing.get_args(annotation)) if c is Component), None))


def test_pipeline_defaults_reach_nested_sections_and_a_section_key_wins(tmp_path, stand_ins):
    recipe = tmp_path / "p.yaml"
    recipe.write_text("defaults: {chat_date: '2026-01-01'}\n"
                      "a: {}\n"
                      "b: {chat_date: '2020-01-01', sampler: {chat_date: '2021-01-01'}}\n"
                      "c: {sampler: {device: cpu}}\n"
                      "d: {optional: {backend: x}, items: [{backend: y}]}\n")
    a = section(Stage, recipe, "a")
    assert (a.chat_date, a.sampler.chat_date, a.sampler.backend) == ("2026-01-01", "2026-01-01", "transformers")
    assert a.optional is None  # a default creates no component that is absent by default
    b = section(Stage, recipe, "b")
    assert (b.chat_date, b.sampler.chat_date) == ("2020-01-01", "2021-01-01")  # explicit keys win at their level
    with pytest.raises(ConfigError, match="unknown key sampler.'device'"):
        section(Stage, recipe, "c")
    d = section(Stage, recipe, "d")
    assert d.optional.chat_date == "2026-01-01" and d.items[0].chat_date is None  # lists are not reached
    overridden = section(Stage, recipe, "a", ["sampler.chat_date=2019-01-01"])
    assert (overridden.chat_date, overridden.sampler.chat_date) == ("2026-01-01", "2019-01-01")


def test_apply_defaults_and_default_keys(stand_ins):
    from align.config import apply_defaults, default_keys

    assert apply_defaults(Stage, {"chat_date": "x", "other": 1}, {}) == {"chat_date": "x", "sampler": {"chat_date": "x"}}
    assert apply_defaults(Component, {}, {"backend": "y"}) == {"backend": "y"}
    assert default_keys(Stage) == {"chat_date", "sampler", "optional", "items", "backend"}


def test_pipeline_defaults_reach_the_real_stages_nested_sections(tmp_path):
    from align.drivers import load_recipe

    recipe = tmp_path / "p.yaml"
    recipe.write_text("defaults: {chat_date: '2026-01-01', dtype: float32, max_tokens: 5}\n"
                      "output_dir: runs\n"
                      "steps:\n"
                      "  evaluate: {stage: evaluate, prompts: p.jsonl, sampler: {device: cpu}}\n"
                      "  validate: {stage: judge-validate, input: g.jsonl, model: m}\n")
    read = load_recipe(recipe)
    evaluate, judge = (read.config(step) for step in read)
    assert (evaluate.sampler.chat_date, evaluate.sampler.dtype, evaluate.reward.dtype) == ("2026-01-01", "float32",
                                                                                          "float32")
    assert evaluate.sampler.backend == "transformers" and evaluate.sampler.device == "cpu"  # its own defaults kept
    assert evaluate.max_tokens == 5 and evaluate.reward.max_tokens == 5
    assert (judge.dtype, judge.generator.dtype, judge.generator.max_tokens) == ("float32", "float32", 5)
    # the pipeline: a default that only a nested section knows is used; one known nowhere is an error
    pipeline = load_recipe({"defaults": {"chat_date": "2026-01-01"}, "evaluate": {"prompts": "p.jsonl"}})
    assert pipeline.config(pipeline.steps[0]).sampler.chat_date == "2026-01-01"
    with pytest.raises(ConfigError, match=r"keys \['colour'\] are known to no step"):  # policies[] are not reached
        load_recipe({"defaults": {"colour": "x"}, "evaluate": {"prompts": "p.jsonl"}})


def test_a_renamed_key_names_the_new_one_even_where_difflib_would_not(stand_ins):
    with pytest.raises(ConfigError, match=r"Did you mean 'chat_date'\? \('date' is now 'chat_date'"):
        from_dict(Stage, {"date": "2026-01-01"})
    with pytest.raises(ConfigError, match=r"unknown key sampler.'date' for Component. Did you mean 'chat_date'"):
        from_dict(Stage, {"sampler": {"date": "2026-01-01"}})


def test_to_dict_round_trips():
    config = Outer(tags=["a"], inner=Inner(lr=0.5))
    assert from_dict(Outer, to_dict(config)) == config


@dataclass
class Dated:
    chat_date: str | None = None


def test_unquoted_yaml_dates_become_iso_strings(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("chat_date: 2025-09-01\n")
    assert load_config(Dated, recipe).chat_date == "2025-09-01"
    assert load_config(Dated, None, ["chat_date=2026-01-01"]).chat_date == "2026-01-01"


@pytest.mark.parametrize("stage", sorted(__import__("align.stage_table", fromlist=["summaries"]).summaries()))
def test_every_key_of_every_stage_has_help_text_nested_ones_too(stage):
    from align.config import field_docs
    from align.stage_table import command_module as stage_module

    rows = field_docs(stage_module(stage).Config)
    assert rows, stage
    undocumented = [key for key, _, _, doc in rows if not doc.strip()]
    assert undocumented == [], f"align {stage} --help shows these keys without text: {undocumented}"


def test_help_lists_nested_keys_under_their_parent():
    from align.config import describe
    from align.stage_table import command_module as stage_module

    sample = describe(stage_module("sample").Config)
    assert "  sampler.model (str, default '')" in sample and "  sampler.enable_prefix_caching (bool" in sample
    evaluate = describe(stage_module("evaluate").Config)
    assert "  policies[].name (str" in evaluate and "  reward.provider (" in evaluate


def test_docstring_entries_may_name_several_fields():
    from dataclasses import dataclass

    from align.config import field_docs

    @dataclass
    class Settings:
        """Example.

        a, b: shared text
            that continues.
        c / d: slash-separated.
        e (int, default 1, in (0, 2)): typed entry.
        """

        a: int = 0
        b: int = 0
        c: int = 0
        d: int = 0
        e: int = 1

    docs = {key: doc for key, _, _, doc in field_docs(Settings)}
    assert docs == {"a": "shared text that continues.", "b": "shared text that continues.",
                    "c": "slash-separated.", "d": "slash-separated.", "e": "typed entry."}
