"""Rules of reading a recipe's steps that tests/test_step_graph.py and tests/test_recipe.py leave open.

A mutation check (mutmut) on align/recipe/checks.py, align/recipe/graph.py and
align/recipe/settings.py showed rules no test held: which key of a step is read (a dotted
one, one after a key not given, one after a file), how far the kind of rows is followed
through the steps that keep their input, which ``where:`` values get the quoting hint, each
key the reference pass and training must agree on, the settings of rounds, and how the
steps are ordered, named and given their configs. Each test states one such rule as a user
sees it; nothing runs, each test reads a recipe.
"""

from __future__ import annotations

import pytest

from align.config import ConfigError
from align.drivers import load_recipe

PAIRS_FILE = "@pairs/pairs.jsonl"


def steps(**changes) -> dict:
    """classify -> sample -> rm / judge (a split by label) -> pairs; a change of None removes a step."""
    base = {
        "classify": {"stage": "annotate", "input": "p.jsonl", "provider": "classifier", "model": "judge"},
        "sample": {"stage": "sample", "prompts": "@classify", "sampler": {"model": "m", "backend": "transformers"}},
        "rm": {"stage": "annotate", "input": "@sample", "provider": "verifiable", "where": {"controversial": False}},
        "judge": {"stage": "annotate", "input": "@sample", "provider": "verifiable",
                  "where": {"controversial": [True, None]}},
        "pairs": {"stage": "pairs", "input": ["@rm", "@judge"]},
    }
    for name, keys in changes.items():
        if keys is None:
            base.pop(name)
        else:
            base[name] = {**base.get(name, {}), **keys}
    return {"output_dir": "runs/g", "steps": base}


