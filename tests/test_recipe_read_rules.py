"""Rules of reading a recipe with rounds, and of a step graph's overrides, that the other recipe tests leave open.

A mutation check on align/recipe/read.py and align/recipe/rounds.py showed rules no fast test held:
every step a round of a recipe of sections runs (its name, keys and the line ``align status``
prints for it) for each reference and prompt setting, which keys of such a recipe are refused
and which defaults are accepted, which steps of a step graph run every round and from which
policy, what an override naming no step says, which names slurm.stages may use, and where
stop_after stops. Each test reads a recipe; nothing runs.
"""

from __future__ import annotations

import pytest

from align.config import ConfigError
from align.drivers import load_recipe

TRAINER = {"use_cpu": True, "bf16": False, "report_to": []}


def sections(**top) -> dict:
    """Two rounds of a recipe of sections, π₀ the sft section's output (a key set to None is left out)."""
    data = {
        "rounds": 2, "reference": "previous", "round_prompts": "all", "output_dir": "runs/s",
        "sft": {"model_name_or_path": "base", "input": "sft.jsonl", "output_dir": "runs/s/sft", **TRAINER},
        "sample": {"prompts": "p.jsonl", "n": 4},
        "annotate": {"provider": "verifiable"},
        "pairs": {"num_ref_rewards": 4},
        "logprobs": {},
        "train": {"num_ref_rewards": 4, **TRAINER},
        "evaluate": {"prompts": "h.jsonl"},
    }
    data.update(top)
    return {key: value for key, value in data.items() if value is not None}


def plan(data: dict, *overrides: str) -> dict[str, tuple[int | None, str, str, dict]]:
    """Each step by name: (its round, its name in the recipe, what it does, its keys)."""
    return {s.name: (s.round, s.base, s.what, s.keys) for s in load_recipe(data, list(overrides))}


def round_steps(k: int, policy: str, ref: str, policy_name: str, ref_name: str, *, prompts: str = "p.jsonl",
                annotated: str | None = None, root: str = "runs/s") -> dict:
    """Round k's sample, annotate, pairs, logprobs and train as docs/rounds.md wires them (written out by hand)."""
    here = f"{root}/round-{k}"
    return {
        f"round-{k}.sample": (k, "sample", f"samples from {policy_name}" + (" (π_ref too)" if ref == policy else ""),
                              {"prompts": prompts, "n": 4, "output_dir": f"{here}/sample",
                               "sampler": {"model": policy}}),
        f"round-{k}.annotate": (k, "annotate", "rewards", {"provider": "verifiable",
                                                           "input": annotated or f"{here}/sample",
                                                           "output_dir": f"{here}/annotate"}),
        f"round-{k}.pairs": (k, "pairs", f"quantile rewards against {ref_name}'s samples, pairs",
                             {"num_ref_rewards": 4, "input": f"{here}/annotate", "output_dir": f"{here}/pairs"}),
        f"round-{k}.logprobs": (k, "logprobs", f"log-probs under {ref_name} (π_ref)",
                                {"input": f"{here}/pairs/pairs.jsonl", "model_name_or_path": ref,
                                 "output_dir": f"{here}/logprobs"}),
        f"round-{k}.train": (k, "train", f"from {policy_name}",
                             {"num_ref_rewards": 4, **TRAINER, "input": f"{here}/logprobs",
                              "model_name_or_path": policy, "ref_model_name_or_path": ref,
                              "output_dir": f"{here}/train"}),
    }


def evaluate_step(k: int, chosen: list[tuple[str, str]], baseline: str, kl_reference: str) -> dict:
    return {f"round-{k}.evaluate": (k, "evaluate", f"{', '.join(n for n, _ in chosen)} against {baseline}",
                                    {"prompts": "h.jsonl", "policies": [{"name": n, "model": m} for n, m in chosen],
                                     "baseline": baseline, "kl_reference": kl_reference,
                                     "output_dir": f"runs/s/round-{k}/evaluate"})}


