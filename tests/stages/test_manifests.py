"""Reruns through the CLI: every stage knows what its output was made from.

One tiny pipeline runs once per module (`align pipeline recipes/tiny/pipeline.yaml` in a
workspace). Then, for every stage: the same command skips it; one changed setting, and
separately one changed input row, stop it with one line naming the difference and the two
ways forward; `overwrite=true` redoes it, equal to a fresh run with the same settings.
Through the pipeline, a change in an early stage makes every later stage stale in
`align status`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from stage_helpers import make_workspace, run_cli

from align.cli import main
from align.io import STAGE_COMPLETE_MARKER, read_records, stage_completion_info
from align.manifests import MANIFEST_FILE, is_secret_key, redact

RECIPE = "recipes/tiny/pipeline.yaml"
OUT = {"sft": "sft", "sample": "sample", "annotate": "annotate", "pairs": "pairs", "logprobs": "logprobs",
       "train": "qrpo", "evaluate": "evaluate"}


def cli(args: list[str]) -> tuple[int, str, str]:
    """`align ARGS` in-process: (exit status, stdout, stderr), errors reported as the CLI reports them."""
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The tiny pipeline run once; the tests chdir into it."""
    root = make_workspace(tmp_path_factory.mktemp("manifests"))
    with contextlib.chdir(root):
        run_cli(["pipeline", RECIPE])
    return root


@pytest.fixture()
def ws(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    return workspace


def test_every_output_records_its_manifest(ws):
    for stage, out in OUT.items():
        info = stage_completion_info(ws / "runs" / "tiny" / out)
        manifest = info["manifest"]
        assert manifest["stage"] == stage and info["manifest_fingerprint"] == manifest["fingerprint"]
        assert (ws / "runs" / "tiny" / out / MANIFEST_FILE).is_file()
        assert "output_dir" not in manifest["settings"] and "overwrite" not in manifest["settings"]
    inputs = stage_completion_info(ws / "runs/tiny/sample")["manifest"]["inputs"]
    assert inputs["prompts"]["kind"] == "file"
    # an earlier stage's output is bound by its manifest fingerprint, not rehashed
    sft = stage_completion_info(ws / "runs/tiny/sft")
    assert inputs["sampler.model"] == {
        "path": "runs/tiny/sft", "kind": "stage", "stage": "sft", "fingerprint": sft["manifest_fingerprint"],
        "output_id": sft["output_id"]}
    assert stage_completion_info(ws / "runs/tiny/sft")["manifest"]["inputs"]["model_name_or_path"]["kind"] == "model"
    train = stage_completion_info(ws / "runs/tiny/qrpo")["manifest"]["settings"]
    assert train["loss_type"] == "qrpo" and "logging_steps" not in train and "report_to" not in train


@pytest.mark.parametrize("stage", list(OUT))
def test_unchanged_rerun_skips_in_one_line_and_writes_nothing(ws, stage):
    before = tree(ws / "runs" / "tiny")
    rc, out, err = cli([stage, RECIPE])
    assert rc == 0, err
    assert out.strip() == f"[align {stage}] runs/tiny/{OUT[stage]} is already complete; skipping " \
                          "(made from the same settings and inputs)"
    assert tree(ws / "runs" / "tiny") == before


# one setting each stage's output depends on, changed: (override, the difference named)
SETTING = {
    "sft": ("max_steps=41", "sft.max_steps: 40 → 41"),
    "sample": ("temperature=0.9", "sample.temperature: 1.0 → 0.9"),
    "annotate": ("answer_field=label", "annotate.answer_field: 'answer' → 'label'"),
    "pairs": ("seed=1", "pairs.seed: 0 → 1"),
    "logprobs": ("max_length=200", "logprobs.max_length: 256 → 200"),
    "train": ("loss_type=dpo", "train.loss_type: 'qrpo' → 'dpo'"),
    "evaluate": ("n=3", "evaluate.n: 4 → 3"),
}


@pytest.mark.parametrize("stage", list(OUT))
def test_a_changed_setting_stops_the_rerun_naming_it(ws, stage):
    before = tree(ws / "runs" / "tiny")
    override, named = SETTING[stage]
    rc, out, err = cli([stage, RECIPE, override])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"align {stage}: StaleOutputError: {stage}: runs/tiny/{OUT[stage]} holds an output made "
                          "from other settings or inputs: ")
    assert named in err
    assert "use another output_dir, or overwrite=true" in err
    assert tree(ws / "runs" / "tiny") == before


