"""Every shipped recipe loads with its stage's Config (strict keys, checked types).

All YAML under recipes/ is found by globbing (accelerate/ holds accelerate configs, not
align recipes), so a new recipe cannot escape the check. The stage comes from the file
name; a recipe whose name maps to no stage fails here instead of being skipped.
"""

from __future__ import annotations

import re

import pytest
from stage_helpers import RECIPES, TINY_RECIPE

from align.drivers import load_recipe as read_recipe
from align.stage_table import command_module as stage_module
from align.drivers.args import recipe_from_args, stage_config

RECIPE_FILES = sorted(p for p in RECIPES.rglob("*.yaml") if "accelerate" not in p.relative_to(RECIPES).parts)
TINY_STAGES = ("sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")


def stage_of(name: str) -> str:
    """The stage a recipe file is for, from its name."""
    stem = name.removesuffix(".yaml")
    fixed = {"sft": "sft", "qrpo": "train", "dpo": "train", "logprobs": "logprobs", "pairs": "pairs",
             "pipeline": "pipeline", "rounds": "pipeline", "decontaminate": "decontaminate", "judge_validate": "judge-validate",
             "evaluate": "evaluate", "sweep": "sweep"}
    if stem in fixed:
        return fixed[stem]
    for prefix in ("sample", "annotate"):
        if stem.startswith(prefix):
            return prefix
    raise AssertionError(f"recipes/{name}: no stage for this file name; name it after its stage")


def as_read_on_a_login_node(path):
    """A shipped recipe as `align status` / `align submit` read it: every step's config built, with no device
    check (the GPU recipes ask for bf16, which a CPU-only machine cannot set up: their jobs check it)."""
    recipe = recipe_from_args("status", [str(path)])
    recipe.build_all()
    return recipe


def test_the_glob_finds_the_recipes():
    names = {str(p.relative_to(RECIPES)) for p in RECIPE_FILES}
    expected = {"tiny/pipeline.yaml", "decontaminate.yaml"}
    for size in ("apertus-8b", "apertus-70b"):
        expected |= {f"{size}/{n}.yaml" for n in ("sft", "sample", "sample_offline", "annotate_rm", "annotate_judge",
                                                   "annotate_classifier", "pairs", "logprobs", "qrpo", "dpo")}
    assert expected <= names


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_loads_with_its_stage_config(path):
    stage = stage_of(path.name)
    recipe = as_read_on_a_login_node(path)
    for step in recipe:
        assert isinstance(recipe.config(step), stage_module(step.stage).Config)
    if stage != "pipeline":
        assert [s.stage for s in recipe] == [stage]  # the header's command names the stage the file is named for


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_starts_with_its_launch_command(path):
    """A comment among the first lines runs this very file: `align ...`, `accelerate launch ...`, `sbatch ...`."""
    rel = f"recipes/{path.relative_to(RECIPES)}"
    head = path.read_text().splitlines()[:6]
    command = re.compile(r"^#\s+(?:[A-Z_]+=\S+\s+)*(?:align|accelerate launch|sbatch)\s")
    assert any(command.match(line) and rel in line for line in head), f"{rel}: no launch command in\n" + "\n".join(head)


@pytest.mark.parametrize("stage", TINY_STAGES)
def test_each_stage_runs_alone_from_the_tiny_pipeline_recipe(stage):
    """`align STAGE recipes/tiny/pipeline.yaml`: the stage's section over the defaults it knows."""
    config = stage_config(stage, [str(TINY_RECIPE)])
    if stage in ("sft", "logprobs", "train"):
        assert config.chat_date == "2026-01-01" and config.chat_format == "apertus"
    if stage == "sample":
        assert config.sampler.chat_date == "2026-01-01" and config.sampler.backend == "transformers"


def tiny_configs() -> dict:
    recipe = read_recipe(TINY_RECIPE)
    return {step.name: recipe.config(step) for step in recipe}