SFT = ("sft", "runs/s/sft")
ONE, TWO, THREE = ("round-1", "runs/s/round-1/train"), ("round-2", "runs/s/round-2/train"), \
    ("round-3", "runs/s/round-3/train")
SFT_STEP = {"sft": (None, "sft", "", {"model_name_or_path": "base", "input": "sft.jsonl", "output_dir": "runs/s/sft",
                                      **TRAINER})}


# --------------------------------------------------------------------------- recipes of sections: the plan


def test_previous_reference_each_round_trains_and_scores_under_the_policy_before():
    assert plan(sections()) == {
        **SFT_STEP,
        **round_steps(1, SFT[1], SFT[1], "sft", "sft"),
        **evaluate_step(1, [SFT, ONE], "sft", "sft"),
        **round_steps(2, ONE[1], ONE[1], "round-1", "round-1"),
        **evaluate_step(2, [SFT, ONE, TWO], "sft", "round-1"),
    }


def test_initial_reference_joins_round_one_samples_as_the_references_of_later_rounds():
    """With all prompts every round, π₀'s samples are round 1's: later rounds join them, scored under π₀."""
    data = sections(rounds=3, reference="initial", evaluate={"prompts": "h.jsonl", "baseline": "previous"})
    joins = {f"round-{k}.join": (k, "join", f"round-{k - 1}'s samples beside sft's reference samples",
                                 {"input": "runs/s/round-1/sample", "completions": f"runs/s/round-{k}/sample",
                                  "output_dir": f"runs/s/round-{k}/join"}) for k in (2, 3)}
    expected = {
        **SFT_STEP,
        **round_steps(1, SFT[1], SFT[1], "sft", "sft"),
        **evaluate_step(1, [SFT, ONE], "sft", "sft"),
        **round_steps(2, ONE[1], SFT[1], "round-1", "sft", annotated="runs/s/round-2/join"),
        **evaluate_step(2, [SFT, ONE, TWO], "round-1", "sft"),  # baseline previous: the policy round 2 starts from
        **round_steps(3, TWO[1], SFT[1], "round-2", "sft", annotated="runs/s/round-3/join"),
        **evaluate_step(3, [SFT, TWO, THREE], "round-2", "sft"),
        **joins,
    }
    got = plan(data)
    assert got == expected
    assert list(got) == ["sft", *(f"round-1.{s}" for s in ("sample", "annotate", "pairs", "logprobs", "train",
                                                             "evaluate")),
                         *(f"round-{k}.{s}" for k in (2, 3) for s in ("sample", "join", "annotate", "pairs",
                                                                      "logprobs", "train", "evaluate"))]


def test_split_prompts_give_each_round_its_part_and_pi0_samples_that_part_for_the_references():
    data = sections(reference="initial", round_prompts="split", evaluate=None)
    splits = {f"round-{k}.split": (k, "split", f"part {k} of 2 of the prompts",
                                   {"input": "p.jsonl", "part": k, "parts": 2,
                                    "output_dir": f"runs/s/round-{k}/prompts"}) for k in (1, 2)}
    references = {"round-2.references": (2, "sample", "reference samples from sft (π_ref)",
                                         {"prompts": "runs/s/round-2/prompts", "n": 4,
                                          "output_dir": "runs/s/round-2/references",
                                          "sampler": {"model": "runs/s/sft"}})}
    join = {"round-2.join": (2, "join", "round-1's samples beside sft's reference samples",
                             {"input": "runs/s/round-2/references", "completions": "runs/s/round-2/sample",
                              "output_dir": "runs/s/round-2/join"})}
    got = plan(data)
    assert got == {
        **SFT_STEP, **splits, **references, **join,
        **round_steps(1, SFT[1], SFT[1], "sft", "sft", prompts="runs/s/round-1/prompts"),
        **round_steps(2, ONE[1], SFT[1], "round-1", "sft", prompts="runs/s/round-2/prompts",
                      annotated="runs/s/round-2/join"),
    }
    assert list(got)[:3] == ["sft", "round-1.split", "round-1.sample"]
    assert list(got)[7:11] == ["round-2.split", "round-2.references", "round-2.sample", "round-2.join"]