def _changed_copy(source: Path, dest: Path, change) -> Path:
    rows = read_records(source)
    rows = change(rows)
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


# one input row changed, for the stages whose input is a file the user gives
ROW_INPUT = {
    "sft": ("input", "recipes/tiny/data/sft.jsonl"),
    "sample": ("prompts", "recipes/tiny/data/prompts.jsonl"),
    "evaluate": ("prompts", "recipes/tiny/data/held_out.jsonl"),
}


@pytest.mark.parametrize("stage", list(ROW_INPUT))
def test_a_changed_input_row_stops_the_rerun_naming_the_file_and_the_rows(ws, stage, tmp_path):
    key, source = ROW_INPUT[stage]

    def change(rows):
        rows[0] = {**rows[0], "messages": [*rows[0]["messages"][:-1],
                                           {**rows[0]["messages"][-1], "content": "changed"}]}
        return [*rows, {**rows[1], "id": "added-1"}]

    changed = _changed_copy(ws / source, tmp_path / "changed.jsonl", change)
    rc, _, err = cli([stage, RECIPE, f"{key}={changed}"])
    assert rc == 2
    if stage == "sft":  # SFT streams its mixture (millions of rows are never held): the file is named, not rows
        assert f"{stage}.{key} ({changed}): content changed. " in err
    else:
        assert f"{stage}.{key} ({changed}): content changed (1 row differs, 1 added)" in err


@pytest.mark.parametrize("stage,key", [("annotate", "input"), ("pairs", "input"), ("logprobs", "input"),
                                       ("train", "input")])
def test_a_changed_upstream_row_stops_the_rerun(ws, stage, key, tmp_path):
    """Given as a plain file with one row changed, in place of the earlier stage's output."""
    config_source = {"annotate": "runs/tiny/sample", "pairs": "runs/tiny/annotate",
                     "logprobs": "runs/tiny/pairs/pairs.jsonl", "train": "runs/tiny/logprobs"}[stage]
    changed = _changed_copy(ws / config_source, tmp_path / "rows.jsonl",
                            lambda rows: [{**rows[0], "id": rows[0]["id"] + "-x"}, *rows[1:]])
    rc, _, err = cli([stage, RECIPE, f"{key}={changed}"])
    assert rc == 2 and f"{stage}.{key}: runs/tiny/" not in err
    assert f"{stage}.{key} ({changed}): " in err


@pytest.mark.parametrize("stage", ["sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate"])
def test_overwrite_redoes_the_stage_equal_to_a_fresh_run(ws, stage, tmp_path):
    """Changed setting + overwrite=true into the old directory == the same settings in a new one."""
    override = "model_batch_size=4" if stage == "annotate" else SETTING[stage][0]
    target = ws / "runs" / "tiny" / OUT[stage]
    saved = tmp_path / "saved"
    shutil.copytree(target, saved, symlinks=True)
    try:
        rc, out, err = cli([stage, RECIPE, override, "overwrite=true"])
        assert rc == 0, err
        assert "overwrite=true: removed" in out
        fresh = tmp_path / "fresh"
        rc, _, err = cli([stage, RECIPE, override, f"output_dir={fresh}"])
        assert rc == 0, err
        redone = stage_completion_info(target)
        assert redone["manifest_fingerprint"] == stage_completion_info(fresh)["manifest_fingerprint"]
        if stage in ("sample", "annotate", "logprobs"):
            key = lambda rows: sorted(rows, key=lambda r: r["id"])
            assert key(read_records(target)) == key(read_records(fresh))
        elif stage == "pairs":
            assert read_records(target / "pairs.jsonl") == read_records(fresh / "pairs.jsonl")
        elif stage in ("sft", "train"):
            assert (target / "model.safetensors").read_bytes() == (fresh / "model.safetensors").read_bytes()
        else:
            assert json.loads((target / "report.json").read_text())["overall"] == \
                json.loads((fresh / "report.json").read_text())["overall"]
        if stage not in ("sft", "train", "evaluate"):  # their summaries hold the loss / the report's path
            assert redone["summary"] == stage_completion_info(fresh)["summary"]
    finally:
        shutil.rmtree(target)
        shutil.copytree(saved, target, symlinks=True)