def refused(data, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(data)


def names(data) -> list[str]:
    return [step.name for step in load_recipe(data)]


# --------------------------------------------------------------------------- what a key reads


def test_a_dotted_key_reads_the_kind_its_stage_says():
    """sample's sampler.model reads a model: the pairs a step writes are refused there."""
    refused(steps(sample2={"stage": "sample", "prompts": "@classify", "sampler": {"model": PAIRS_FILE}}),
            r"step 'sample2': sampler.model=runs/g/pairs/pairs.jsonl is step 'pairs''s output \(pairs: pairs\), but "
            r"sampler.model reads model$")


def test_a_key_after_one_not_given_is_still_read():
    """sft without input: its model_name_or_path (read after input) naming samples is refused."""
    refused(steps(sft={"stage": "sft", "model_name_or_path": "@sample"}),
            r"step 'sft': model_name_or_path=runs/g/sample is step 'sample''s output \(sample: samples\), but "
            r"model_name_or_path reads model \(the base model\)")


def test_a_value_after_a_file_is_still_read():
    """A list of inputs whose first is a file no step writes: the step output after it is still checked."""
    refused(steps(pairs={"input": ["scores.jsonl", "@sample"]}),
            r"step 'pairs': input=runs/g/sample is step 'sample''s output \(sample: samples\), but input reads "
            r"scored samples")


def test_a_step_that_keeps_its_input_writes_the_kind_it_read():
    """A split of scored samples holds scored samples: a logprobs step reading it is refused, naming them."""
    refused(steps(part={"stage": "split", "input": "@rm"},
                  logprobs={"stage": "logprobs", "input": "@part", "model_name_or_path": "m"}),
            r"step 'logprobs': input=runs/g/part is step 'part''s output \(split: scored samples\), but input reads "
            r"pairs")


def test_the_kind_is_followed_through_several_steps_that_keep_it():
    refused(steps(part={"stage": "split", "input": "@rm"}, part2={"stage": "split", "input": "@part"},
                  logprobs={"stage": "logprobs", "input": "@part2", "model_name_or_path": "m"}),
            r"input=runs/g/part2 is step 'part2''s output \(split: scored samples\), but input reads pairs")


def test_the_classifier_writes_labelled_prompts():
    refused(steps(logprobs={"stage": "logprobs", "input": "@classify", "model_name_or_path": "m"}),
            r"input=runs/g/classify is step 'classify''s output \(annotate: labelled prompts\), but input reads pairs")


@pytest.mark.parametrize("source", ["p.jsonl", ["@rm", "@judge"]])
def test_rows_of_unknown_kind_are_not_checked_before_the_run(source):
    """A split of a file, or of two outputs, holds rows whose kind is known only when they are read."""
    data = steps(part={"stage": "split", "input": source},
                 logprobs={"stage": "logprobs", "input": "@part", "model_name_or_path": "m"})
    assert names(data)[-1] == "logprobs"


def test_a_file_inside_a_two_kind_output_is_read_as_its_data_file():
    data = steps(logprobs={"stage": "logprobs", "input": PAIRS_FILE, "model_name_or_path": "m"})
    assert names(data)[-1] == "logprobs"


def test_the_kept_rows_of_decontaminate_are_named_by_their_file():
    refused(steps(clean={"stage": "decontaminate", "input": "@rm"}, pairs={"input": "@clean"}),
            r"step 'pairs': input=runs/g/clean is step 'clean''s output directory, which holds more than one kind of "
            r"row; name its data file: input=@clean/kept.jsonl")


# --------------------------------------------------------------------------- splits by label


@pytest.mark.parametrize("value", ["true", "false", "null", "None"])
def test_a_quoted_true_false_or_null_gets_the_hint_to_unquote_it(value):
    refused(steps(rm={"where": {"controversial": value}}),
            rf"where.controversial: '{value}' is not a value step 'classify' writes in 'controversial'; it writes "
            r"true, false, null \(quoted, true/false/null are text: write them without quotes\)")


def test_other_text_gets_no_quoting_hint():
    with pytest.raises(ConfigError) as info:
        load_recipe(steps(rm={"where": {"controversial": "maybe"}}))
    assert str(info.value).endswith("where.controversial: 'maybe' is not a value step 'classify' writes in "
                                    "'controversial'; it writes true, false, null")


def test_every_value_of_a_where_list_is_checked():
    refused(steps(judge={"where": {"controversial": [True, "null"]}}),
            r"step 'judge': where.controversial: 'null' is not a value step 'classify' writes")


def test_where_rest_drop_on_any_branch_leaves_rows_out_on_purpose():
    data = steps(rm={"where": {"controversial": False}, "where_rest": "drop"},
                 judge={"where": {"controversial": True}})
    assert names(data)[-1] == "pairs"


def test_where_rest_other_than_drop_still_refuses_the_rows_left_out():
    refused(steps(judge={"where": {"controversial": True}, "where_rest": "refuse"}),
            r"no step selects the rows with controversial: null")


def test_a_step_selecting_by_two_fields_is_no_branch_of_a_split_by_one():
    """rm alone splits classify's rows by controversial; judge, which also selects by language, takes only
    part of the rows it names, so the labels rm leaves out are left out."""
    refused(steps(judge={"where": {"controversial": [True, None], "language": "en"}}),
            r"steps \['rm'\] split 'classify''s rows by 'controversial', but no step selects the rows with "
            r"controversial: true, null")


def test_two_splits_of_two_classifiers_are_checked_apart():
    """Each classifier's rows are split by its own branches: two branches of different splits do not
    take one label twice, and each split must cover its own labels."""
    classify2 = {"stage": "annotate", "input": "q.jsonl", "provider": "classifier", "model": "judge"}
    sample2 = {"stage": "sample", "prompts": "@classify2", "sampler": {"model": "m", "backend": "transformers"}}
    data = steps(classify2=classify2, sample2=sample2,
                 rm2={"stage": "annotate", "input": "@sample2", "provider": "verifiable",
                      "where": {"controversial": [True, False, None]}})
    assert "rm2" in names(data)
    data["steps"]["rm2"]["where"] = {"controversial": True}
    refused(data, r"steps \['rm2'\] split 'classify2''s rows by 'controversial', but no step selects the rows with "
                  r"controversial: false, null")


def test_labels_of_rows_from_a_step_and_a_file_are_not_checked_before_the_run():
    """A split of classify's rows and a file: what the file's rows hold is known only at the run."""
    data = steps(part={"stage": "split", "input": ["@classify", "more.jsonl"]}, sample={"prompts": "@part"},
                 rm={"where": {"controversial": "maybe"}})
    assert "rm" in names(data)


def test_labels_pass_through_a_split_of_the_labelled_rows():
    refused(steps(part={"stage": "split", "input": "@classify"}, sample={"prompts": "@part"},
                  rm={"where": {"controversial": "maybe"}}),
            r"where.controversial: 'maybe' is not a value step 'classify' writes")


def test_a_field_no_step_writes_does_not_stop_the_check_of_the_next_field():
    refused(steps(rm={"where": {"language": "en", "controversial": "maybe"}}),
            r"step 'rm': where.controversial: 'maybe' is not a value step 'classify' writes")


def test_labels_through_a_step_that_keeps_no_input_fields_are_not_known():
    """A split of pair rows and a file: pairs keep no field of the rows they read, so no label is known."""
    data = steps(part={"stage": "split", "input": [PAIRS_FILE, "x.jsonl"]},
                 rm2={"stage": "annotate", "input": "@part", "provider": "verifiable",
                      "where": {"controversial": "maybe"}})
    assert names(data)[-1] == "rm2"


def test_a_where_that_is_not_a_mapping_is_left_to_the_steps_config():
    recipe = load_recipe(steps(rm={"where": ["controversial"]}, judge=None, pairs={"input": "@rm"}))
    with pytest.raises(ConfigError, match=r"rm.where: expected a mapping, got \['controversial'\]"):
        recipe.config(recipe.step("rm"))


def test_a_list_where_one_input_is_meant_is_left_to_the_steps_config():
    """Reading the recipe does not stop on it; building the step's config names the key."""
    recipe = load_recipe(steps(rm={"input": ["@sample", "x.jsonl"], "where": {"controversial": "maybe"}}, judge=None,
                               pairs={"input": "@rm"}))
    with pytest.raises(ConfigError, match=r"step 'rm' \(annotate\): rm.input: expected a string"):
        recipe.config(recipe.step("rm"))


# --------------------------------------------------------------------------- the pass and training


def pass_and_training(logprobs: dict, train: dict, defaults: dict | None = None) -> dict:
    data = steps(logprobs={"stage": "logprobs", "input": PAIRS_FILE, "model_name_or_path": "m", **logprobs},
                 train={"stage": "train", "input": "@logprobs", "model_name_or_path": "m", **train})
    if defaults:
        data["defaults"] = defaults
    return data


@pytest.mark.parametrize(("key", "scored", "trained"), [
    ("max_length", 2048, 4096),
    ("chat_format", "apertus", "llama3"),
    ("chat_date", "2025-09-01", "2026-01-01"),
    ("enable_thinking", True, False),
    ("truncated", "exclude", "train_without_end"),
    ("over_max_length", "exclude", "cut"),
])
def test_each_key_the_pass_and_training_share_must_agree(key, scored, trained):
    refused(pass_and_training({key: scored}, {key: trained}),
            rf"steps 'logprobs' and 'train': {key} is {scored!r} in the reference pass and {trained!r} in training")


def test_a_key_given_in_one_step_agrees_with_the_same_default_in_the_other():
    """train leaves max_length out: its declared default (4096) is what the pass must match."""
    assert names(pass_and_training({"max_length": 4096}, {}))[-1] == "train"
    refused(pass_and_training({"max_length": 2048}, {}),
            r"max_length is 2048 in the reference pass and 4096 in training")


def test_a_key_from_defaults_reaches_both_steps():
    assert names(pass_and_training({"max_length": 2048}, {}, defaults={"max_length": 2048}))[-1] == "train"
    refused(pass_and_training({}, {"max_length": 1024}, defaults={"max_length": 2048}),
            r"max_length is 2048 in the reference pass and 1024 in training")


def test_every_train_step_is_checked_not_only_the_first():
    """The first train step reads pairs (no pass to agree with), the second a pass that cut rows apart."""
    data = pass_and_training({"max_length": 2048}, {"max_length": 4096})
    data["steps"] = {"dpo": {"stage": "train", "input": PAIRS_FILE, "model_name_or_path": "m", "reference": "model"},
                     **data["steps"]}
    refused(data, r"steps 'logprobs' and 'train': max_length is 2048")


def test_training_on_pairs_has_no_pass_to_agree_with():
    data = steps(train={"stage": "train", "input": PAIRS_FILE, "model_name_or_path": "m", "reference": "model",
                        "max_length": 1024})
    assert names(data)[-1] == "train"


def test_a_list_where_the_trainer_reads_one_input_is_left_to_the_steps_config():
    data = pass_and_training({}, {"input": ["@logprobs", "more.jsonl"]})
    recipe = load_recipe(data)
    with pytest.raises(ConfigError, match=r"train.input: expected a string, got \['runs/g/logprobs', 'more.jsonl'\]"):
        recipe.config(recipe.step("train"))


# --------------------------------------------------------------------------- rounds and recipe shapes


def sections(**top) -> dict:
    return {"sample": {"prompts": "p.jsonl", "sampler": {"model": "m"}}, "annotate": {"provider": "verifiable"},
            "pairs": {}, "output_dir": "runs/s", **top}


def test_steps_and_sections_in_one_recipe_are_refused():
    data = steps()
    data["pairs"] = {"seed": 1}
    refused(data, r"steps and the sections \['pairs'\]: a recipe is one or the other")


@pytest.mark.parametrize(("key", "value"), [("reference", "previous"), ("round_prompts", "all"),
                                            ("initial_policy", "m"), ("policy_step", "train")])
def test_a_setting_of_rounds_without_rounds_is_refused(key, value):
    refused({**steps(), key: value}, rf"{key}: a setting of rounds; set rounds: K too")


def test_one_round_is_allowed():
    data = {"output_dir": "runs/r", "rounds": 1, "reference": "previous", "initial_policy": "m", "steps": {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
        "train": {"stage": "train", "input": "x.jsonl", "model_name_or_path": "@policy"}}}
    assert names(data) == ["round-1.sample", "round-1.train"]


@pytest.mark.parametrize("value", [None, "some"])
def test_sections_with_rounds_need_round_prompts_all_or_split(value):
    data = {**sections(), "rounds": 2, "reference": "previous", "initial_policy": "m"}
    if value is not None:
        data["round_prompts"] = value
    refused(data, rf"round_prompts: {value!r}; with rounds, set round_prompts: all")


def test_sections_with_rounds_have_no_policy_step():
    data = {**sections(), "rounds": 2, "reference": "previous", "round_prompts": "split", "initial_policy": "m",
            "policy_step": "train"}
    refused(data, r"policy_step: a setting of a step graph")



# --------------------------------------------------------------------------- references and order


def chain(**changes) -> dict:
    """sample -> annotate -> pairs (paths only)."""
    base = {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m", "backend": "transformers"}},
        "annotate": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
        "pairs": {"stage": "pairs", "input": "@annotate"},
    }
    for name, keys in changes.items():
        base[name] = {**base.get(name, {}), **keys}
    return {"output_dir": "runs/g", "steps": base}


@pytest.mark.parametrize(("reader", "where"), [
    ({"pairs": {"input": ["x.jsonl", "@annotate"]}}, r"step 'pairs'.input\[1\]"),
    ({"pairs": {"input": "x.jsonl"}, "evaluate": {"stage": "evaluate", "prompts": "h.jsonl", "baseline": "a",
                                                  "policies": [{"name": "a", "model": "@annotate"}]}},
     r"step 'evaluate'.policies\[0\].model"),
])
def test_a_reference_to_a_step_without_an_output_dir_names_where_it_is(reader, where):
    data = chain(annotate={"output_dir": None}, **reader)
    refused(data, rf"{where}: '@annotate' names step 'annotate', which writes no output_dir of its own \(set one\)")


def test_a_reference_to_a_file_in_a_step_output_resolves_to_that_file():
    recipe = load_recipe(chain(pairs={"input": ["@annotate/part-1.jsonl"]}))
    assert recipe.config(recipe.step("pairs")).input == ["runs/g/annotate/part-1.jsonl"]
    assert recipe.step("pairs").needs == ("annotate",)


def test_a_step_keeping_its_cache_inside_its_own_output_does_not_wait_for_itself():
    data = steps(logprobs={"stage": "logprobs", "input": PAIRS_FILE, "model_name_or_path": "m",
                           "cache_dir": "runs/g/logprobs/cache"})
    assert load_recipe(data).step("logprobs").needs == ("pairs",)


def test_an_initial_policy_naming_no_step_lists_the_steps():
    data = {"output_dir": "runs/r", "rounds": 2, "reference": "previous", "initial_policy": "@nope", "steps": {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
        "train": {"stage": "train", "input": "x.jsonl", "model_name_or_path": "@policy"}}}
    refused(data, r"^initial_policy: '@nope' names no earlier step \(earlier steps: \['sample', 'train'\]\)$")


def test_a_reference_is_the_output_dir_as_written():
    recipe = load_recipe(chain(annotate={"output_dir": "./runs/scores/"}))
    assert recipe.config(recipe.step("pairs")).input == "./runs/scores/"


def test_a_cycle_is_named_without_the_steps_that_only_wait_on_it():
    data = {"output_dir": "runs/g", "steps": {"a": {"stage": "pairs", "input": "@b"},
                                             "b": {"stage": "pairs", "input": "@c"},
                                             "c": {"stage": "pairs", "input": "@b"}}}
    refused(data, r"steps read each other's outputs in a cycle \(b reads c reads b\)")


def test_a_step_named_in_no_recipe_is_refused_listing_the_steps():
    recipe = load_recipe(chain())
    with pytest.raises(ConfigError, match=r"^no step 'nope' in the recipe; steps: \['sample', 'annotate', 'pairs'\]$"):
        recipe.step("nope")


def test_a_multi_line_text_is_not_a_path_into_a_steps_output():
    """A value that starts like a step's output but holds a newline is text: the step does not read it."""
    recipe = load_recipe(chain(pairs={"input": "x.jsonl", "chat_format": "runs/g/sample/\nsomething"}))
    assert recipe.step("pairs").needs == ()


def test_a_value_longer_than_a_path_is_not_read_as_one():
    """Up to 4096 characters a value may name a step's output (a path's limit); one more and it is text."""
    head = "runs/g/sample/"
    at_limit = head + "x" * (4096 - len(head))
    recipe = load_recipe(chain(pairs={"input": "x.jsonl", "chat_format": at_limit}))
    assert recipe.step("pairs").needs == ("sample",)  # the boundary at equality
    recipe = load_recipe(chain(pairs={"input": "x.jsonl", "chat_format": at_limit + "x"}))
    assert recipe.step("pairs").needs == ()


def test_an_empty_value_is_not_the_working_directory(tmp_path, monkeypatch):
    """A step writing the working directory is not read by a step whose value is empty."""
    monkeypatch.chdir(tmp_path)
    outside = tmp_path.parent
    data = {"steps": {"sample": {"stage": "sample", "prompts": str(outside / "p.jsonl"),
                                 "sampler": {"model": str(outside / "m")}, "output_dir": "."},
                      "pairs": {"stage": "pairs", "input": str(outside / "x.jsonl"), "chat_format": "",
                                "output_dir": str(outside / "pairs")}}}
    recipe = load_recipe(data)
    assert recipe.step("pairs").needs == ()


def test_an_output_dir_inside_the_output_of_its_reader_is_refused_as_such_not_as_a_cycle():
    """b reads a, and a writes inside b's directory: its output_dir is where it writes, not what it reads."""
    data = {"output_dir": "runs/g", "steps": {
        "a": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}, "output_dir": "runs/g/b/inner"},
        "b": {"stage": "annotate", "input": "@a", "provider": "verifiable"}}}
    refused(data, r"^step 'a' writes runs/g/b/inner, inside \(or around\) step 'b''s output")


