"""Rules of reading a step graph, with rounds and without, that the other recipe tests leave open.

A mutation check on align/recipe/read.py showed rules no fast test held: where the steps
write when the recipe sets no output_dir (with rounds: refused, naming output_dir; without:
each step needs its own), that a step's output_dir is never another step's output, that
@policy, @reference and @initial name nothing without rounds, that a step run once before
the rounds reads π₀ for @initial (and for @reference under reference: initial), the line the
pipeline prints for a round's step, how a section that runs once by itself (split) is named,
where a step's ``from:`` file is looked for, and where stop_after stops around an
evaluation's KL and report jobs. Each test reads a recipe; nothing runs.
"""

from __future__ import annotations

import pytest

from align.config import ConfigError
from align.drivers import load_recipe

TRAINER = {"use_cpu": True, "bf16": False, "report_to": []}


def rounds_graph(**top) -> dict:
    """Two rounds from an sft step's model: each samples the policy, scores, pairs and trains (a key set to None
    is left out)."""
    data = {
        "output_dir": "runs/r", "rounds": 2, "reference": "previous", "initial_policy": "@sft", **top,
        "steps": {
            "sft": {"stage": "sft", "model_name_or_path": "base", "input": "sft.jsonl", **TRAINER},
            "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
            "annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
            "pairs": {"stage": "pairs", "input": "@annotate"},
            "logprobs": {"stage": "logprobs", "input": "@pairs/pairs.jsonl", "model_name_or_path": "@reference"},
            "train": {"stage": "train", "input": "@logprobs", "model_name_or_path": "@policy",
                      "ref_model_name_or_path": "@reference", **TRAINER},
        }}
    return {key: value for key, value in data.items() if value is not None}


def two_steps(**top) -> dict:
    """sample then scores (its rewards), without rounds."""
    return {"output_dir": "runs/g", **top, "steps": {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}},
        "scores": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
    }}


# --------------------------------------------------------------------------- where the steps write


@pytest.mark.parametrize("sft_output", [None, "runs/sft"])
def test_a_graph_with_rounds_without_output_dir_is_refused_naming_output_dir(sft_output):
    """The rounds write under output_dir/round-k/: the recipe's output_dir is asked for, not each step's."""
    data = rounds_graph(output_dir=None)
    if sft_output:
        data["steps"]["sft"]["output_dir"] = sft_output
    with pytest.raises(ConfigError, match=r"^output_dir: set the directory the rounds write under \(round k: "
                                          r"output_dir/round-k/\)$"):
        load_recipe(data)


def test_a_graph_without_rounds_or_output_dir_asks_each_step_without_one_for_its_own():
    data = two_steps()
    del data["output_dir"]
    data["steps"]["sample"]["output_dir"] = "runs/s"
    with pytest.raises(ConfigError, match=r"^step 'scores': set its output_dir, or the recipe's output_dir \(step NAME "
                                          r"then writes to output_dir/NAME\)$"):
        load_recipe(data)


def test_a_graph_without_rounds_where_every_step_sets_its_output_dir_needs_no_recipe_output_dir():
    data = two_steps()
    del data["output_dir"]
    data["steps"]["sample"]["output_dir"] = "runs/s"
    data["steps"]["scores"]["output_dir"] = "runs/p"
    recipe = load_recipe(data)
    assert [(s.name, s.output_dir) for s in recipe] == [("sample", "runs/s"), ("scores", "runs/p")]
    assert recipe.step("scores").keys["input"] == "runs/s"


def test_a_step_whose_output_dir_names_another_step_is_refused():
    data = two_steps()
    data["steps"]["scores"]["output_dir"] = "@sample"
    with pytest.raises(ConfigError, match=r"^step 'scores': output_dir='@sample': a step writes a directory of its "
                                          r"own, not another step's output$"):
        load_recipe(data)


# --------------------------------------------------------------------------- the policy references


@pytest.mark.parametrize("token", ["policy", "reference", "initial"])
def test_a_graph_without_rounds_refuses_a_policy_reference_as_naming_no_step(token):
    """@policy, @reference and @initial are the rounds' policies: without rounds they name no step."""
    data = two_steps()
    data["steps"]["sample"]["sampler"]["model"] = f"@{token}"
    with pytest.raises(ConfigError, match=rf"^step 'sample': @{token} names no step \(steps: \['sample', "
                                          r"'scores'\]\)$"):
        load_recipe(data)


@pytest.mark.parametrize(("reference", "token"), [("previous", "initial"), ("initial", "initial"),
                                                  ("initial", "reference")])
@pytest.mark.parametrize(("initial_policy", "pi0"), [("@sft", "runs/r/sft"), ("org/base", "org/base")])
def test_a_step_that_runs_once_reads_pi0_for_initial_and_for_a_reference_that_stays(reference, token,
                                                                                      initial_policy, pi0):
    """A step naming only @initial (or @reference under reference: initial) runs once, before the rounds,
    and reads π₀: the sft step's output or the initial_policy path."""
    data = rounds_graph(reference=reference, initial_policy=initial_policy)
    data["steps"]["baseline"] = {"stage": "sample", "prompts": "h.jsonl", "sampler": {"model": f"@{token}/final"}}
    recipe = load_recipe(data)
    baseline = recipe.step("baseline")
    assert (baseline.round, baseline.output_dir) == (None, "runs/r/baseline")
    assert baseline.keys["sampler"] == {"model": f"{pi0}/final"}
    assert not [s.name for s in recipe if s.base == "baseline" and s.round is not None]


