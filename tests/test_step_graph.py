"""The step graph checked whole when a recipe is read (align.recipe.checks, align.recipe.graph).

Each rule between steps, as a cluster team breaks it: steps listed out of order, two steps
writing one directory through a symbolic link, a mistyped ``where:`` label, a split that
leaves rows in no branch, a step name that is a command-line flag, a stage named where a
step is meant, a key reading the wrong kind of rows, and a reference pass that scores other
tokens than training sees. Nothing runs: each test reads a recipe.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from align.config import ConfigError
from align.drivers import load_recipe


def graph(tmp_path: Path | None = None, **steps) -> dict:
    """prompts -> classify -> sample -> annotate_rm / annotate_judge -> pairs (paths only)."""
    base = {
        "classify": {"stage": "annotate", "input": "p.jsonl", "provider": "classifier", "model": "judge"},
        "sample": {"stage": "sample", "prompts": "@classify", "sampler": {"model": "m", "backend": "transformers"}},
        "annotate_rm": {"stage": "annotate", "input": "@sample", "provider": "verifiable",
                        "where": {"controversial": False}},
        "annotate_judge": {"stage": "annotate", "input": "@sample", "provider": "verifiable",
                           "where": {"controversial": [True, None]}},
        "pairs": {"stage": "pairs", "input": ["@annotate_rm", "@annotate_judge"]},
    }
    for name, keys in steps.items():
        if keys is None:
            base.pop(name)
        else:
            base[name] = {**base.get(name, {}), **keys}
    return {"output_dir": str(tmp_path / "runs") if tmp_path else "runs/g", "steps": base}


def test_the_apertus_shaped_graph_reads():
    recipe = load_recipe(graph())
    assert [s.name for s in recipe] == ["classify", "sample", "annotate_rm", "annotate_judge", "pairs"]


# --------------------------------------------------------------------------- order


def test_steps_listed_out_of_order_and_wired_by_path_run_after_what_they_read():
    """pairs first, reading annotate's directory by path: it still runs after annotate (and an overwrite of
    annotate redoes pairs), because a step's needs come from every path it names, wherever that step is listed."""
    data = {"output_dir": "runs/g", "steps": {
        "pairs": {"stage": "pairs", "input": "runs/g/annotate"},
        "annotate": {"stage": "annotate", "input": "runs/g/sample", "provider": "verifiable"},
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}},
    }}
    recipe = load_recipe(data)
    assert [(s.name, s.needs) for s in recipe] == [("sample", ()), ("annotate", ("sample",)),
                                                   ("pairs", ("annotate",))]


def test_a_step_may_name_a_step_listed_after_it():
    data = graph()
    data["steps"] = dict(reversed(list(data["steps"].items())))
    assert [s.name for s in load_recipe(data)] == ["classify", "sample", "annotate_judge", "annotate_rm", "pairs"]


def test_steps_reading_each_other_are_refused_naming_the_cycle():
    data = graph(classify={"input": "@pairs"})
    with pytest.raises(ConfigError, match=r"steps read each other's outputs in a cycle \(classify reads pairs reads "
                                          r"annotate_judge reads sample reads classify\)"):
        load_recipe(data)


# --------------------------------------------------------------------------- output directories


def test_two_output_dirs_that_are_one_directory_through_a_link_are_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    data = graph(annotate_rm={"output_dir": str(real / "scores")},
                 annotate_judge={"output_dir": str(tmp_path / "alias" / "scores")})
    with pytest.raises(ConfigError, match=r"steps 'annotate_rm' and 'annotate_judge' both write .*alias/scores "
                                          r"\(.*real/scores and .*alias/scores are one directory: .*real/scores\)"):
        load_recipe(data)


def test_a_dotdot_spelling_of_another_steps_output_is_refused(tmp_path):
    data = graph(tmp_path, annotate_judge={"output_dir": str(tmp_path / "runs" / "x" / ".." / "annotate_rm")})
    with pytest.raises(ConfigError, match=r"steps 'annotate_rm' and 'annotate_judge' both write"):
        load_recipe(data)


def test_an_output_inside_another_through_a_link_is_refused(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "inner").symlink_to(tmp_path / "runs" / "sample", target_is_directory=True)
    data = graph(tmp_path, annotate_rm={"output_dir": str(tmp_path / "inner" / "rm")})
    with pytest.raises(ConfigError, match=r"step 'annotate_rm' writes .*inner/rm, inside \(or around\) step 'sample'"):
        load_recipe(data)