def test_an_output_inside_another_is_refused_whatever_the_steps_are_named():
    """The step named box writes inside the directory box that step outer writes."""
    data = {"steps": {
        "outer": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}, "output_dir": "box"},
        "box": {"stage": "annotate", "input": "s.jsonl", "provider": "verifiable", "output_dir": "box/in"}}}
    refused(data, r"^step 'box' writes box/in, inside \(or around\) step 'outer''s output")


def test_a_step_without_an_output_dir_does_not_end_the_check_of_the_others():
    data = {"output_dir": "runs/g", "steps": {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "m"}, "output_dir": None},
        "a": {"stage": "annotate", "input": "s.jsonl", "provider": "verifiable", "output_dir": "runs/x"},
        "b": {"stage": "annotate", "input": "s.jsonl", "provider": "verifiable", "output_dir": "runs/x"}}}
    refused(data, r"^steps 'a' and 'b' both write runs/x: give each its own output_dir$")


def test_a_round_step_named_none_owns_its_output():
    """A step named None (text in YAML) is round-K.None: it owns its output like any other step."""
    data = {"output_dir": "runs/r", "rounds": 2, "reference": "previous", "initial_policy": "m", "steps": {
        "None": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
        "scores": {"stage": "annotate", "input": "@None", "provider": "verifiable"},
        "train": {"stage": "train", "input": "x.jsonl", "model_name_or_path": "@policy"}}}
    recipe = load_recipe(data)
    assert recipe.step("round-2.scores").needs == ("round-2.None",)


