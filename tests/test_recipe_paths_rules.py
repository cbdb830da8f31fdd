"""Rules of reading a recipe that the other recipe tests leave open: ``$VAR`` in path values, what a
stage file becomes, and the recipe ``align submit`` writes for the jobs.

A mutation check on align/recipe/read.py showed no fast test held them: which values take the
environment (keys named as paths, at any depth, in lists), what an unset variable's error names,
a stage file's one step as the submitted recipe holds it, a step's ``from:`` file merged into that
recipe, and a misspelt top-level key of a step graph. Each test reads a recipe; nothing runs.
"""

from __future__ import annotations

import pytest
import yaml

from align.config import ConfigError
from align.drivers import load_recipe
from align.drivers.submit import write_recipe
from align.recipe.read import expand_paths

TRAINER = {"use_cpu": True, "bf16": False, "report_to": []}


@pytest.fixture
def runs(monkeypatch) -> str:
    """``$RUNS`` set to a scratch directory, ``$NOPE`` unset."""
    monkeypatch.setenv("RUNS", "/scratch/me")
    monkeypatch.delenv("NOPE", raising=False)
    return "/scratch/me"


def test_path_keys_take_the_environment_at_any_depth(runs):
    value = {"output_dir": "$RUNS/flow",
             "sampler": {"model": "${RUNS}/m", "stop": "$RUNS", "extra": {"cache_dir": "$RUNS/c"}},
             "note": "$RUNS/x", "temperature": "$RUNS"}
    assert expand_paths(value) == {"output_dir": f"{runs}/flow",
                                   "sampler": {"model": f"{runs}/m", "stop": "$RUNS",
                                               "extra": {"cache_dir": f"{runs}/c"}},
                                   "note": "$RUNS/x", "temperature": "$RUNS"}


def test_keys_named_as_paths_by_their_ending_take_the_environment(runs):
    value = {"reward_path": "$RUNS/a", "shard_dir": "$RUNS/b", "list_file": "$RUNS/c", "pathology": "$RUNS/d",
             "dirty": "$RUNS/e"}
    assert expand_paths(value) == {"reward_path": f"{runs}/a", "shard_dir": f"{runs}/b", "list_file": f"{runs}/c",
                                   "pathology": "$RUNS/d", "dirty": "$RUNS/e"}


def test_a_list_of_paths_takes_the_environment_item_by_item(runs):
    value = {"prompts": ["$RUNS/a.jsonl", "${RUNS}/b.jsonl", "plain.jsonl"], "stop": ["$RUNS", "x"]}
    assert expand_paths(value) == {"prompts": [f"{runs}/a.jsonl", f"{runs}/b.jsonl", "plain.jsonl"],
                                   "stop": ["$RUNS", "x"]}


def test_a_dotted_key_is_a_path_by_its_last_part(runs):
    value = {"steps.sample.model": "$RUNS/m", "steps.sample.stop": "$RUNS"}
    assert expand_paths(value) == {"steps.sample.model": f"{runs}/m", "steps.sample.stop": "$RUNS"}


def test_a_value_with_no_variable_is_left_as_written(runs):
    value = {"model": "/models/base", "output_dir": "runs/x", "n": 4, "input": None}
    assert expand_paths(value) == value


@pytest.mark.parametrize("value, named", [
    ({"output_dir": "$NOPE/x"}, "output_dir='$NOPE/x'"),
    ({"steps": {"sft": {"output_dir": "${NOPE}/x"}}}, "steps.sft.output_dir='${NOPE}/x'"),
    ({"sample": {"prompts": ["ok.jsonl", "$NOPE/p.jsonl"]}}, "sample.prompts='$NOPE/p.jsonl'"),
])
def test_an_unset_variable_is_an_error_naming_the_key_and_the_value(runs, value, named):
    with pytest.raises(ConfigError) as info:
        expand_paths(value)
    assert str(info.value) == (f"{named}: $NOPE is not set in this environment (a path with $VAR takes the "
                               "variable's value; set it, or write the path out)")


