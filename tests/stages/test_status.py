"""`align status`: each step's state and why, read from its output without running anything.

A chain of the stages that load no model (verifiable annotation, then pairs) is run for real,
then changed in the ways a team changes a run: a setting, an input row, an edited output, an
array with shards left, a trainer with checkpoints; each time the printed table (and the
report ``align submit`` resubmits from) is compared with what it must say, word for word.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from stage_helpers import run_cli

from align.manifests.status import StepState, missing_shards, progress, round_state, shard_list, step_state
from align.stage_table import command_module as stage_module
from align.drivers.args import recipe_from_args

ROWS = [{"id": f"a{i}", "messages": [{"role": "user", "content": f"Is {i} even?"}], "answer": "yes",
         "completions": [{"text": t, "num_tokens": 1, "finish_reason": "stop", "is_reference": True, "source": "p"}
                         for t in ("yes", "no", "yes", "no")]} for i in range(6)]


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def chain(tmp_path, monkeypatch):
    """A workspace with in.jsonl and r.yaml (annotate → pairs), not yet run."""
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "in.jsonl", ROWS)
    recipe = {"output_dir": "runs", "steps": {
        "annotate": {"stage": "annotate", "input": "in.jsonl", "provider": "verifiable"},
        "pairs": {"stage": "pairs", "input": "@annotate"}}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return tmp_path


def status(*overrides: str) -> tuple[str, dict]:
    module = stage_module("status")
    from contextlib import redirect_stdout
    from io import StringIO

    buffer = StringIO()
    with redirect_stdout(buffer):
        report = module.run(module.config_from_args(["r.yaml", *overrides]))
    return buffer.getvalue(), report


def test_a_recipe_not_yet_run_is_not_started_and_says_how_to_run_it(chain):
    printed, report = status()
    assert printed == (
        "annotate       not started                    runs/annotate\n"
        "pairs          not started                    runs/pairs\n"
        "To run what is not done: align pipeline r.yaml (here), or align submit r.yaml (on the cluster: only the "
        "missing steps and shards)\n")
    assert report == {
        "annotate": {"state": "not started", "reasons": [], "output_dir": "runs/annotate", "stage": "annotate",
                     "round": None},
        "pairs": {"state": "not started", "reasons": [], "output_dir": "runs/pairs", "stage": "pairs", "round": None}}


def test_a_finished_recipe_is_done_and_a_changed_setting_makes_it_and_what_follows_stale(chain):
    run_cli(["pipeline", "r.yaml"])
    printed, report = status()
    assert printed == ("annotate       done                           runs/annotate\n"
                       "pairs          done                           runs/pairs\n")
    printed, report = status("annotate.model_batch_size=2")
    assert printed == (
        "annotate       stale                          runs/annotate\n"
        "                 annotate.model_batch_size: 8 → 2\n"
        "pairs          stale                          runs/pairs\n"
        "                 pairs.input (runs/annotate): made from other settings or inputs (the annotate stage's "
        "manifest changed)\n")
    assert report["pairs"]["reasons"] == ["pairs.input (runs/annotate): made from other settings or inputs (the "
                                          "annotate stage's manifest changed)"]


def test_an_edited_output_and_a_changed_input_row_are_named(chain):
    run_cli(["pipeline", "r.yaml"])
    pairs = chain / "runs" / "pairs" / "pairs.jsonl"
    pairs.write_text(pairs.read_text() + "\n")
    size = pairs.stat().st_size
    _, report = status()
    assert report["annotate"]["state"] == "done"
    assert report["pairs"]["state"] == "stale"
    assert report["pairs"]["reasons"] == [f"changed since it was made: pairs.jsonl ({size - 1} bytes when made, "
                                          f"{size} now)"]
    write_rows(chain / "in.jsonl", [{**ROWS[0], "answer": "no"}, *ROWS[1:]])
    _, report = status()
    assert report["annotate"] == {"state": "stale", "reasons": ["annotate.input (in.jsonl): content changed (1 row "
                                                                "differs)"], "output_dir": "runs/annotate",
                                  "stage": "annotate", "round": None}


def test_an_array_with_shards_left_is_partial_and_names_them(chain):
    for shard in (1, 3):
        run_cli(["annotate", "r.yaml", f"shard_index={shard}", "num_shards=5"])
    printed, report = status("annotate.num_shards=5")
    assert report["annotate"]["state"] == "partial"
    assert report["annotate"]["reasons"] == ["2 of 5 shards done; shards 0,2,4 are missing"]
    assert "To run what is not done" in printed
    printed, report = status("annotate.num_shards=5", "annotate.model_batch_size=3")
    assert report["annotate"]["state"] == "partial, from other settings"
    assert report["annotate"]["reasons"] == ["2 of 5 shards done; shards 0,2,4 are missing",
                                             "annotate.model_batch_size: 8 → 3"]
    # what align submit resubmits: the missing shards of the count the output is written with
    for overrides in (["annotate.num_shards=5"], ["annotate.num_shards=5", "annotate.model_batch_size=3"]):
        recipe = recipe_from_args("status", ["r.yaml", *overrides])
        assert step_state("annotate", recipe.config(recipe.step("annotate")), {}).shards == (5, [0, 2, 4])


def test_an_output_both_edited_and_from_other_settings_names_the_settings(chain):
    run_cli(["pipeline", "r.yaml"])
    pairs = chain / "runs" / "pairs" / "pairs.jsonl"
    pairs.write_text(pairs.read_text() + "\n")
    _, report = status("pairs.seed=4")
    assert report["pairs"]["reasons"] == ["pairs.seed: 0 → 4"]


def test_a_keyed_output_is_checked_when_its_step_runs(chain):
    (chain / "r.yaml").write_text(yaml.safe_dump({"output_dir": "runs", "steps": {
        "logprobs": {"stage": "logprobs", "input": "in.jsonl", "model_name_or_path": "org/model",
                     "output_dir": None, "cache_dir": "cache/ref"}}}))
    printed, report = status()
    assert printed.splitlines() == [
        "logprobs       keyed                          cache/ref",
        "                 output under cache_dir, named by its cache key (checked when the step runs)"]
    assert report["logprobs"]["output_dir"] == "cache/ref"


@pytest.mark.parametrize("states,line", [
    ({"annotate": "done", "pairs": "done"}, False),
    ({"annotate": "done", "pairs": "stale"}, False),  # stale: align submit refuses it until overwrite=true
    ({"annotate": "done", "pairs": "partial"}, True),
    ({"annotate": "partial, from other settings", "pairs": "done"}, True),
    ({"annotate": "done", "pairs": "not started"}, True),
])
def test_the_way_forward_is_printed_while_something_is_left_to_run(chain, monkeypatch, states, line):
    from align.drivers import status as status_module

    monkeypatch.setattr(status_module, "step_state", lambda stage, config, outputs: StepState(states[stage]))
    printed, _ = status()
    assert ("To run what is not done" in printed) == line


def test_each_rounds_line_reads_its_own_steps(chain, monkeypatch):
    from align.drivers import status as status_module

    write_rows(chain / "p.jsonl", [{"id": "p1", "messages": [{"role": "user", "content": "hi"}]}])
    (chain / "r.yaml").write_text(ROUNDS)
    states = iter(["done"] * 5 + ["done", "partial"] + ["not started"] * 3)
    monkeypatch.setattr(status_module, "step_state", lambda stage, config, outputs: StepState(next(states)))
    printed, report = status()
    assert printed.splitlines()[10:12] == ["round-1          done",
                                           "round-2          in progress                    resumes at round-2.annotate"]
    assert report["round-2"] == {"state": "in progress", "reasons": ["resumes at round-2.annotate"]}


# --------------------------------------------------------------------------- the parts, case by case


def test_missing_shards_count_the_done_markers_of_the_largest_shard_count(tmp_path):
    for name in ("shard-00000-of-00004.jsonl", "shard-00001-of-00004.done.json", "shard-00003-of-00004.done.json",
                 "shard-00000-of-00002.done.json", "notes.txt"):
        (tmp_path / name).write_text("")
    assert missing_shards(tmp_path) == (4, [0, 2])
    assert missing_shards(tmp_path / "nowhere") is None
    (tmp_path / "empty").mkdir()
    assert missing_shards(tmp_path / "empty") is None


def test_progress_says_how_far_a_started_step_got(tmp_path):
    jobs, trained, started = tmp_path / "jobs", tmp_path / "trained", tmp_path / "started"
    for d in (jobs, trained, started):
        d.mkdir()
    for i in range(3):
        (jobs / f"shard-{i:05d}-of-00003.done.json").write_text("")
    assert progress(jobs) == ("all 3 shards done, not yet marked complete (the next run of the step marks it)",
                              (3, []))
    (jobs / "shard-00001-of-00003.done.json").unlink()
    assert progress(jobs) == ("2 of 3 shards done; shards 1 are missing", (3, [1]))
    for name in ("checkpoint-4", "checkpoint-12", "checkpoint-9", "checkpoint-final", "runs"):
        (trained / name).mkdir()
    assert progress(trained) == ("last checkpoint: checkpoint-12 (the step resumes from it)", None)
    (started / "_MANIFEST.json").write_text("{}")
    assert progress(started) == ("started, nothing finished yet", None)


@pytest.mark.parametrize("indices,text", [([0, 1, 2, 5], "0-2,5"), ([0, 2, 3], "0,2-3"), ([7], "7"), ([], ""),
                                          ([1, 3, 4, 5, 9, 10], "1,3-5,9-10")])
def test_shard_lists_name_each_run_of_shards(indices, text):
    assert shard_list(indices) == text


@pytest.mark.parametrize("states,expected", [
    ([("r.sample", "done"), ("r.train", "done")], ("done", [])),
    ([("r.sample", "not started"), ("r.train", "not started")], ("not started", [])),
    ([("r.sample", "done"), ("r.pairs", "stale"), ("r.train", "partial, from other settings"),
      ("r.eval", "not started")], ("stale", ["made from other settings or inputs: r.pairs, r.train"])),
    ([("r.sample", "done"), ("r.pairs", "partial"), ("r.train", "not started")],
     ("in progress", ["resumes at r.pairs"])),
    ([("r.sample", "done"), ("r.pairs", "not started")], ("in progress", ["resumes at r.pairs"])),
])
def test_a_rounds_state_follows_its_steps(states, expected):
    assert round_state(states) == expected


def test_only_outputs_made_from_something_else_are_redone():
    redo = {s: StepState(s).needs_redo for s in ("done", "stale", "partial", "partial, from other settings",
                                                   "not started", "keyed")}
    assert redo == {"done": False, "stale": True, "partial": False, "partial, from other settings": True,
                    "not started": False, "keyed": False}


ROUNDS = """\
output_dir: runs
rounds: 2
reference: previous
initial_policy: org/base
steps:
  sample: {stage: sample, prompts: p.jsonl, sampler: {model: "@policy", backend: transformers, device: cpu}}
  annotate: {stage: annotate, input: "@sample", provider: verifiable}
  pairs: {stage: pairs, input: "@annotate"}
  logprobs: {stage: logprobs, input: "@pairs/pairs.jsonl", model_name_or_path: "@reference"}
  train: {stage: train, input: "@logprobs", model_name_or_path: "@policy"}