# --------------------------------------------------------------------------- an evaluation of three jobs


def evaluation(**keys) -> dict:
    data = chain()
    data["steps"]["evaluate"] = {"stage": "evaluate", "prompts": "@sample", "baseline": "a", "kl": True,
                                 "kl_sharding": "zero3", "policies": [{"name": "a", "model": "m"}], **keys}
    return data


def test_the_kl_and_report_jobs_each_wait_for_the_one_before():
    recipe = load_recipe(evaluation())
    jobs = [(s.name, s.needs, s.base, s.what) for s in recipe if s.base == "evaluate"]
    assert jobs == [
        ("evaluate", ("sample",), "evaluate", ""),
        ("evaluate.kl", ("sample", "evaluate"), "evaluate",
         "KL of every policy, the models partitioned over the launch's ranks"),
        ("evaluate.report", ("sample", "evaluate.kl"), "evaluate", "the report, once the KL step is done")]
    assert [recipe.config(recipe.step(name)).kl_only for name in ("evaluate", "evaluate.kl", "evaluate.report")] == \
        [False, True, False]


@pytest.mark.parametrize("keys", [{"kl": False}, {"kl_only": True}, {"kl_sharding": "replicate"}])
def test_an_evaluation_without_partitioned_kl_is_one_job(keys):
    assert [s.name for s in load_recipe(evaluation(**keys)) if s.base == "evaluate"] == ["evaluate"]


