"""align.manifests.StageRun: one writer per directory, overwrite removes only what a stage wrote, outputs
verified, secrets kept out, nothing removed before every input was checked."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from align.cli import main
from align.errors import InputError
from align.manifests import StageRun, StaleOutputError


def cli(args: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def annotated(rid: str) -> dict:
    texts = ["c0", "c1", "c2", "c3"]
    return {"id": rid, "messages": [{"role": "user", "content": "Is 4 even?"}], "answer": "yes",
            "completions": [{"text": t, "num_tokens": 2, "finish_reason": "stop", "is_reference": True,
                             "source": "p"} for t in texts],
            "rewards": [0.0, 1.0, 0.5, 0.2], "reward_skips": [None] * 4}


@pytest.fixture()
def rows(tmp_path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(annotated(f"a{i}")) + "\n" for i in range(3)))
    return path


def pairs_config(rows: Path, out: Path, **keys):
    from align.stages.pairs import Config

    return Config(input=str(rows), output_dir=str(out), **keys)


def test_overwrite_keeps_the_files_a_user_added_and_names_them(tmp_path, rows):
    out = tmp_path / "pairs"
    assert cli(["pairs", f"input={rows}", f"output_dir={out}"])[0] == 0
    (out / "notes.txt").write_text("my notes\n")
    rc, printed, err = cli(["pairs", f"input={rows}", f"output_dir={out}", "seed=1", "overwrite=true"])
    assert rc == 0, err
    assert (out / "notes.txt").read_text() == "my notes\n"
    assert "kept 1 it did not write: notes.txt" in printed
    assert json.loads((out / "_COMPLETE.json").read_text())["manifest"]["settings"]["seed"] == 1


def test_overwrite_in_the_working_directory_removes_only_the_stages_files(tmp_path, rows, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.jsonl").write_text(rows.read_text())
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("\\\\documentclass{article}\n")
    monkeypatch.chdir(work)
    assert cli(["pairs", f"input={data / 'in.jsonl'}", "output_dir=."])[0] == 0
    assert cli(["pairs", f"input={data / 'in.jsonl'}", "output_dir=.", "seed=2", "overwrite=true"])[0] == 0
    assert (work / "thesis.tex").exists() and (work / "pairs.jsonl").exists()


def test_an_overwrite_with_a_mistyped_input_removes_nothing(tmp_path, rows):
    out = tmp_path / "pairs"
    assert cli(["pairs", f"input={rows}", f"output_dir={out}"])[0] == 0
    before = sorted(p.name for p in out.iterdir())
    rc, _, err = cli(["pairs", f"input={tmp_path / 'typo.jsonl'}", f"output_dir={out}", "overwrite=true"])
    assert rc == 2 and "does not exist" in err
    assert sorted(p.name for p in out.iterdir()) == before and (out / "_COMPLETE.json").exists()


def test_a_second_run_is_refused_before_it_writes_a_byte(tmp_path, rows):
    """Another process is writing the directory (it holds the writer lock): this run stops at start."""
    import subprocess
    import sys

    out = tmp_path / "pairs"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from align.manifests import StageRun\n"
        "from align.stages.pairs import Config\n"
        f"run = StageRun.begin('pairs', Config(input={str(rows)!r}, output_dir={str(out)!r}))\n"
        "run.read('input'); run.start(); print('writing', flush=True); time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "writing"
        second = StageRun.begin("pairs", pairs_config(rows, out))
        second.read("input")
        snapshot = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
        with pytest.raises(InputError, match=r"another run is writing .* \(pid \d+ on .*\); two runs never write"):
            second.start()
        assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == snapshot
    finally:
        holder.kill()
        holder.wait()
    third = StageRun.begin("pairs", pairs_config(rows, out))  # its lock died with it: a run may start now
    third.read("input")
    third.start()
    third.close()


def test_a_run_whose_directory_was_taken_over_stops_before_writing(tmp_path, rows):
    out = tmp_path / "pairs"
    first = StageRun.begin("pairs", pairs_config(rows, out))
    first.read("input")
    first.start()
    first.close()  # as if it went on writing without its lock (another node's file system)
    other = StageRun.begin("pairs", pairs_config(rows, out, seed=5), overwrite=True)
    other.read("input")
    other.start()
    with pytest.raises(StaleOutputError, match="taken over by another run"):
        first.check_owner()
    with pytest.raises(StaleOutputError, match="taken over"):
        first.finish({})
    other.close()


def test_an_edited_output_is_changed_since_it_was_made_for_status_and_rerun(tmp_path, rows):
    out = tmp_path / "pairs"
    assert cli(["pairs", f"input={rows}", f"output_dir={out}"])[0] == 0
    files = json.loads((out / "_COMPLETE.json").read_text())["files"]
    assert set(files) == {"pairs.jsonl", "skipped.jsonl"} and all("digest" in f for f in files.values())
    data = out / "pairs.jsonl"
    text = data.read_text()
    assert '"id": "a0"' in text
    data.write_text(text.replace('"id": "a0"', '"id": "b0"', 1))  # the same size, other bytes
    rc, _, err = cli(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 2 and "changed since it was made: pairs.jsonl (other bytes)" in err
    assert cli(["pairs", f"input={rows}", f"output_dir={out}", "overwrite=true"])[0] == 0
    assert data.read_text() == text


def test_a_changed_model_file_is_named_for_what_it_is(tmp_path):
    from align.manifests.differences import differences
    from align.manifests.manifest import Manifest

    old = {"stage": "sft", "settings": {}, "inputs": {"model_name_or_path": {
        "path": "m", "kind": "model", "fingerprint": "a", "files": {"model.safetensors": "w", "tokenizer.json": "t"}}}}
    new = Manifest("sft", {}, {"model_name_or_path": {"path": "m", "kind": "model", "fingerprint": "b",
                                                      "files": {"model.safetensors": "w", "tokenizer.json": "u"}}})
    assert differences("sft", old, new) == ["sft.model_name_or_path (m): other tokenizer.json (not the weights)"]


def test_secrets_stay_out_of_manifests_markers_and_the_submitted_recipe(tmp_path):
    from align.manifests import build_manifest, redact
    from align.stages.sample import Config

    config = Config(prompts="p.jsonl", output_dir=str(tmp_path / "s"))
    config.sampler.engine_kwargs = {"hf_token": "hf_secret_123", "enforce_eager": True}
    config.sampler.base_url = "http://user:pw123@node:8000/v1?api_key=k456"
    manifest = json.dumps(build_manifest("sample", config).as_json())
    assert "hf_secret_123" not in manifest and "pw123" not in manifest and "k456" not in manifest
    assert "enforce_eager" in manifest
    assert redact({"train": {"hub_token": "x", "eos_token": "</s>"}}) == {"train": {"eos_token": "</s>"}}


def test_a_url_with_credentials_is_printed_without_them():
    from align.errors import ServiceError
    from align.io.http import request_json

    with pytest.raises(ServiceError) as info:
        request_json("http://user:pw123@127.0.0.1:9/v1/models?api_key=k456", None, method="GET", max_retries=0,
                     timeout_s=2)
    assert "pw123" not in str(info.value) and "k456" not in str(info.value)
    from align.io.http import join_url

    assert join_url("http://h:8/v1?x=1", "/models") == "http://h:8/v1/models?x=1"


def test_the_submitted_recipe_leaves_the_hub_token_out(tmp_path, monkeypatch):
    from align.stages import load_recipe
    from align.stages.submit import write_recipe

    recipe = load_recipe({"output_dir": "runs/x", "steps": {"pairs": {"stage": "pairs", "input": "a.jsonl"}},
                          "slurm": {"env": {"HF_HOME": "/scratch/hf"}}})
    recipe.raw["steps"]["pairs"]["hub_token"] = "hf_do_not_write"
    path = write_recipe(recipe, tmp_path)
    assert "hf_do_not_write" not in path.read_text() and "/scratch/hf" in path.read_text()


def test_a_finished_output_records_what_the_stage_wrote_in_its_ledger(tmp_path, rows):
    from align.io.ledger import written

    out = tmp_path / "pairs"
    out.mkdir()
    (out / "README.md").write_text("mine\n")
    assert cli(["pairs", f"input={rows}", f"output_dir={out}"])[0] == 0
    assert set(written(out)) == {"pairs.jsonl", "skipped.jsonl"}
    assert "README.md" in json.loads((out / "_manifest.json").read_text())["preexisting"]


# --------------------------------------------------------------------------- a model directory as an input


def _checkpoint_dir(root: Path) -> Path:
    directory = root / "sft-model"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"weights " * 64)
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "tokenizer.json").write_text('{"version": "1.0"}')
    (directory / "chat_template.jinja").write_text("{{ messages }}")
    (directory / ".hidden").write_text("not part of the model")
    return directory


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"])
def test_a_checkpoint_input_changes_with_any_of_its_files_not_only_its_weights(tmp_path, name):
    """An edited config or chat template is another model: a stage trained from it is stale."""
    from align.manifests.inputs import fingerprint_input

    directory = _checkpoint_dir(tmp_path)
    before = fingerprint_input(str(directory), key="model_name_or_path")
    assert before["kind"] == "model"
    assert sorted(before["files"]) == ["chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json"]
    path = directory / name
    path.write_bytes(path.read_bytes() + b" ")
    after = fingerprint_input(str(directory), key="model_name_or_path")
    assert after["fingerprint"] != before["fingerprint"]
    assert {k for k in after["files"] if after["files"][k] != before["files"][k]} == {name}


def test_a_checkpoint_input_ignores_hidden_files_locks_and_markers(tmp_path):
    from align.manifests.inputs import fingerprint_input

    directory = _checkpoint_dir(tmp_path)
    before = fingerprint_input(str(directory), key="model_name_or_path")
    (directory / ".hidden").write_text("changed")
    (directory / "model.lock").write_text("pid 1")
    assert fingerprint_input(str(directory), key="model_name_or_path") == before