def test_a_step_reading_through_a_link_needs_the_step_that_writes_there(tmp_path):
    (tmp_path / "runs").mkdir()
    os.symlink(tmp_path / "runs" / "sample", tmp_path / "samples")
    data = graph(tmp_path, annotate_rm={"input": str(tmp_path / "samples")}, annotate_judge=None,
                 pairs={"input": "@annotate_rm"})
    data["steps"]["annotate_rm"]["where_rest"] = "drop"
    recipe = load_recipe(data)
    assert recipe.step("annotate_rm").needs == ("sample",)


# --------------------------------------------------------------------------- splits by label


def test_a_quoted_label_is_refused_naming_the_labels_the_classifier_writes():
    data = graph(annotate_rm={"where": {"controversial": "false"}})
    with pytest.raises(ConfigError, match=r"step 'annotate_rm': where.controversial: 'false' is not a value step "
                                          r"'classify' writes in 'controversial'; it writes true, false, null \(quoted, "
                                          r"true/false/null are text: write them without quotes\)"):
        load_recipe(data)


def test_a_label_no_branch_selects_is_refused_naming_it():
    data = graph(annotate_judge={"where": {"controversial": True}})
    with pytest.raises(ConfigError, match=r"steps \['annotate_rm', 'annotate_judge'\] split 'classify''s rows by "
                                          r"'controversial', but no step selects the rows with controversial: null"):
        load_recipe(data)


def test_where_rest_drop_leaves_rows_out_on_purpose():
    data = graph(annotate_judge={"where": {"controversial": True}, "where_rest": "drop"})
    assert [s.name for s in load_recipe(data)][-1] == "pairs"


def test_a_label_in_two_branches_is_refused():
    data = graph(annotate_judge={"where": {"controversial": [True, False, None]}})
    with pytest.raises(ConfigError, match=r"steps \['annotate_rm', 'annotate_judge'\] each select the rows with "
                                          r"controversial: false"):
        load_recipe(data)


def test_one_branch_alone_must_say_it_leaves_rows_out():
    data = graph(annotate_judge=None, pairs={"input": "@annotate_rm"})
    with pytest.raises(ConfigError, match=r"no step selects the rows with controversial: true, null"):
        load_recipe(data)


def test_a_split_of_a_file_is_not_checked_before_the_run():
    """Labels of a file no step writes are not known when the recipe is read: the run counts each branch."""
    data = graph(sample={"prompts": "labelled.jsonl"}, classify=None)
    assert len(load_recipe(data).steps) == 4


def test_labels_pass_through_the_steps_that_keep_their_input_rows():
    """classify -> sample -> sample_offline -> annotate: both sampling steps keep the prompt's label."""
    data = graph(sample_offline={"stage": "sample", "mode": "offline", "prompts": "@sample",
                                 "sampler": {"model": "m2"}, "on_unclassified": "persona"},
                 annotate_rm={"input": "@sample_offline", "where": {"controversial": 0}},
                 annotate_judge={"input": "@sample_offline"})
    with pytest.raises(ConfigError, match=r"where.controversial: 0 is not a value step 'classify' writes"):
        load_recipe(data)


# --------------------------------------------------------------------------- names and overrides


@pytest.mark.parametrize("name", ["--help", "-x", "x=1", "a.b", "a/b", "@a", "round-2", "policy", "1st", "a b"])
def test_a_step_name_must_be_an_identifier(name):
    data = graph(**{name: {"stage": "pairs", "input": "@annotate_rm/x.jsonl"}})
    with pytest.raises(ConfigError, match=rf"steps: {name!r} is not a step name".replace("[", r"\[")):
        load_recipe(data)


def test_a_stage_named_where_a_step_is_meant_names_the_steps_it_could_mean():
    data = graph(qrpo={"stage": "train", "input": "l", "model_name_or_path": "m"},
                 dpo={"stage": "train", "input": "l2", "model_name_or_path": "m", "loss_type": "dpo"})
    with pytest.raises(ConfigError, match=r"train.beta=...: this recipe is a step graph, where train is a stage, not a "
                                          r"step; its train steps are \['qrpo', 'dpo'\]: set qrpo.beta=... or "
                                          r"dpo.beta=..."):
        load_recipe(data, ["train.beta=3"])


def test_a_misspelt_step_lists_the_steps():
    with pytest.raises(ConfigError, match=r"pars.seed=...: 'pars' names no step of this recipe; did you mean "
                                          r"pairs.seed\? \(steps: \['classify', 'sample'"):
        load_recipe(graph(), ["pars.seed=3"])


# --------------------------------------------------------------------------- what a key reads