def test_each_round_has_its_own_kl_and_report_jobs():
    data = {"output_dir": "runs/r", "rounds": 2, "reference": "previous", "initial_policy": "m", "steps": {
        "evaluate": {"stage": "evaluate", "prompts": "h.jsonl", "baseline": "a", "kl": True, "kl_sharding": "zero3",
                     "policies": [{"name": "a", "model": "@policy"}]},
        "train": {"stage": "train", "input": "x.jsonl", "model_name_or_path": "@policy"}}}
    recipe = load_recipe(data)
    assert [(s.name, s.round, s.phase, s.job_kind()) for s in recipe if s.base == "evaluate"] == [
        ("round-1.evaluate", 1, None, "array"), ("round-1.evaluate.kl", 1, "kl", "launch"),
        ("round-1.evaluate.report", 1, "report", "single"), ("round-2.evaluate", 2, None, "array"),
        ("round-2.evaluate.kl", 2, "kl", "launch"), ("round-2.evaluate.report", 2, "report", "single")]


# --------------------------------------------------------------------------- defaults and configs


def test_a_nested_default_naming_a_steps_own_work_is_refused_at_any_depth():
    data = chain()
    data["defaults"] = {"sampler": {"engine_kwargs": {"tokenizer": "t"}}}
    refused(data, r"defaults.sampler: 'tokenizer' names one step's own work; set it in each step that needs it")