def test_previous_reference_with_split_prompts_samples_no_references():
    got = plan(sections(round_prompts="split", evaluate=None))
    assert [name for name in got if name.startswith("round-2.")] == \
        [f"round-2.{s}" for s in ("split", "sample", "annotate", "pairs", "logprobs", "train")]
    assert got["round-2.logprobs"][3]["model_name_or_path"] == ONE[1]


def test_without_an_sft_section_initial_policy_is_pi0_and_output_dir_defaults_to_runs():
    data = sections(sft=None, initial_policy="org/base", output_dir=None, rounds=1, evaluate=None)
    assert plan(data) == round_steps(1, "org/base", "org/base", "sft", "sft", root="runs")


def test_evaluate_baseline_previous_is_the_policy_each_round_starts_from():
    got = plan(sections(evaluate={"prompts": "h.jsonl", "baseline": "previous"}))
    assert got["round-2.evaluate"] == evaluate_step(2, [SFT, ONE, TWO], "round-1", "round-1")["round-2.evaluate"]


# --------------------------------------------------------------------------- recipes of sections: refused keys


@pytest.mark.parametrize("section", ["annotate", "train"])
def test_a_rounds_recipe_without_a_round_section_is_refused_naming_it(section):
    """Each round samples, annotates, pairs, scores and trains: the last of those sections is needed too."""
    with pytest.raises(ConfigError, match=rf"rounds: the recipe needs the sections \['{section}'\]"):
        load_recipe(sections(**{section: None}))


@pytest.mark.parametrize("override", ["train.input=x", "annotate.output_dir=x", "sample.sampler.model=x",
                                      "logprobs.cache_dir=x"])
def test_a_key_the_rounds_set_is_refused_in_a_section(override):
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}: set by the pipeline in each round"):
        load_recipe(sections(), [override])


def test_a_sampler_setting_other_than_the_model_is_kept():
    got = plan(sections(), "sample.sampler.backend=transformers")
    assert got["round-2.sample"][3]["sampler"] == {"backend": "transformers", "model": ONE[1]}