def test_tiny_pipeline_pins_one_date_everywhere():
    configs = tiny_configs()
    assert list(configs) == list(TINY_STAGES)
    dates = {configs[s].chat_date for s in ("sft", "logprobs", "train")} | {configs["sample"].sampler.chat_date,
                                                                          configs["evaluate"].sampler.chat_date}
    assert dates == {"2026-01-01"}
    assert configs["logprobs"].max_length == configs["train"].max_length
    assert configs["logprobs"].over_max_length == configs["train"].over_max_length
    assert configs["pairs"].num_ref_rewards == configs["train"].num_ref_rewards == configs["sample"].n
    assert configs["sft"].use_cpu and configs["train"].use_cpu and not configs["train"].bf16


def load_recipe(size: str, name: str):
    """recipes/SIZE/NAME.yaml loaded with its stage's Config (the defaults it leaves unset included)."""
    recipe = as_read_on_a_login_node(RECIPES / size / f"{name}.yaml")
    return recipe.config(recipe.steps[0])


def longest_sampled_sequence(sample_config) -> int | None:
    """The most prompt + completion tokens the sample stage can write: the sampler's
    context length (a prompt that fills it is skipped; a long prompt's budget is cut to what
    is left). None when the recipe leaves it to the model (unbounded here)."""
    return sample_config.sampler.max_model_len


@pytest.mark.parametrize("size", ["apertus-8b", "apertus-70b"])
def test_apertus_stage_recipes_agree_with_each_other(size):
    """The separate stage files of one model size: what the log-prob pass, the trainers, the
    samplers and the evaluation must share is the same in every file, and each stage reads
    what the one before it writes."""
    r = {name: load_recipe(size, name) for name in ("sft", "sample", "sample_offline", "annotate_rm", "annotate_judge",
                                                    "pairs", "logprobs", "qrpo", "dpo", "evaluate")}
    tokenized = {"sft": r["sft"], "logprobs": r["logprobs"], "qrpo": r["qrpo"], "dpo": r["dpo"]}
    samplers = {"sample": r["sample"].sampler, "evaluate": r["evaluate"].sampler}

    # one chat date and one chat format for every prompt the policy is trained or sampled on
    dates = {**{k: c.chat_date for k, c in tokenized.items()}, **{k: s.chat_date for k, s in samplers.items()}}
    assert len(set(dates.values())) == 1 and None not in dates.values(), dates
    formats = {**{k: c.chat_format for k, c in tokenized.items()}, **{k: s.chat_format for k, s in samplers.items()}}
    assert set(formats.values()) == {"apertus"}, formats
    thinking = {"logprobs": r["logprobs"].enable_thinking, "qrpo": r["qrpo"].enable_thinking,
                "dpo": r["dpo"].enable_thinking, **{k: s.enable_thinking for k, s in samplers.items()}}
    assert len(set(thinking.values())) == 1, thinking

    # the pass scores exactly the token ids the trainers train on
    lengths = {k: tokenized[k].max_length for k in ("logprobs", "qrpo", "dpo")}
    assert len(set(lengths.values())) == 1 and None not in lengths.values(), lengths
    truncated = {k: r[k].truncated for k in ("pairs", "logprobs", "qrpo", "dpo")}
    assert len(set(truncated.values())) == 1, truncated
    over = {k: r[k].over_max_length for k in ("logprobs", "qrpo", "dpo")}
    assert len(set(over.values())) == 1, over

    # no completion a sampler writes is over max_length (it would be left out of training, or cut):
    # the longest prompt + completion a sampler allows is its max_model_len (the budget of a long
    # prompt is cut to what fits), which must be set and within max_length
    for name in ("sample", "sample_offline"):
        longest = longest_sampled_sequence(r[name])
        assert longest is not None and longest <= lengths["logprobs"], (size, name, longest, lengths)

    # quantile rewards: as many references as were sampled per prompt
    assert r["pairs"].num_ref_rewards == r["qrpo"].num_ref_rewards == r["sample"].n, \
        (r["pairs"].num_ref_rewards, r["qrpo"].num_ref_rewards, r["sample"].n)
    assert r["sample"].mode == "reference" and r["sample_offline"].mode == "offline"

    # each stage reads what the one before it writes
    sft_out = r["sft"].output_dir
    assert r["sample"].sampler.model == r["logprobs"].model_name_or_path == sft_out
    assert r["qrpo"].model_name_or_path == r["dpo"].model_name_or_path == sft_out
    assert r["sample_offline"].prompts == r["sample"].output_dir
    assert r["annotate_rm"].input == r["annotate_judge"].input == r["sample_offline"].output_dir
    assert r["pairs"].input == [r["annotate_rm"].output_dir, r["annotate_judge"].output_dir]
    # every prompt is scored by one of the two: the reward model where the classifier said "not
    # controversial", the judge where it said controversial or could not say (null)
    assert r["annotate_rm"].where == {"controversial": False}
    assert r["annotate_judge"].where == {"controversial": [True, None]}
    assert r["sample_offline"].on_unclassified == "persona"  # null counts as controversial there too
    assert r["logprobs"].input == f"{r['pairs'].output_dir}/pairs.jsonl"
    assert r["qrpo"].input == r["dpo"].input == r["logprobs"].output_dir
    models = {p.name: p.model for p in r["evaluate"].policies}
    assert models == {"sft": sft_out, "qrpo": r["qrpo"].output_dir, "dpo": r["dpo"].output_dir}
    assert r["evaluate"].baseline == "sft"