def test_overwrite_keeps_files_that_were_there_before_the_stage(ws, tmp_path):
    out = tmp_path / "pairs"
    out.mkdir()
    (out / "README.txt").write_text("the team's notes")
    assert cli(["pairs", RECIPE, f"output_dir={out}"])[0] == 0
    rc, _, err = cli(["pairs", RECIPE, f"output_dir={out}", "seed=3", "overwrite=true"])
    assert rc == 0, err
    assert (out / "README.txt").read_text() == "the team's notes"
    assert stage_completion_info(out)["manifest"]["settings"]["seed"] == 3


def test_a_partial_output_from_other_settings_is_never_resumed(ws, tmp_path):
    """A killed annotate job (shards, no completion marker), rerun with another setting."""
    out = tmp_path / "annotate"
    assert cli(["annotate", RECIPE, f"output_dir={out}"])[0] == 0
    (out / STAGE_COMPLETE_MARKER).unlink()  # as if killed after the last shard
    shard = out / "shard-00000-of-00001.jsonl"
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text("".join(lines[:5]))
    (out / "shard-00000-of-00001.done.json").unlink()
    rc, _, err = cli(["annotate", RECIPE, f"output_dir={out}", "answer_field=label"])
    assert rc == 2 and "holds a partial output made from other settings or inputs" in err
    assert "annotate.answer_field: 'answer' → 'label'" in err
    assert shard.read_text() == "".join(lines[:5])
    # the same settings resume it; status said so first
    rc, out_text, _ = cli(["status", RECIPE, f"annotate.output_dir={out}", "stop_after=annotate"])
    assert rc == 0 and "0 of 1 shards done; shards 0 are missing" in out_text
    assert cli(["annotate", RECIPE, f"output_dir={out}"])[0] == 0
    assert sorted(r["id"] for r in read_records(out)) == sorted(r["id"] for r in read_records(ws / "runs/tiny/annotate"))


def test_status_marks_every_later_stage_stale_after_an_early_change(ws):
    rc, out, _ = cli(["status", RECIPE])
    assert rc == 0
    for stage, path in OUT.items():
        assert f"{stage:<14} {'done':<30} runs/tiny/{path}" in out
    rc, out, _ = cli(["status", RECIPE, "sample.n=5", "sample.temperature=0.8"])
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["sft", "done"]
    assert "sample.n: 4 → 5" in out and "sample.temperature: 1.0 → 0.8" in out
    for stage in ("sample", "annotate", "pairs", "logprobs", "train", "evaluate"):
        assert f"{stage:<14} {'stale':<30}" in out, out
    assert "annotate.input (runs/tiny/sample): made from other settings or inputs" in out
    assert "evaluate.policies[1].model (runs/tiny/qrpo): made from other settings or inputs" in out


def test_pipeline_overwrite_redoes_the_stale_stages_and_skips_the_current_ones(workspace, tmp_path):
    """On a copy of the workspace: change pairs.seed, run the pipeline with overwrite=true."""
    copy = tmp_path / "ws"
    shutil.copytree(workspace, copy, symlinks=True)
    with contextlib.chdir(copy):
        rc, _, err = cli(["pipeline", RECIPE, "pairs.seed=1", "stop_after=train"])
        assert rc == 2 and "pairs.seed: 0 → 1" in err
        rc, out, err = cli(["pipeline", RECIPE, "pairs.seed=1", "stop_after=train", "overwrite=true"])
        assert rc == 0, err
        for stage in ("sft", "sample", "annotate"):
            assert f"[align {stage}] runs/tiny/{OUT[stage]} is already complete; skipping" in out
        for stage in ("pairs", "logprobs", "train"):
            assert f"[align {stage}] wrote runs/tiny/{OUT[stage]}" in out
        rc, out, _ = cli(["status", RECIPE, "pairs.seed=1"])
        assert "evaluate       stale" in out and "train          done" in out