@pytest.mark.parametrize(("override", "message"), [
    ("evaluate.baseline=qrpo", r"evaluate.baseline: 'qrpo'; with rounds, sft \(π₀\) or previous"),
    ("sample.mode=offline", r"sample.mode: 'offline'; with rounds, reference"),
    ("train.reference=model", r"train.reference: 'model'; with rounds, precomputed"),
])
def test_a_section_setting_rounds_cannot_run_is_refused_naming_it(override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(sections(), [override])


def test_the_stage_defaults_of_sample_mode_and_train_reference_are_accepted():
    """sample.mode (reference) and train.reference (precomputed) left out: the stages' defaults, which rounds use."""
    data = sections(evaluate={"prompts": "h.jsonl"})
    assert "mode" not in data["sample"] and "reference" not in data["train"] and "baseline" not in data["evaluate"]
    assert len(plan(data)) == 1 + 2 * 6
    for key in ("sample.mode=reference", "train.reference=precomputed", "evaluate.baseline=sft"):
        assert len(plan(data, key)) == 1 + 2 * 6


# --------------------------------------------------------------------------- step graphs with rounds


def graph_with_rounds(reference: str = "previous", **top) -> dict:
    """π₀ from an sft step; each round samples the policy, scores, and trains from it (paths only)."""
    return {
        "output_dir": "runs/r", "rounds": 2, "reference": reference, "initial_policy": "@sft", **top,
        "steps": {
            "sft": {"stage": "sft", "model_name_or_path": "base", "input": "sft.jsonl", **TRAINER},
            "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
            "annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
            "pairs": {"stage": "pairs", "input": "@annotate"},
            "logprobs": {"stage": "logprobs", "input": "@pairs/pairs.jsonl", "model_name_or_path": "@reference"},
            "train": {"stage": "train", "input": "@logprobs", "model_name_or_path": "@policy",
                      "ref_model_name_or_path": "@reference", **TRAINER},
        }}


def test_under_the_previous_reference_a_step_reading_only_the_reference_runs_every_round():
    data = graph_with_rounds("previous")
    data["steps"]["references"] = {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@reference"}}
    recipe = load_recipe(data)
    assert "references" not in [s.name for s in recipe]
    assert recipe.step("round-2.references").keys["sampler"] == {"model": "runs/r/round-1/train"}


def test_a_graph_where_no_step_reads_the_reference_reads():
    data = graph_with_rounds("previous")
    data["steps"]["logprobs"]["model_name_or_path"] = "@policy"
    data["steps"]["train"]["ref_model_name_or_path"] = "@policy"
    recipe = load_recipe(data)
    assert recipe.step("round-2.logprobs").keys["model_name_or_path"] == "runs/r/round-1/train"


def test_an_initial_policy_path_is_not_read_as_a_step_name():
    """Only @NAME names a step: a path whose first directory is a step's name is a path."""
    recipe = load_recipe(graph_with_rounds(initial_policy="/train/base"))
    assert recipe.step("round-1.train").keys["model_name_or_path"] == "/train/base"
    assert recipe.step("round-2.train").keys["ref_model_name_or_path"] == "runs/r/round-1/train"


def test_an_initial_policy_inside_a_step_that_runs_every_round_is_refused():
    data = graph_with_rounds(initial_policy="@sft/final")
    data["steps"]["sft"]["input"] = "@annotate"
    with pytest.raises(ConfigError, match=r"initial_policy: @sft would run every round \(it reads \['annotate'\]"):
        load_recipe(data)


def test_an_initial_policy_naming_no_step_is_refused_naming_initial_policy():
    with pytest.raises(ConfigError, match=r"^initial_policy: '@nothing' names no earlier step"):
        load_recipe(graph_with_rounds(initial_policy="@nothing"))


def test_two_trainers_every_round_without_policy_step_are_refused_named_in_the_order_they_run():
    """'first' is listed after 'train' but runs before it (train starts from first's model)."""
    data = graph_with_rounds()
    data["steps"]["train"]["model_name_or_path"] = "@first"
    data["steps"]["first"] = {"stage": "train", "input": "@logprobs", "model_name_or_path": "@policy",
                              "ref_model_name_or_path": "@reference", **TRAINER}
    with pytest.raises(ConfigError, match=r"policy_step: the rounds train 2 steps \(\['first', 'train'\]\); name "):
        load_recipe(data)
    recipe = load_recipe({**data, "policy_step": "train"})
    assert recipe.step("round-2.first").keys["model_name_or_path"] == "runs/r/round-1/train"


def test_an_sft_step_that_runs_every_round_may_be_the_policy_step():
    data = graph_with_rounds(policy_step="polish")
    data["steps"]["polish"] = {"stage": "sft", "model_name_or_path": "@train", "input": "sft.jsonl", **TRAINER}
    recipe = load_recipe(data)
    assert recipe.step("round-2.sample").keys["sampler"] == {"model": "runs/r/round-1/polish"}


def test_a_step_that_runs_every_round_may_not_set_its_output_dir():
    data = graph_with_rounds()
    data["steps"]["train"]["output_dir"] = "runs/t"
    with pytest.raises(ConfigError, match=r"step 'train': runs every round, so its output_dir is "
                                          r"output_dir/round-k/train; leave output_dir out"):
        load_recipe(data)


def test_a_round_step_reading_a_step_without_an_output_dir_is_refused_naming_the_step_and_round():
    data = graph_with_rounds()
    data["steps"]["prompts"] = {"stage": "split", "input": "p.jsonl", "part": 1, "parts": 2, "output_dir": None}
    data["steps"]["sample"]["prompts"] = "@prompts"
    with pytest.raises(ConfigError, match=r"^step 'sample' \(round 1\).prompts: '@prompts' names step 'prompts', "
                                          r"which writes no output_dir of its own"):
        load_recipe(data)


# --------------------------------------------------------------------------- overrides of a step graph


def steps_graph() -> dict:
    return {"output_dir": "runs/g", "steps": {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}},
        "pairs": {"stage": "pairs", "input": "@sample"},
    }}


