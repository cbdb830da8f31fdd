"""`align plan`: memory per GPU of each stage of a recipe, checked against what can be measured here.

References: the tiny model's own tensors and the optimizers' own state after a real step
(weights and optimizer states, byte for byte), transformers building the model on the meta
device (parameter counts of the shipped model configs), DeepSpeed's own estimators (model
states under ZeRO-2/3), and the shipped recipes' stated hardware.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from align.errors import ConfigError
from align.plan.configs import KNOWN_CONFIGS, load_model_config
from align.plan.memory import GIB, Launch, TrainingJob, model_states, training_memory
from align.plan.optimizer_states import optimizer_layout
from align.plan.recipe_header import header_lines, launch_from_header
from align.plan.shapes import build_on_meta, count_on_meta, count_params, model_shape
from align.drivers.plan import Config, plan_recipe

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "recipes" / "apertus-8b").glob("*.yaml")) + sorted((ROOT / "recipes" / "apertus-70b").glob("*.yaml"))


def _plan(recipe: Path | str, **keys):
    return plan_recipe(Config(recipe=str(recipe), **keys))


# --------------------------------------------------------------------------- the shipped recipes


@pytest.mark.slow  # a whole recipe read and planned per case: outside the mutation check's fast selection
@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_recipe_fits_the_hardware_its_comments_state(recipe):
    plans, info = _plan(recipe)
    if recipe.name == "pairs.yaml":
        assert [p.verdict.reason for p in plans] == ["uses no GPU"]
        return
    assert info["hardware_source"] == "the recipe's hardware line", "the recipe's header states no hardware"
    sharding = yaml.safe_load(recipe.read_text()).get("sharding")
    launched = launch_from_header(header_lines(recipe)).get("accelerate_config", "").endswith("zero3.yaml")
    sharded = sharding == "zero3" or (sharding is None and launched)
    if recipe.parent.name == "apertus-70b" and recipe.name == "logprobs.yaml" and not sharded:
        # a 70B model in bf16 (141 GB) does not fit one 80 GB GPU: the pass must be ZeRO-3-sharded
        (plan,) = plans
        assert not plan.verdict.fits and plan.estimate.part("weights") > 130 * GIB
        (name, _estimate, verdict), = plan.alternatives
        assert "ZeRO-3" in name and verdict.fits
        assert plan.change is not None and plan.change.settings in ({"zero_stage": 3}, {"sharding": "zero3"})
        return
    assert all(p.verdict.fits for p in plans), [(p.job, p.verdict.reason) for p in plans]


def test_the_shipped_model_configs_count_like_transformers_and_the_report():
    counts = {}
    for name in KNOWN_CONFIGS:
        config, _ = load_model_config(name)
        meta = count_on_meta(build_on_meta(config))
        formula = count_params(config)
        assert {k: formula[k] for k in meta} == meta, name
        counts[name] = meta["num_params"]
    # Apertus report §3.1 / Table 1: 8B and 70B dense models, untied embeddings
    assert 8.0e9 < counts["swiss-ai/Apertus-8B-2509"] < 8.1e9
    assert 70.5e9 < counts["swiss-ai/Apertus-70B-2509"] < 70.7e9
    assert 32.7e9 < counts["Qwen/Qwen3-32B"] < 32.8e9


def test_a_model_is_traced_through_the_recipes_that_made_it():
    (plan,) = _plan(ROOT / "recipes/apertus-8b/qrpo.yaml")[0]
    assert plan.model == "runs/apertus-8b/sft" and "swiss-ai/Apertus-8B-2509" in plan.model_source


def test_a_model_the_plan_cannot_find_is_an_error_naming_model_config(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# align train r.yaml\nmodel_name_or_path: nowhere/unknown-model\ninput: x\noutput_dir: y\n")
    with pytest.raises(ConfigError, match="model_config=PATH"):
        _plan(recipe)


# --------------------------------------------------------------------------- measured on the tiny model


def _tiny(**overrides):
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tokenizer = build_tokenizer()
    return tokenizer, build_causal_lm(tokenizer, **overrides)


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v))


@pytest.mark.parametrize("optimizer", ["ademamix", "adamw"])
@pytest.mark.parametrize("dtype,tied", [(torch.float32, True), (torch.float32, False), (torch.bfloat16, True)])
def test_weights_and_optimizer_states_equal_the_tiny_models(optimizer, dtype, tied):
    from align.optim import build_optimizer

    tokenizer, model = _tiny(tie_word_embeddings=tied)
    model = model.to(dtype).train()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = build_optimizer(optimizer, model.parameters(), lr=1e-3, total_steps=10)
    ids = torch.tensor([tokenizer("the quick brown fox", add_special_tokens=True)["input_ids"]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    measured_states = _state_bytes(opt)

    shape = model_shape(model.config)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    assert shape.num_tensors == len(list(model.parameters()))
    bytes_per = 4 if dtype == torch.float32 else 2
    job = TrainingJob(shape, 1, ids.shape[1], False, bytes_per, optimizer_layout(optimizer), "tiled")
    estimate = training_memory(job, Launch(1, 0))
    assert estimate.part("weights") == weights
    assert estimate.part("gradients") == sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    assert estimate.part("optimizer_states") == measured_states


def test_ademamix_keeps_three_states_and_adamw_two():
    assert optimizer_layout("ademamix").per_element == 3
    assert optimizer_layout("adamw").per_element == 2
    assert optimizer_layout("adamw_torch_fused").per_element == 2
    with pytest.raises(ConfigError, match="optimizer"):
        optimizer_layout("adafactor")


@pytest.mark.parametrize("model_type,extra", [
    ("apertus", {"hidden_act": "xielu"}), ("qwen3", {"head_dim": 16}), ("llama", {"num_key_value_heads": 1}),
])
def test_the_formula_counts_other_architectures_like_transformers(model_type, extra):
    from transformers import AutoConfig

    keys = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 300, "tie_word_embeddings": False, **extra}
    config = AutoConfig.for_model(model_type, **keys)
    meta = count_on_meta(build_on_meta(config))
    assert {k: count_params(config)[k] for k in meta} == meta


def test_the_head_tile_is_align_scorings():
    from align.plan import memory
    from align.scoring import logps

    assert memory.HEAD_TILE_BYTES == logps.HEAD_TILE_BYTES


# --------------------------------------------------------------------------- DeepSpeed's estimators


def test_model_states_agree_with_deepspeeds_estimators_where_the_assumptions_agree():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    config, _ = load_model_config("swiss-ai/Apertus-8B-2509")
    shape = model_shape(config)
    psi, adamw, ademamix = shape.num_params, optimizer_layout("adamw"), optimizer_layout("ademamix")
    n = 64

    def states(layout, stage):
        estimate = training_memory(TrainingJob(shape, 1, 4096, True, 2, layout, "tiled"), Launch(n, stage))
        return model_states(estimate) - layout.scalar_bytes * 2  # DeepSpeed counts no step counters

    _, zero2 = estimate_zero2_model_states_mem_needs(psi, 8, n // 8, cpu_offload=False)
    assert abs(states(adamw, 2) - zero2) <= 8  # 2Ψ + 18Ψ/N: the same bytes, rounded per part
    _, zero3, _ = estimate_zero3_model_states_mem_needs(psi, shape.largest_layer_params, 8, n // 8,
                                                        cpu_offload=False, cpu_offload_params=False)
    assert abs(states(adamw, 3) - zero3 - 2 * psi / n) <= 8  # plus the 16-bit weights' own shard
    assert abs(states(ademamix, 2) - states(adamw, 2) - 4 * psi / n) <= 8  # the third moment


# --------------------------------------------------------------------------- what does not fit


def test_the_70b_qrpo_on_one_node_is_flagged_with_more_nodes():
    (plan,), _ = _plan(ROOT / "recipes/apertus-70b/qrpo.yaml", nodes=1)
    assert not plan.verdict.fits
    assert plan.change.settings == {"nodes": 4}
    assert plan.change.estimate.total + 5 * GIB <= 80 * GIB
    assert "refuses" in plan.change_note and "AdEMAMix" in plan.change_note


def test_the_70b_qrpo_under_zero2_is_flagged_with_zero3():
    (plan,), info = _plan(ROOT / "recipes/apertus-70b/qrpo.yaml", zero_stage=2)
    assert info["launch"]["zero_stage"] == 2 and not plan.verdict.fits
    assert plan.change.settings == {"zero_stage": 3} and "zero3.yaml" in plan.change_note


def test_a_smaller_micro_batch_or_checkpointing_is_preferred_to_more_hardware():
    recipe = ROOT / "recipes/apertus-8b/qrpo.yaml"
    (plan,), _ = _plan(recipe, set={"activation_checkpointing": False})
    assert not plan.verdict.fits and plan.change.settings == {"activation_checkpointing": True}
    (plan,), _ = _plan(recipe, gpu_memory_gib=55)
    assert not plan.verdict.fits and plan.change.settings == {"per_device_train_batch_size": 2}
    assert plan.change.recipe_keys == ("per_device_train_batch_size",)


def test_adamw_may_offload_ademamix_may_not():
    recipe = ROOT / "recipes/apertus-70b/qrpo.yaml"
    (plan,), _ = _plan(recipe, offload_optimizer=True)
    assert not plan.verdict.fits and "refuses" in plan.verdict.reason
    (plan,), _ = _plan(recipe, nodes=2, set={"optimizer": "adamw"})
    assert plan.change is not None and "offload_optimizer" in plan.change.settings


# --------------------------------------------------------------------------- the CLI


def test_the_cli_plans_and_writes_json(tmp_path, capsys):
    from align.cli import main

    recipe = "recipes/apertus-70b/qrpo.yaml"
    assert main(["plan", str(ROOT / recipe), "gpus_per_node=8", "nodes=8", "gpu_memory_gib=80",
                 f"output={tmp_path / 'plan.json'}"]) == 0
    out = capsys.readouterr().out
    assert "[train] training step: fits" in out and "optimizer_states" in out and "DeepSpeed's estimator" in out
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["fits"] and written["hardware"] == {"nodes": 8, "gpus_per_node": 8, "gpu_memory_gib": 80.0}
    assert main(["plan", str(ROOT / recipe), "nodes=1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert not printed["fits"] and printed["jobs"][0]["smallest_change"]["settings"] == {"nodes": 4}
    assert main(["plan", str(ROOT / recipe), "nodez=1"]) == 2
    assert "unknown key 'nodez'" in capsys.readouterr().err


def test_help_lists_every_key(capsys):
    import dataclasses

    from align.cli import main

    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(Config):
        assert f"  {f.name} (" in out, f.name
    assert "align plan recipes/apertus-70b/qrpo.yaml" in out


def test_a_pipeline_recipe_is_planned_section_by_section(tmp_path):
    from align.testing.tiny import save_tiny_models

    models = save_tiny_models(tmp_path / "models")
    recipe = (ROOT / "recipes/tiny/pipeline.yaml").read_text().replace(
        "runs/tiny_models/policy", str(models["policy"]))
    path = tmp_path / "pipeline.yaml"
    path.write_text(recipe)
    plans, _ = _plan(path)
    stages = [p.stage for p in plans]
    assert {"sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate"} <= set(stages)
    train = next(p for p in plans if p.stage == "train")
    assert train.model.endswith("runs/tiny/sft") and str(models["policy"]) in train.model_source
    assert all(p.verdict.fits for p in plans)