def test_the_one_chat_date_of_the_tiny_pipeline_gives_one_prompt_in_every_stage(tiny_dirs, tmp_path):
    """`chat_date` is set once, in the recipe's `defaults`. Each stage encodes the same prompt
    through its own path, from its own loaded config: the sample and evaluate stages' samplers
    (`build_sampler` on their `sampler` sections), the log-prob pass (`run_pass` on its
    section), the preference trainer's data path over the pass's rows (which also checks the
    pass's token hash) and the SFT trainer's. All give the same token ids, whose system text
    carries the recipe's date."""
    import json
    from dataclasses import replace

    from datasets import Dataset
    from transformers import AutoTokenizer

    from align.logprobs import load_ref_logprobs
    from align.sampling.config import build_sampler
    from align.stages.logprobs import run_pass
    from align.trainers.preference_data import prepare_row
    from align.trainers.sft_trainer import SFTTrainer

    configs = tiny_configs()
    policy = str(tiny_dirs["policy"])
    tokenizer = AutoTokenizer.from_pretrained(policy)
    messages = [{"role": "user", "content": "Is 14 even? Answer yes or no."}]

    sampled = {stage: build_sampler(replace(configs[stage].sampler, model=policy)).encoder.prompt_ids(messages)
               for stage in ("sample", "evaluate")}

    pair = {"id": "p0", "messages": messages, "chosen": "yes", "rejected": "no", "chosen_reward": 1.0,
            "rejected_reward": 0.0, "chosen_quantile": 1.0, "rejected_quantile": 0.0, "num_ref_rewards": 4,
            "ref_rewards": [1.0, 0.0, 0.0, 0.0], "pair_fallback": None, "chosen_finish_reason": "stop",
            "rejected_finish_reason": "stop", "num_ref_dropped": 0}
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(pair) + "\n")
    passed = run_pass(replace(configs["logprobs"], model_name_or_path=policy, input=str(pairs),
                              output_dir=str(tmp_path / "logprobs")))
    [scored] = load_ref_logprobs(passed, [pair])
    assert scored["ref_inputs"]["chat_date"] == "2026-01-01"
    trained = prepare_row(scored, 0, tokenizer, configs["train"])  # raises if the pass tokenized otherwise

    conversation = Dataset.from_list([{"id": "s0", "messages": json.dumps(
        [*messages, {"role": "assistant", "content": "yes"}])}])
    sft_ids = SFTTrainer._prepare(conversation, tokenizer, configs["sft"])[0]["input_ids"]

    prompt = sampled["sample"]
    assert sampled["evaluate"] == prompt
    assert trained["prompt_ids"] == prompt
    assert sft_ids[: len(prompt)] == prompt
    assert "Current date: 2026-01-01" in tokenizer.decode(prompt)

    # and a date set in one section alone would show: the samplers are not tied to the trainers by hand
    other = stage_config("sample", [str(TINY_RECIPE), "sampler.chat_date=2020-01-01"])
    assert build_sampler(replace(other.sampler, model=policy)).encoder.prompt_ids(messages) != prompt