def test_no_secret_reaches_an_output_dir(ws, tmp_path, monkeypatch):
    """A hub token given to train and an API key in the environment: nowhere under output_dir."""
    token, key = "hf_SECRETtoken123456", "sk-SECRETkey987654"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.delenv("HF_TOKEN", raising=False)  # restored after the test
    out = tmp_path / "qrpo"
    rc, _, err = cli(["train", RECIPE, f"output_dir={out}", f"hub_token={token}", "max_steps=1"])
    assert rc == 0, err
    for path in out.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert token.encode() not in data and key.encode() not in data, path
    assert "hub_token" not in stage_completion_info(out)["config"]
    assert os.environ["HF_TOKEN"] == token  # where the hub client still finds it for push_to_hub


def test_secret_rules():
    assert is_secret_key("hub_token") and is_secret_key("api_key") and is_secret_key("db-password")
    assert not is_secret_key("max_new_tokens") and not is_secret_key("tokenizer") and not is_secret_key("top_k")
    assert redact({"base_url": "http://user:pw@host:8000/v1?api_key=abc&x=1", "hub_token": "t", "n": 3}) == \
        {"base_url": "http://host:8000/v1?api_key=&x=1", "n": 3}


@pytest.mark.parametrize("stage", ["sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate",
                                   "decontaminate", "judge-validate", "pipeline"])
def test_every_stage_takes_overwrite(stage):
    """The key the rerun error offers exists on every stage (it used to be unknown to four)."""
    import dataclasses

    from align.stage_table import command_module as stage_module

    fields = {f.name: f for f in dataclasses.fields(stage_module(stage).Config)}
    assert fields["overwrite"].default is False


def test_overwrite_is_a_recipe_key_of_the_trainer_stages(ws):
    from align.drivers.args import stage_config

    for stage in ("sft", "train", "sample", "annotate", "logprobs"):
        config = stage_config(stage, [RECIPE, "overwrite=true"])
        assert config.overwrite is True


def test_keys_that_cannot_change_an_output_do_not_make_it_stale(ws):
    """A log interval, a progress-bar flag, reporting and the job's shard layout are not settings."""
    rc, out, err = cli(["train", RECIPE, "logging_steps=2", "disable_tqdm=false", "report_to=[]",
                        "save_total_limit=3"])
    assert rc == 0, err
    assert "is already complete; skipping" in out
    rc, out, err = cli(["annotate", RECIPE, "num_shards=1", "shard_index=0"])
    assert rc == 0 and "is already complete; skipping" in out, err


def test_the_tiny_judge_validate_recipe_runs_as_its_help_says(ws):
    """`align judge-validate --help` names recipes/tiny/judge_validate.yaml: it runs as written."""
    from align.cli import stage_help

    assert "align judge-validate recipes/tiny/judge_validate.yaml``" in stage_help("judge-validate")
    rc, out, err = cli(["judge-validate", "recipes/tiny/judge_validate.yaml", "steps=2", "pairwise=false"])
    assert rc == 0, err
    info = stage_completion_info(ws / "runs/tiny/judge_validate")
    assert info["summary"]["ladders"] == 6 and set(info["summary"]["qualified"]) == {"en", "de", "all"}


def test_decontaminate_reruns(tmp_path):
    """Same: skipped; a benchmark file changed: stopped naming it; overwrite: redone. The worker count
    and the progress bar are not settings (the same result with any number of workers)."""
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"question": "Name the largest planet of the solar system, please.", "key": "b0"})
                     + "\n")
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "Is 14 an even number?"},
                                                         {"role": "assistant", "content": "yes"}]}) + "\n")
    out = tmp_path / "decon"
    args = ["decontaminate", f"input={train}", f"output_dir={out}", "num_workers=1", "progress=false",
            f"benchmarks=[{{name: bench, path: {bench}, text_field: question, id_field: key}}]"]
    assert cli(args)[0] == 0
    rc, printed, _ = cli([*args[:3], "num_workers=2", "progress=true", args[-1]])
    assert rc == 0 and "is already complete; skipping" in printed
    bench.write_text(bench.read_text().replace("largest", "smallest"))
    rc, _, err = cli(args)
    assert rc == 2 and f"decontaminate.benchmarks[0].path ({bench}): content changed" in err
    rc, printed, err = cli([*args, "overwrite=true"])
    assert rc == 0 and "overwrite=true: removed" in printed, err