def test_a_recipe_and_its_overrides_read_with_the_environment(runs):
    data = {"output_dir": "$RUNS/flow",
            "steps": {"sft": {"stage": "sft", "model_name_or_path": "$RUNS/base", "input": "sft.jsonl", **TRAINER}}}
    recipe = load_recipe(data, ["sft.input=$RUNS/data/sft.jsonl"], devices="defer")
    (step,) = recipe.steps
    assert step.keys["output_dir"] == f"{runs}/flow/sft"
    assert step.keys["model_name_or_path"] == f"{runs}/base"
    assert step.keys["input"] == f"{runs}/data/sft.jsonl"


# --------------------------------------------------------------------------- a stage file


def stage_file(tmp_path, **keys):
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "base", "input": "sft.jsonl", **TRAINER, **keys}))
    return path


def test_a_stage_file_is_one_step_named_for_its_stage(tmp_path):
    path = stage_file(tmp_path, output_dir=str(tmp_path / "out"))
    recipe = load_recipe(path, ["learning_rate=0.001"], stage="sft", devices="defer")
    assert recipe.kind == "stage" and recipe.source == str(path)
    assert [(s.name, s.stage) for s in recipe.steps] == [("sft", "sft")]
    assert recipe.raw == {"steps": {"sft": {"stage": "sft", "model_name_or_path": "base", "input": "sft.jsonl",
                                            **TRAINER, "output_dir": str(tmp_path / "out"),
                                            "learning_rate": 0.001}}}
    with pytest.raises(ConfigError, match=f"no step 'train' in {path}"):
        recipe.step("train")


def test_the_submitted_recipe_of_a_stage_file_is_its_one_step_with_its_output(tmp_path):
    path = stage_file(tmp_path)  # no output_dir: the stage's default is written out
    recipe = load_recipe(path, stage="sft", devices="defer")
    written = yaml.safe_load(write_recipe(recipe, tmp_path).read_text())
    default = recipe.config(recipe.steps[0]).output_dir
    assert written == {"steps": {"sft": {"stage": "sft", "model_name_or_path": "base", "input": "sft.jsonl",
                                         **TRAINER, "output_dir": default}}}
    again = load_recipe(written, devices="defer")  # what every job reads: the same step, now as a graph
    assert again.kind == "pipeline"
    assert [(s.name, s.stage, s.output_dir) for s in again.steps] == [("sft", "sft", default)]


# --------------------------------------------------------------------------- a step graph


def test_the_submitted_recipe_holds_each_steps_from_file_merged_in(tmp_path, runs):
    (tmp_path / "base-sft.yaml").write_text(yaml.safe_dump({"model_name_or_path": "$RUNS/base",
                                                            "learning_rate": 0.01, **TRAINER}))
    path = tmp_path / "flow.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "runs"), "steps": {
        "sft": {"stage": "sft", "from": "base-sft.yaml", "input": "sft.jsonl", "learning_rate": 0.02}}}))
    recipe = load_recipe(path, devices="defer")
    assert recipe.kind == "pipeline" and recipe.source == str(path)
    keys = {"model_name_or_path": f"{runs}/base", "learning_rate": 0.02, **TRAINER, "stage": "sft",
            "input": "sft.jsonl"}
    assert recipe.raw["steps"] == {"sft": keys}
    written = yaml.safe_load(write_recipe(recipe, tmp_path).read_text())
    assert written == {"output_dir": str(tmp_path / "runs"), "steps": {"sft": keys}}


def test_a_misspelt_top_level_key_of_a_step_graph_is_refused():
    data = {"output_dri": "runs/x",
            "steps": {"sft": {"stage": "sft", "model_name_or_path": "base", "input": "sft.jsonl",
                              "output_dir": "runs/sft", **TRAINER}}}
    with pytest.raises(ConfigError, match="output_dri"):
        load_recipe(data, devices="defer")