def test_each_step_of_a_round_says_its_round_in_the_pipeline_log():
    """What ``align pipeline`` prints beside a round's step (``round 2 step round-2.train: round 2``)."""
    recipe = load_recipe(rounds_graph())
    assert [(s.name, s.what) for s in recipe if s.round == 2] == \
        [(f"round-2.{name}", "round 2") for name in ("sample", "annotate", "pairs", "logprobs", "train")]
    assert recipe.step("sft").what == ""


# --------------------------------------------------------------------------- sections that run once by themselves


def test_a_split_section_is_a_step_named_split_and_its_errors_name_the_section():
    recipe = load_recipe({"output_dir": "runs/s", "split": {"input": "p.jsonl", "part": 1, "parts": 2, "sead": 1}})
    assert [(s.name, s.stage, s.base) for s in recipe] == [("split", "split", "split")]
    with pytest.raises(ConfigError, match=r"^pipeline section 'split': unknown key split.'sead'"):
        recipe.config(recipe.step("split"))


# --------------------------------------------------------------------------- a step's from: file


@pytest.mark.parametrize(("written_in", "read"), [(("recipes", "work"), "recipes.jsonl"), (("work",), "work.jsonl")])
def test_a_from_file_is_read_beside_the_recipe_else_from_the_working_directory(tmp_path, monkeypatch, written_in,
                                                                               read):
    for folder in ("recipes", "work"):
        (tmp_path / folder).mkdir()
    for folder in written_in:
        (tmp_path / folder / "pairs.yaml").write_text(f"input: {folder}.jsonl\nseed: 7\n")
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.write_text("output_dir: runs/g\nsteps:\n  pairs: {stage: pairs, from: pairs.yaml, seed: 9}\n")
    monkeypatch.chdir(tmp_path / "work")
    keys = load_recipe(recipe).step("pairs").keys
    assert (keys["input"], keys["seed"]) == (read, 9)  # the step's own keys over the file's


# --------------------------------------------------------------------------- stop_after around an evaluation


def evaluation(**top) -> dict:
    """sample, an evaluation of three jobs (generate and score, KL, report), then an annotate step."""
    return {"output_dir": "runs/g", **top, "steps": {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}},
        "evaluate": {"stage": "evaluate", "prompts": "h.jsonl", "baseline": "a", "kl": True, "kl_sharding": "zero3",
                     "policies": [{"name": "a", "model": "m"}]},
        "annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
    }}


@pytest.mark.parametrize(("stop_after", "kept"), [
    ("sample", ["sample"]),
    ("evaluate", ["sample", "evaluate", "evaluate.kl", "evaluate.report"]),
    ("evaluate.kl", ["sample", "evaluate", "evaluate.kl", "evaluate.report"]),  # its report job belongs to it
    ("evaluate.report", ["sample", "evaluate", "evaluate.kl", "evaluate.report"]),
    ("annotate", ["sample", "evaluate", "evaluate.kl", "evaluate.report", "annotate"]),
])
def test_stop_after_keeps_the_steps_up_to_the_one_named_with_an_evaluations_jobs(stop_after, kept):
    assert [s.name for s in load_recipe(evaluation(stop_after=stop_after))] == kept


def evaluated_rounds(**top) -> dict:
    data = rounds_graph(**top)
    data["steps"]["evaluate"] = {"stage": "evaluate", "prompts": "h.jsonl", "baseline": "base", "kl": True,
                                 "kl_sharding": "zero3", "kl_reference": "base",
                                 "policies": [{"name": "base", "model": "@initial"},
                                              {"name": "trained", "model": "@train"}]}
    return data


@pytest.mark.parametrize("stop_after", ["round-1.evaluate", "round-1.evaluate.kl", "round-1"])
def test_stop_after_round_ones_evaluation_keeps_its_jobs_and_nothing_of_round_two(stop_after):
    names = [s.name for s in load_recipe(evaluated_rounds(stop_after=stop_after))]
    assert names[-4:] == ["round-1.train", "round-1.evaluate", "round-1.evaluate.kl", "round-1.evaluate.report"]
    assert not [name for name in names if name.startswith("round-2.")]


def test_stop_after_an_evaluate_step_of_rounds_stops_at_the_first_round():
    """stop_after: evaluate names the step in the recipe: its first run, round 1's, and that one's jobs."""
    names = [s.name for s in load_recipe(evaluated_rounds(stop_after="evaluate"))]
    assert names[-3:] == ["round-1.evaluate", "round-1.evaluate.kl", "round-1.evaluate.report"]


@pytest.mark.parametrize("stop_after", ["round-2.evaluate", "round-2"])
def test_stop_after_the_last_evaluation_keeps_every_step(stop_after):
    """The recipe's last step is an evaluation: stopping after it keeps its report job, the last of all."""
    every = [s.name for s in load_recipe(evaluated_rounds())]
    assert every[-1] == "round-2.evaluate.report"
    assert [s.name for s in load_recipe(evaluated_rounds(stop_after=stop_after))] == every