def test_an_override_of_a_misspelt_step_repeats_its_whole_key():
    with pytest.raises(ConfigError, match=r"^pars\.where\.label\.x=\.\.\.: 'pars' names no step of this recipe; did "
                                          r"you mean pairs\.where\.label\.x\? \(steps: \['sample', 'pairs'\]\)$"):
        load_recipe(steps_graph(), ["pars.where.label.x=1"])


def test_an_empty_mapping_for_an_unknown_step_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"'pars' names no step of this recipe"):
        load_recipe(steps_graph(), ["pars={}"])


@pytest.mark.parametrize("first", ["output_dir=runs/h", "colour=red"])
def test_an_override_of_a_misspelt_step_is_named_after_other_top_level_keys(first):
    """A top-level key (known or not) listed first does not stop the check of the step overrides after it."""
    with pytest.raises(ConfigError, match=r"^pars\.seed=\.\.\.: 'pars' names no step of this recipe"):
        load_recipe(steps_graph(), [first, "pars.seed=3"])


def test_slurm_stages_may_name_a_step_that_runs_every_round_by_its_name_in_the_recipe():
    data = graph_with_rounds("previous", slurm={"stages": {"references": {"array": 2}}})
    data["steps"]["references"] = {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@reference"}}
    assert load_recipe(data).step("round-2.references").base == "references"


# --------------------------------------------------------------------------- stop_after


def evaluated(*after: str) -> dict:
    """sample, an evaluation of three jobs (generate and score, KL, report), then the steps named."""
    steps = {"sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}},
             "evaluate": {"stage": "evaluate", "prompts": "h.jsonl", "baseline": "a", "kl": True,
                          "kl_sharding": "zero3", "policies": [{"name": "a", "model": "m"}]}}
    steps.update({name: {"stage": "annotate", "input": "@sample", "provider": "verifiable"} for name in after})
    return {"output_dir": "runs/g", "steps": steps}


@pytest.mark.parametrize("after", [(), ("annotate",)])
def test_stop_after_an_evaluation_keeps_its_kl_and_report_jobs_and_nothing_after(after):
    names = [s.name for s in load_recipe({**evaluated(*after), "stop_after": "evaluate"})]
    assert names == ["sample", "evaluate", "evaluate.kl", "evaluate.report"]


def test_stop_after_a_stage_the_recipe_does_not_run_keeps_every_step():
    assert [s.name for s in load_recipe({**evaluated("annotate"), "stop_after": "train"})] == \
        ["sample", "evaluate", "evaluate.kl", "evaluate.report", "annotate"]


def test_stop_after_naming_nothing_lists_the_steps_and_rounds_it_could_name():
    with pytest.raises(ConfigError, match=r"^stop_after: 'nowhere' is not one of \['sft', 'round-1.sample', "):
        load_recipe(graph_with_rounds(stop_after="nowhere"))
    with pytest.raises(ConfigError, match=r"'round-1.train', 'round-2.sample', .*'round-2.train', 'round-1', "
                                          r"'round-2'\]$"):
        load_recipe(graph_with_rounds(stop_after="nowhere"))