def test_a_default_under_its_old_name_is_refused_naming_the_new_one():
    data = chain()
    data["defaults"] = {"date": "2026-01-01"}
    refused(data, r"^defaults: keys \['date'\] are known to no step in this recipe. Did you mean 'chat_date'\?")


def test_an_identity_default_names_the_steps_of_a_round_by_their_recipe_names():
    data = {"output_dir": "runs/r", "rounds": 2, "reference": "previous", "initial_policy": "m",
            "defaults": {"model": "x"}, "steps": {
                "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
                "scores": {"stage": "annotate", "input": "@sample", "provider": "verifiable"},
                "train": {"stage": "train", "input": "x.jsonl", "model_name_or_path": "@policy"}}}
    refused(data, r"defaults: 'model' names one step's own work \(its model, data, output or batch size\) and would "
                  r"reach \['sample', 'scores'\]; set it")


def test_a_round_steps_config_error_names_the_step_and_its_key_as_the_recipe_has_it():
    data = {"output_dir": "runs/r", "rounds": 2, "reference": "previous", "initial_policy": "m", "steps": {
        "sample": {"stage": "sample", "prompts": "p.jsonl", "sampler": {"model": "@policy"}},
        "scores": {"stage": "annotate", "input": "@sample", "provider": "verifiable", "sead": 1},
        "train": {"stage": "train", "input": "x.jsonl", "model_name_or_path": "@policy"}}}
    recipe = load_recipe(data)
    with pytest.raises(ConfigError, match=r"^step 'round-2.scores' \(annotate\): unknown key scores.'sead'"):
        recipe.config(recipe.step("round-2.scores"))


