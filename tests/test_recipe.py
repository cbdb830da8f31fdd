"""align.recipe: one reader for every recipe shape, its step graph, defaults, rounds and the login-node rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from align.config import ConfigError
from align.recipe import IDENTITY_KEYS
from align.drivers import load_recipe

REPO = Path(__file__).resolve().parents[1]


def graph(**top) -> dict:
    """A small step graph: sample -> annotate -> pairs (paths only; nothing runs)."""
    steps = {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m", "backend": "transformers"}},
        "annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
        "pairs": {"stage": "pairs", "input": "@annotate"},
    }
    return {"output_dir": "runs/g", "steps": steps, **top}


def test_a_step_graph_wires_outputs_by_name_and_writes_under_output_dir():
    recipe = load_recipe(graph())
    assert [(s.name, s.stage, s.output_dir, s.needs) for s in recipe] == [
        ("sample", "sample", "runs/g/sample", ()),
        ("annotate", "annotate", "runs/g/annotate", ("sample",)),
        ("pairs", "pairs", "runs/g/pairs", ("annotate",))]
    assert recipe.config(recipe.step("pairs")).input == "runs/g/annotate"


def test_any_number_of_steps_of_one_stage_and_a_file_inside_an_output():
    data = graph()
    del data["steps"]["pairs"]
    data["steps"]["rm"] = {"stage": "annotate", "input": "@sample", "provider": "verifiable", "where": {"x": 1}}
    data["steps"]["pairs"] = {"stage": "pairs", "input": ["@annotate", "@rm"]}
    data["steps"]["logprobs"] = {"stage": "logprobs", "input": "@pairs/pairs.jsonl", "model_name_or_path": "m"}
    recipe = load_recipe(data)
    assert recipe.step("pairs").needs == ("annotate", "rm")
    assert recipe.config(recipe.step("logprobs")).input == "runs/g/pairs/pairs.jsonl"
    assert recipe.step("logprobs").needs == ("pairs",)


@pytest.mark.parametrize(("change", "message"), [
    ({"annotate": {"stage": "annotate", "input": "@nothing", "provider": "verifiable"}}, r"@nothing names no step"),
    ({"annotate": {"stage": "annotate", "input": "@pairs", "provider": "verifiable"}},
     r"steps read each other's outputs in a cycle \(annotate reads pairs reads annotate\)"),
    ({"annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable", "output_dir": "runs/g/pairs"}},
     r"steps 'annotate' and 'pairs' both write runs/g/pairs"),
    ({"annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable",
                   "output_dir": "runs/g/sample/inner"}}, r"inside \(or around\) step 'sample'"),
    ({"annotate": {"stage": "tokenize", "input": "@sample"}}, r"steps.annotate.stage: 'tokenize' is not a stage"),
    ({"annotate": "oops"}, r"steps.annotate: expected a mapping"),
    ({"round-1": {"stage": "pairs"}}, r"is not a step name"),
])
def test_a_wrong_graph_is_refused_naming_the_step(change, message):
    data = graph()
    data["steps"].update(change)
    with pytest.raises(ConfigError, match=message):
        load_recipe(data)


@pytest.mark.parametrize("key", sorted(IDENTITY_KEYS | {"batch_size", "model_batch_size",
                                                         "per_device_train_batch_size"}))
def test_defaults_refuse_every_key_that_names_a_steps_own_work(key):
    with pytest.raises(ConfigError, match=rf"defaults: '{key}' names one step's own work"):
        load_recipe(graph(defaults={key: "x"}))


def test_an_identity_default_names_the_steps_it_would_have_reached():
    with pytest.raises(ConfigError) as info:
        load_recipe(graph(defaults={"model": "org/judge-32b"}))
    assert "would reach ['annotate', 'sample']" in str(info.value)  # the judge's model and the policy's sampler


def test_defaults_still_reach_every_nested_section():
    recipe = load_recipe(graph(defaults={"chat_date": "2026-01-01", "seed": 3}))
    sample = recipe.config(recipe.step("sample"))
    assert sample.sampler.chat_date == "2026-01-01" and sample.seed == 3
    assert recipe.config(recipe.step("pairs")).seed == 3
    with pytest.raises(ConfigError, match=r"keys \['colour'\] are known to no step"):
        load_recipe(graph(defaults={"colour": "red"}))


def test_a_step_starts_from_a_stage_file_and_overrides_by_name(tmp_path):
    (tmp_path / "pairs.yaml").write_text("seed: 7\nlow_threshold: 0.3\n")
    data = graph()
    data["steps"]["pairs"] = {"stage": "pairs", "from": "pairs.yaml", "input": "@annotate"}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = load_recipe(tmp_path / "g.yaml", ["pairs.seed=9"])
    pairs = recipe.config(recipe.step("pairs"))
    assert (pairs.seed, pairs.low_threshold) == (9, 0.3)


def test_each_step_config_is_built_once_and_only_when_asked():
    from align.recipe import config_builds

    before = len(config_builds())
    recipe = load_recipe(graph())
    assert config_builds()[before:] == []
    recipe.config(recipe.step("pairs"))
    recipe.config(recipe.step("pairs"))
    recipe.build_all()
    assert config_builds()[before:] == ["pairs", "sample", "annotate"]


def rounds_graph(reference: str = "previous") -> dict:
    trainer = {"use_cpu": True, "bf16": False, "report_to": []}
    return {
        "output_dir": "runs/r", "rounds": 3, "reference": reference, "initial_policy": "@sft",
        "steps": {
            "sft": {"stage": "sft", "model_name_or_path": "base", "input": "sft.jsonl", **trainer},
            "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
            "annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
            "pairs": {"stage": "pairs", "input": "@annotate"},
            "logprobs": {"stage": "logprobs", "input": "@pairs/pairs.jsonl", "model_name_or_path": "@reference"},
            "train": {"stage": "train", "input": "@logprobs", "model_name_or_path": "@policy",
                      "ref_model_name_or_path": "@reference", **trainer},
            "evaluate": {"stage": "evaluate", "prompts": "h.jsonl", "baseline": "sft",
                         "policies": [{"name": "sft", "model": "@initial"}, {"name": "now", "model": "@train"}]},
        }}


def test_rounds_repeat_the_steps_that_read_the_policy_each_from_the_round_before():
    recipe = load_recipe(rounds_graph())
    names = [s.name for s in recipe]
    assert names[0] == "sft" and names[1:7] == [f"round-1.{s}" for s in
                                                ("sample", "annotate", "pairs", "logprobs", "train", "evaluate")]
    assert len(names) == 1 + 3 * 6
    config = {s.name: recipe.config(s) for s in recipe}
    assert config["round-1.sample"].sampler.model == "runs/r/sft"
    assert config["round-2.sample"].sampler.model == "runs/r/round-1/train"
    assert config["round-3.train"].model_name_or_path == "runs/r/round-2/train"
    assert config["round-3.logprobs"].model_name_or_path == "runs/r/round-2/train"  # previous: π_ref = π_{k-1}
    assert config["round-3.logprobs"].input == "runs/r/round-3/pairs/pairs.jsonl"
    assert [p.model for p in config["round-2.evaluate"].policies] == ["runs/r/sft", "runs/r/round-2/train"]
    assert recipe.step("round-2.sample").needs == ("round-1.train",)


def test_with_the_initial_reference_a_step_of_the_reference_alone_runs_once():
    data = rounds_graph("initial")
    data["steps"]["references"] = {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@reference"}}
    recipe = load_recipe(data)
    assert "references" in [s.name for s in recipe] and "round-2.references" not in [s.name for s in recipe]
    config = {s.name: recipe.config(s) for s in recipe}
    assert config["round-3.logprobs"].model_name_or_path == "runs/r/sft"
    assert config["round-3.train"].ref_model_name_or_path == "runs/r/sft"


@pytest.mark.parametrize(("change", "message"), [
    ({"rounds": 0}, r"rounds=0: must be at least 1"),
    ({"reference": "latest"}, r"reference: 'latest'"),
    ({"initial_policy": None}, r"initial_policy: set π₀"),
    ({"round_prompts": "split"}, r"round_prompts: a setting of a recipe of sections"),
    ({"policy_step": "sample"}, r"policy_step: 'sample' is a sample step; the next round's policy is the model a "
                                r"train or sft step makes"),
])
def test_rounds_settings_are_checked(change, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe({**rounds_graph(), **change})


def test_a_step_that_runs_once_cannot_read_one_that_runs_every_round():
    data = rounds_graph()
    data["steps"]["report"] = {"stage": "pairs", "input": "@annotate"}
    data["steps"]["sft"]["input"] = "@annotate"
    with pytest.raises(ConfigError, match=r"initial_policy: @sft would run every round|runs once but reads"):
        load_recipe(data)


def test_an_evaluation_with_partitioned_kl_is_three_jobs():
    data = graph()
    data["steps"]["evaluate"] = {"stage": "evaluate", "prompts": "h.jsonl", "baseline": "a", "kl": True,
                                 "kl_sharding": "zero3", "policies": [{"name": "a", "model": "m"}]}
    recipe = load_recipe(data)
    phases = [(s.name, s.phase, s.job_kind(), s.output_dir) for s in recipe if s.base == "evaluate"]
    assert phases == [("evaluate", None, "array", "runs/g/evaluate"), ("evaluate.kl", "kl", "launch", "runs/g/evaluate"),
                      ("evaluate.report", "report", "single", "runs/g/evaluate")]
    assert recipe.config(recipe.step("evaluate.kl")).kl_only and not recipe.config(recipe.step("evaluate")).kl_only


def test_stop_after_names_a_step_a_stage_or_a_round():
    assert [s.name for s in load_recipe(graph(stop_after="annotate"))][-1] == "annotate"
    assert [s.name for s in load_recipe({**rounds_graph(), "stop_after": "round-2"})][-1] == "round-2.evaluate"
    with pytest.raises(ConfigError, match="stop_after: 'nowhere' is not one of"):
        load_recipe(graph(stop_after="nowhere"))


def test_slurm_stages_name_a_step_or_a_stage():
    load_recipe(graph(slurm={"stages": {"pairs": {"array": 2}, "annotate": {"gpus_per_task": 0}}}))
    with pytest.raises(ConfigError, match=r"slurm.stages: \['tokenize'\] name no step or stage"):
        load_recipe(graph(slurm={"stages": {"tokenize": {"array": 2}}}))


def test_a_login_node_reads_a_bf16_recipe_and_its_job_checks_the_device():
    """Reading a GPU recipe where no GPU is (status, plan, submit) checks no device; the job that runs
    the step builds it where it runs, and checks there."""
    import torch

    path = REPO / "recipes" / "apertus-8b" / "qrpo.yaml"
    login = load_recipe(path, stage="train", devices="defer")
    config = login.config(login.steps[0])
    assert config.bf16 is True  # what the recipe says, for the job's node
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: bf16 is supported here, nothing to refuse")
    job = load_recipe(path, stage="train")
    with pytest.raises(ConfigError, match="bf16"):
        job.config(job.steps[0])


def test_a_stage_command_on_a_pipeline_runs_its_one_step_of_that_stage():
    from align.drivers.args import stage_config

    config = stage_config("pairs", [str(REPO / "recipes" / "tiny" / "pipeline.yaml"), "seed=5"])
    assert (config.input, config.seed) == ("runs/tiny/annotate", 5)
    with pytest.raises(ConfigError, match=r"has 2 steps of stage train \(\['qrpo', 'dpo'\]\): run one with "
                                          r"`align step"):
        stage_config("train", [str(REPO / "recipes" / "apertus-8b" / "pipeline.yaml")])