"""


def test_each_round_gets_a_line_after_its_steps(chain):
    write_rows(chain / "p.jsonl", [{"id": "p1", "messages": [{"role": "user", "content": "hi"}]}])
    (chain / "r.yaml").write_text(ROUNDS)
    printed, report = status()
    lines = printed.splitlines()
    assert lines[0] == "round-1.sample   not started                    runs/round-1/sample"
    assert lines[5] == "round-2.sample   not started                    runs/round-2/sample"
    assert lines[10:12] == ["round-1          not started", "round-2          not started"]
    assert report["round-2"] == {"state": "not started", "reasons": []}
    assert report["round-2.train"]["round"] == 2 and report["round-1.pairs"]["stage"] == "pairs"


def test_status_without_a_recipe_says_how_to_call_it(chain):
    from align.errors import ConfigError

    module = stage_module("status")
    with pytest.raises(ConfigError, match=r"^give the recipe: align status RECIPE.yaml \[key=value \.\.\.\]$"):
        module.config_from_args(["annotate.seed=1"])


def test_an_edited_job_output_is_redone_and_so_is_what_reads_it(chain):
    for shard in range(6):  # an array of 6 tasks; the last marks the output complete
        run_cli(["annotate", "r.yaml", f"shard_index={shard}", "num_shards=6"])
    run_cli(["pipeline", "r.yaml", "annotate.num_shards=6"])
    shards = sorted((chain / "runs" / "annotate").glob("shard-*.jsonl"))
    assert len(shards) == 6
    for path in shards:
        path.write_text(path.read_text() + "\n")
    _, report = status("annotate.num_shards=6")
    assert report["annotate"]["state"] == "stale"
    (reason,) = report["annotate"]["reasons"]
    assert reason.startswith("changed since it was made: shard-00000-of-00006.jsonl (")
    assert reason.count("; ") == 4 and " now); shard-00001-of-00006.jsonl (" in reason and "shard-00004-of-00006.jsonl" in reason and "00005-of" not in reason  # 5 named
    assert report["pairs"]["state"] == "stale"  # it will read a remade annotation


def test_an_output_written_without_a_manifest_is_stale_with_the_way_to_redo_it(chain):
    (chain / "runs" / "pairs").mkdir(parents=True)
    (chain / "runs" / "pairs" / "pairs.jsonl").write_text("{}\n")
    (chain / "runs" / "annotate").mkdir(parents=True)
    (chain / "runs" / "annotate" / "_COMPLETE.json").write_text('{"stage": "annotate"}')
    _, report = status()
    assert report["annotate"]["state"] == report["pairs"]["state"] == "stale"
    assert report["annotate"]["reasons"] == report["pairs"]["reasons"] == ["written without a manifest (by an earlier version of align): what it "
                                             "was made from is unknown; remove it to redo it"]


def test_a_partial_output_whose_manifest_is_cut_off_is_stale_naming_the_manifest(chain):
    """Not "an earlier version": the manifest is there and cannot be read; the way forward is overwrite=true."""
    run_cli(["annotate", "r.yaml", "shard_index=1", "num_shards=5"])
    manifest = chain / "runs" / "annotate" / "_manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    _, report = status("annotate.num_shards=5")
    assert report["annotate"]["state"] == "stale"
    assert report["annotate"]["reasons"] == [(
        "its manifest (_manifest.json) is truncated or not valid JSON (line 3: Expecting ':' delimiter): "
        "what the partial output was made from is unknown; rerun the step with overwrite=true to redo it")]