def test_tiny_pipeline_samples_nothing_over_the_trainers_max_length():
    """The tiny recipe set: its longest prompt (rendered as the sampler renders it) plus the
    token budget fits the log-prob pass's and the trainer's max_length, so no pair is left out."""
    import json

    from align.sampling.base import PromptEncoder
    from align.testing.tiny import build_tokenizer

    configs = tiny_configs()
    sample = configs["sample"]
    encoder = PromptEncoder(build_tokenizer(), sample.sampler.chat_format, chat_date=sample.sampler.chat_date)
    prompts = [json.loads(line) for line in (RECIPES.parent / sample.prompts).read_text().splitlines() if line.strip()]
    longest = max(len(encoder.prompt_ids(p["messages"], p.get("tools"))) for p in prompts)
    assert longest + sample.max_tokens <= min(configs["logprobs"].max_length, configs["train"].max_length)


@pytest.mark.parametrize("size", ["apertus-8b", "apertus-70b"])
def test_the_apertus_pipeline_is_its_stage_files(size):
    """recipes/SIZE/pipeline.yaml runs every stage file of the flow, each step's config equal to the
    file's own (one source: the pipeline cannot drift from the files run by hand), wired in order."""
    pipeline = as_read_on_a_login_node(RECIPES / size / "pipeline.yaml")
    files = {"sft": "sft", "classify": "annotate_classifier", "sample": "sample", "sample_offline": "sample_offline",
             "annotate_rm": "annotate_rm", "annotate_judge": "annotate_judge", "pairs": "pairs",
             "logprobs": "logprobs", "qrpo": "qrpo", "dpo": "dpo", "evaluate": "evaluate"}
    main = [s for s in pipeline if not s.phase]
    assert [s.name for s in main] == list(files)
    for step in main:
        assert pipeline.config(step) == load_recipe(size, files[step.name]), step.name
    needs = {s.name: set(s.needs) for s in main}
    assert needs["sample"] == {"sft", "classify"} and needs["sample_offline"] == {"sample"}
    assert needs["annotate_rm"] == needs["annotate_judge"] == {"sample_offline"}
    assert needs["pairs"] == {"annotate_rm", "annotate_judge"}
    assert needs["evaluate"] == {"sft", "qrpo", "dpo"}
    phases = [s.name for s in pipeline if s.phase]
    assert phases == (["evaluate.kl", "evaluate.report"] if size == "apertus-70b" else [])


def training_steps(path) -> list[tuple[str, object]]:
    """(name, config) of every training step (sft, train) a shipped recipe runs."""
    recipe = as_read_on_a_login_node(path)
    return [(step.name, recipe.config(step)) for step in recipe if step.stage in ("sft", "train")]


GPU_RECIPES = sorted(p for p in RECIPE_FILES if "apertus" in p.parts[-2])


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_a_checkpoint_falls_due_within_the_first_tenth_of_every_run(path):
    """Read against the data size each training recipe states (`# data: rows=N`): the first checkpoint
    comes before 10% of the optimizer steps, so a failure on day 3 of a 70B run loses less than a tenth."""
    import math
    import re

    for name, config in training_steps(path):
        source = path if path.name != "pipeline.yaml" else RECIPES / path.parts[-2] / f"{name}.yaml"
        rows = int(re.search(r"^# data: rows=(\d+)", source.read_text(), re.MULTILINE).group(1))
        total = config.max_steps if config.max_steps and config.max_steps > 0 else \
            math.ceil(rows * config.num_train_epochs / config.global_batch_size)
        first = math.ceil(total * config.save_steps) if config.save_steps < 1 else int(config.save_steps)
        assert config.save_strategy in ("steps", "SaveStrategy.STEPS") or str(config.save_strategy).endswith("steps")
        assert first <= 0.1 * total, (path.name, name, first, total)
        assert total >= 20, (name, total)  # a run long enough for the rule to mean something