def test_a_key_reading_another_kind_of_rows_is_refused():
    data = graph(logprobs={"stage": "logprobs", "input": "@annotate_rm", "model_name_or_path": "m"})
    with pytest.raises(ConfigError, match=r"step 'logprobs': input=.*annotate_rm is step 'annotate_rm''s output "
                                          r"\(annotate: scored samples\), but input reads pairs"):
        load_recipe(data)


def test_an_output_of_two_kinds_must_be_read_by_its_data_file():
    data = graph(logprobs={"stage": "logprobs", "input": "@pairs", "model_name_or_path": "m"})
    with pytest.raises(ConfigError, match=r"name its data file: input=@pairs/pairs.jsonl"):
        load_recipe(data)


def test_a_model_key_reading_rows_is_refused():
    data = graph(logprobs={"stage": "logprobs", "input": "@pairs/pairs.jsonl", "model_name_or_path": "@sample"})
    with pytest.raises(ConfigError, match=r"model_name_or_path=.*sample is step 'sample''s output \(sample: samples\), "
                                          r"but model_name_or_path reads model"):
        load_recipe(data)


def test_training_on_pairs_without_reference_log_probs_needs_a_reference_model():
    data = graph(train={"stage": "train", "input": "@pairs/pairs.jsonl", "model_name_or_path": "m"})
    with pytest.raises(ConfigError, match=r"input reads pairs with reference log-probs"):
        load_recipe(data)
    data["steps"]["train"]["reference"] = "model"
    load_recipe(data)


def test_the_reference_pass_and_training_must_cut_rows_alike():
    data = graph(logprobs={"stage": "logprobs", "input": "@pairs/pairs.jsonl", "model_name_or_path": "m",
                           "max_length": 2048},
                 train={"stage": "train", "input": "@logprobs", "model_name_or_path": "m", "max_length": 4096})
    with pytest.raises(ConfigError, match=r"steps 'logprobs' and 'train': max_length is 2048 in the reference pass "
                                          r"and 4096 in training"):
        load_recipe(data)
    data["steps"]["train"]["max_length"] = 2048
    data["defaults"] = {"chat_date": "2025-09-01"}
    load_recipe(data)


# --------------------------------------------------------------------------- every shipped recipe


@pytest.mark.parametrize("recipe", ["recipes/tiny/pipeline.yaml", "recipes/tiny/rounds.yaml",
                                    "recipes/apertus-8b/pipeline.yaml", "recipes/apertus-70b/pipeline.yaml"])
def test_every_shipped_pipeline_passes_the_graph_checks(recipe):
    root = Path(__file__).resolve().parents[1]
    assert load_recipe(str(root / recipe), devices="defer").steps


# --------------------------------------------------------------------------- plan and submit see the same jobs


def test_align_plan_sizes_every_job_align_submit_writes(tmp_path, monkeypatch, capsys):
    """The 70B flow with the evaluation's KL partitioned (three jobs: generate and score, the KL launch, the
    report): the plan names each job the dry-run submission writes a script for, the KL launch included."""
    from align.cli import main

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    recipe = "recipes/apertus-70b/pipeline.yaml"
    logs = tmp_path / "slurm"
    overrides = ["evaluate.kl=true", "evaluate.kl_sharding=zero3"]
    assert main(["plan", recipe, *[f"set.{o}" for o in overrides], "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs"]
    assert main(["submit", recipe, *overrides, f"slurm.log_dir={logs}", "dry_run=true"]) == 0
    scripts = {p.name.split("-", 1)[1].removesuffix(".sbatch") for p in logs.glob("*.sbatch")}
    assert "evaluate.kl" in scripts and "evaluate.report" in scripts
    assert {job["step"] for job in jobs} == scripts
    kl = [job for job in jobs if job["step"] == "evaluate.kl"]
    assert {j["job"] for j in kl} == {"KL of policy qrpo", "KL of policy dpo"}
    assert all("reference_weights" in {p["name"] for p in j["estimate"]["parts"]} for j in kl)


# --------------------------------------------------------------------------- a split's rows, counted


def test_status_counts_the_rows_each_branch_of_a_split_took(tmp_path, capsys):
    """Run on labelled prompts of a file: 3 false, 2 true, 1 null; the rm branch takes false, the judge
    branch true; null is left out on purpose. align status reports each branch's rows and those in none."""
    from align.cli import main

    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": "q"}], "answer": "yes",
             "controversial": label, "completions": [{"text": "yes", "is_reference": True}]}
            for i, label in enumerate([False, False, False, True, True, None])]
    source = tmp_path / "sampled.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "split.yaml"
    recipe.write_text(f"""
output_dir: {tmp_path / 'runs'}
steps:
  rm: {{stage: annotate, input: {source}, provider: verifiable, where: {{controversial: false}}}}
  judge: {{stage: annotate, input: {source}, provider: verifiable, where: {{controversial: true}}, where_rest: drop}}
""")
    assert main(["pipeline", str(recipe)]) == 0
    capsys.readouterr()
    assert main(["status", str(recipe)]) == 0
    assert f"split of {source}: rm 3, judge 2, in no branch 1 (of 6 rows)" in capsys.readouterr().out
    assert main(["status", str(recipe), "steps.judge.output_dir=" + str(tmp_path / "elsewhere")]) == 0
    assert "split of" not in capsys.readouterr().out  # a branch not done yet: nothing counted