# --------------------------------------------------------------------------- found in review


def test_a_new_setting_at_its_default_leaves_finished_outputs_current(ws, monkeypatch):
    """An upgrade that adds a key (at the default that keeps the old behaviour) redoes nothing."""
    import dataclasses

    import align.stages.pairs as pairs_stage

    @dataclasses.dataclass
    class Upgraded(pairs_stage.Config):
        new_knob: int = 7

    monkeypatch.setattr(pairs_stage, "Config", Upgraded)
    rc, out, err = cli(["pairs", RECIPE])
    assert rc == 0 and "is already complete; skipping" in out, err
    rc, _, err = cli(["pairs", RECIPE, "new_knob=8"])
    assert rc == 2 and "pairs.new_knob: '(unset)' → 8" in err


def test_overwrite_with_a_mistyped_input_keeps_the_finished_output(ws):
    before = tree(ws / "runs/tiny/pairs")
    rc, _, err = cli(["pairs", RECIPE, "input=runs/tiny/annotat", "overwrite=true"])
    assert rc == 2 and "does not exist" in err
    assert tree(ws / "runs/tiny/pairs") == before


def test_a_remade_earlier_output_makes_what_read_it_stale(ws, tmp_path):
    """Same settings, made again (a purge, another node): new bytes, so a new output id."""
    upstream, pairs = tmp_path / "annotate", tmp_path / "pairs"
    assert cli(["annotate", RECIPE, f"output_dir={upstream}"])[0] == 0
    assert cli(["pairs", RECIPE, f"input={upstream}", f"output_dir={pairs}"])[0] == 0
    shutil.rmtree(upstream)
    assert cli(["annotate", RECIPE, f"output_dir={upstream}"])[0] == 0
    rc, _, err = cli(["pairs", RECIPE, f"input={upstream}", f"output_dir={pairs}"])
    assert rc == 2 and f"pairs.input ({upstream}): made again since" in err, err


def test_a_second_run_cannot_take_over_a_started_directory(ws, tmp_path):
    from align.manifests import StaleOutputError, begin, start
    from align.drivers.args import stage_config

    out = tmp_path / "pairs"
    first = begin("pairs", stage_config("pairs", [RECIPE, f"output_dir={out}"]), out)
    second_config = stage_config("pairs", [RECIPE, f"output_dir={out}", "seed=1"])
    second = begin("pairs", second_config, out)
    start(second)
    (out / "pairs.jsonl").write_text("{}\n")  # the second run's work
    with pytest.raises(StaleOutputError, match="now holds work of another run"):
        start(first)


def test_a_sharded_job_finished_on_another_rank_is_marked_complete(ws, tmp_path, monkeypatch):
    out = tmp_path / "annotate"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert cli(["annotate", RECIPE, f"output_dir={out}"])[0] == 0
    assert not (out / STAGE_COMPLETE_MARKER).exists()  # shard 1 of 2 still to come
    monkeypatch.setenv("RANK", "1")
    rc, printed, err = cli(["annotate", RECIPE, f"output_dir={out}"])
    assert rc == 0, err
    assert stage_completion_info(out)["manifest"]["stage"] == "annotate" and "wrote" in printed


def test_special_token_settings_are_not_secrets():
    for name in ("eos_token", "pad_token", "max_tokens", "max_new_tokens", "tokenizer", "api_key_env", "key_field"):
        assert not is_secret_key(name), name
    for name in ("Authorization", "accessToken", "clientSecret", "hub_token", "aws_secret_access_key", "token"):
        assert is_secret_key(name), name
    assert redact({"url": "https://h/x?X-Amz-Signature=abc&sig=def&n=1"}) == {"url": "https://h/x?X-Amz-Signature=&sig=&n=1"}