@pytest.mark.parametrize("devices", ["check", "defer"])
def test_a_step_named_apart_from_its_stage_is_named_with_its_stage(devices):
    """Where the steps run and where they are only read (a login node) alike."""
    recipe = load_recipe(chain(scores={"stage": "annotate", "input": "@sample", "provider": "verifiable",
                                       "sead": 1}), devices=devices)
    with pytest.raises(ConfigError, match=r"^step 'scores' \(annotate\): unknown key scores.'sead'"):
        recipe.config(recipe.step("scores"))


def test_a_section_error_names_the_section():
    recipe = load_recipe({"output_dir": "runs/s", "pairs": {"input": "x.jsonl", "sead": 1}})
    with pytest.raises(ConfigError, match=r"^pipeline section 'pairs': unknown key pairs.'sead'"):
        recipe.config(recipe.step("pairs"))


def test_a_stage_file_error_names_the_key_as_the_file_has_it(tmp_path):
    path = tmp_path / "pairs.yaml"
    path.write_text("input: x.jsonl\nsead: 1\n")
    recipe = load_recipe(path, stage="pairs")
    with pytest.raises(ConfigError, match=r"^unknown key 'sead'"):
        recipe.config(recipe.steps[0])


def test_a_recipe_config_is_built_over_its_defaults():
    data = chain()
    data["defaults"] = {"seed": 11}
    recipe = load_recipe(data)
    assert recipe.config(recipe.step("pairs")).seed == 11