def test_status_counts_each_split_apart_and_names_it_as_its_first_branch_reads_it(tmp_path, capsys):
    from align.cli import main

    def rows(label_of):
        return "".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": "q"}], "answer": "yes",
                                   "flag": label_of(i), "completions": [{"text": "yes", "is_reference": True}]})
                       + "\n" for i in range(4))

    (tmp_path / "one.jsonl").write_text(rows(lambda i: i < 1))
    (tmp_path / "sub").mkdir()
    (tmp_path / "two.jsonl").write_text(rows(lambda i: i < 3))
    recipe = tmp_path / "splits.yaml"
    recipe.write_text(f"""
output_dir: {tmp_path / 'runs'}
steps:
  a_yes: {{stage: annotate, input: {tmp_path / 'sub' / '..' / 'one.jsonl'}, provider: verifiable, where: {{flag: true}}}}
  a_no: {{stage: annotate, input: {tmp_path / 'one.jsonl'}, provider: verifiable, where: {{flag: false}}}}
  b_yes: {{stage: annotate, input: {tmp_path / 'two.jsonl'}, provider: verifiable, where: {{flag: true}}}}
  b_no: {{stage: annotate, input: {tmp_path / 'two.jsonl'}, provider: verifiable, where: {{flag: false}}}}
""")
    assert main(["pipeline", str(recipe)]) == 0
    capsys.readouterr()
    assert main(["status", str(recipe)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("split of")]
    assert lines == [f"split of {tmp_path / 'sub' / '..' / 'one.jsonl'}: a_yes 1, a_no 3, in no branch 0 (of 4 rows)",
                     f"split of {tmp_path / 'two.jsonl'}: b_yes 3, b_no 1, in no branch 0 (of 4 rows)"]
    assert main(["status", str(recipe), f"steps.a_yes.output_dir={tmp_path / 'not-yet'}"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("split of")]
    assert lines == [f"split of {tmp_path / 'two.jsonl'}: b_yes 3, b_no 1, in no branch 0 (of 4 rows)"]
    marker = tmp_path / "runs" / "a_yes" / "_COMPLETE.json"  # as a version that did not count what it left
    info = json.loads(marker.read_text())
    del info["summary"]["not_selected"]
    marker.write_text(json.dumps(info))
    assert main(["status", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("split of")] == lines and "a_yes          done" in out


def test_a_where_value_matches_a_field_as_yaml_wrote_it():
    """true is not 1 and the text "false" is not false, at run time too."""
    from align.stages.annotate import selected

    rows = [{"id": "a", "flag": True}, {"id": "b", "flag": 1}, {"id": "c", "flag": "false"}, {"id": "d", "flag": False},
            {"id": "e"}]
    assert [r["id"] for r in selected(rows, {"flag": True})] == ["a"]
    assert [r["id"] for r in selected(rows, {"flag": [False, None]})] == ["d", "e"]
    assert [r["id"] for r in selected(rows, {"flag": 1})] == ["b"]
    numbers = [{"id": "i", "level": 3}, {"id": "f", "level": 3.0}, {"id": "s", "level": "3"}]
    assert [r["id"] for r in selected(numbers, {"level": 3})] == ["i", "f"]  # pandas writes 3.0


def test_a_step_reading_its_own_output_is_refused():
    with pytest.raises(ConfigError, match=r"step 'pairs': @pairs names the step itself"):
        load_recipe(graph(pairs={"input": "@pairs/skipped.jsonl"}))
    with pytest.raises(ConfigError, match=r"step 'pairs': input=runs/g/pairs/x.jsonl is \(or lies inside\) the step's "
                                          r"own output"):
        load_recipe(graph(pairs={"input": "runs/g/pairs/x.jsonl"}))


def test_step_references_in_a_list_override():
    recipe = load_recipe(graph(), ["pairs.input=[@annotate_judge, @annotate_rm]"])
    assert recipe.config(recipe.step("pairs")).input == ["runs/g/annotate_judge", "runs/g/annotate_rm"]
