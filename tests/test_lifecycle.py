"""align.manifests.StageRun: one writer per directory, overwrite removes only what a stage wrote, outputs
verified, secrets kept out, nothing removed before every input was checked."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass, field
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

    for url in ("http://user:pw123@127.0.0.1:9/v1/models", "http://127.0.0.1:9/v1/models?api_key=k456&x=1"):
        with pytest.raises(ServiceError) as info:
            request_json(url, None, method="GET", max_retries=0, timeout_s=2)
        assert "pw123" not in str(info.value) and "k456" not in str(info.value)
    with pytest.raises(ValueError, match="more than one credential") as info:  # two keys: which one?
        request_json("http://user:pw123@127.0.0.1:9/v1/models?api_key=k456", None, method="GET", max_retries=0)
    assert "pw123" not in str(info.value) and "k456" not in str(info.value)
    from align.io.http import join_url

    assert join_url("http://h:8/v1?x=1", "/models") == "http://h:8/v1/models?x=1"


def test_the_submitted_recipe_leaves_the_hub_token_out(tmp_path, monkeypatch):
    from align.drivers import load_recipe
    from align.drivers.submit import write_recipe

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


# --------------------------------------------------------------------------- what a stage output's manifest holds


@dataclass
class Toy:
    """A stage's config: the rows it reads, where it writes, one setting that counts."""

    input: str = ""
    output_dir: str = ""
    seed: int = 0


def made(stage: str, config, **kw) -> dict:
    """A finished run of ``stage`` (one file written): its ``_COMPLETE.json``."""
    run = StageRun.begin(stage, config, **kw)
    assert not run.skip
    try:
        run.start()
        (run.output_dir / "data.txt").write_text("made\n")
        run.finish({}, announce=False)
    finally:
        run.close()
    return json.loads((run.output_dir / "_COMPLETE.json").read_text())


def rerun(stage: str, config, **kw) -> str:
    """What a rerun over a finished output decides: ``current`` (skipped), else why it is refused."""
    try:
        run = StageRun.begin(stage, config, **kw)
    except StaleOutputError as error:
        return str(error)
    run.close()
    return "current" if run.skip else "not finished"


def test_the_manifest_file_records_stage_fingerprint_library_version_settings_and_inputs(tmp_path, rows):
    """``_manifest.json`` (written at start) and ``_COMPLETE.json`` hold the same manifest: the stage, the
    fingerprint the output is matched by, the installed align version, the settings that count (not where
    it writes) and a content fingerprint of each input."""
    from importlib.metadata import version

    out = tmp_path / "out"
    done = made("toy", Toy(str(rows), str(out), seed=1))
    started = json.loads((out / "_manifest.json").read_text())
    for recorded in (done["manifest"], started):
        assert recorded["stage"] == "toy" and recorded["fingerprint"] == done["manifest_fingerprint"]
        assert recorded["library"] == version("align")
        assert recorded["settings"] == {"seed": 1}
        assert set(recorded["inputs"]) == {"input"}
        assert recorded["inputs"]["input"]["kind"] == "file" and recorded["inputs"]["input"]["path"] == str(rows)


def test_the_library_version_is_recorded_not_compared(tmp_path, rows, monkeypatch):
    """A source checkout that is not installed records ``unknown``; a manifest read back keeps the version it
    names; and the version never changes the fingerprint (an upgrade does not redo finished work)."""
    import importlib.metadata

    from align.manifests import Manifest, build_manifest

    installed = build_manifest("toy", Toy(str(rows), str(tmp_path / "out")))
    older = Manifest("toy", installed.settings, installed.inputs, library="0.0.1", defaults=installed.defaults)
    assert older.library == "0.0.1" and older.fingerprint == installed.fingerprint

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    checkout = build_manifest("toy", Toy(str(rows), str(tmp_path / "out")))
    assert checkout.as_json()["library"] == "unknown" and checkout.fingerprint == installed.fingerprint


def test_the_fingerprint_of_a_manifest_is_the_same_in_every_version(tmp_path):
    """The digest of stage, settings and inputs (less each input's path and per-file digests) is pinned: an
    output finished by this version is current under the next one, and one made from a model that was
    moved (another path, the same files) is current too."""
    from align.manifests import Manifest

    model = {"path": "/models/sft", "kind": "model", "fingerprint": "ab" * 32,
             "files": {"config.json": "0123456789abcdef", "model.safetensors": "fedcba9876543210"}}
    manifest = Manifest("sft", {"seed": 1, "learning_rate": 1e-05}, {"model_name_or_path": model})
    assert manifest.fingerprint == "ff15af554cd9533ee779515ae22ac603ecd7030548c8201fb47ce1140ed2c935"
    moved = Manifest("sft", {"seed": 1, "learning_rate": 1e-05}, {"model_name_or_path": {**model, "path": "/b/sft"}})
    assert moved.fingerprint == manifest.fingerprint


def test_an_input_moved_elsewhere_with_the_same_content_leaves_the_output_current(tmp_path, rows):
    """An input counts by its content, not its path; other content makes the output stale, naming the input."""
    out = tmp_path / "out"
    made("toy", Toy(str(rows), str(out)))
    moved = tmp_path / "elsewhere" / "rows.jsonl"
    moved.parent.mkdir()
    moved.write_bytes(rows.read_bytes())
    assert rerun("toy", Toy(str(moved), str(out))) == "current"
    moved.write_text(moved.read_text() + json.dumps(annotated("a9")) + "\n")
    assert f"toy.input ({moved}): content changed" in rerun("toy", Toy(str(moved), str(out)))


def test_a_stage_configured_by_a_mapping_has_a_manifest_too(tmp_path, rows):
    """A config given as a plain mapping (no ``output_dir`` attribute; the directory is passed apart) is
    recorded and matched like a dataclass config."""
    out = tmp_path / "out"
    done = made("toy", {"input": str(rows), "seed": 3}, output_dir=out)
    assert done["manifest"]["settings"] == {"seed": 3} and set(done["manifest"]["inputs"]) == {"input"}
    assert rerun("toy", {"input": str(rows), "seed": 3}, output_dir=out) == "current"
    assert "toy.seed: 3 → 4" in rerun("toy", {"input": str(rows), "seed": 4}, output_dir=out)


@dataclass
class ToyV2:
    """``Toy`` of a later version: a new setting whose default keeps the old behaviour."""

    input: str = ""
    output_dir: str = ""
    seed: int = 0
    label_smoothing: float = 0.0


def test_a_setting_added_by_a_new_version_at_its_default_leaves_a_finished_output_current(tmp_path, rows):
    """The new setting is recorded, but only counts once set away from its default."""
    from align.manifests import build_manifest

    out = tmp_path / "out"
    made("toy", Toy(str(rows), str(out), seed=2))
    assert rerun("toy", ToyV2(str(rows), str(out), seed=2)) == "current"
    refused = rerun("toy", ToyV2(str(rows), str(out), seed=2, label_smoothing=0.1))
    assert "made from other settings or inputs: toy.label_smoothing: '(unset)' → 0.1." in refused
    assert build_manifest("toy", ToyV2(str(rows), str(out))).settings["label_smoothing"] == 0.0


@dataclass
class Chat:
    """A stage that renders chat prompts: ``chat_date`` None renders today's date."""

    input: str = ""
    output_dir: str = ""
    chat_date: str | None = None
    max_tokens: int | None = None


def on_day(monkeypatch, day: str) -> None:
    """Today is ``day`` for the chat template's date."""
    import datetime
    import types

    from align.chat import apertus

    class Day(datetime.date):
        @classmethod
        def today(cls):
            return datetime.date.fromisoformat(day)

    monkeypatch.setattr(apertus, "_dt", types.SimpleNamespace(date=Day, datetime=datetime.datetime))


def test_a_null_chat_date_counts_as_the_day_it_renders_so_a_run_resumed_the_next_day_is_stale(
        tmp_path, rows, monkeypatch):
    """``chat_date: null`` is recorded as the date it renders (the next day renders another system prompt);
    a pinned date, and any other null setting, is recorded as given."""
    out, pinned = tmp_path / "out", tmp_path / "pinned"
    on_day(monkeypatch, "2025-03-01")
    assert made("toy", Chat(str(rows), str(out)))["manifest"]["settings"] == {"chat_date": "2025-03-01",
                                                                               "max_tokens": None}
    assert made("toy", Chat(str(rows), str(pinned), "2024-12-24"))["manifest"]["settings"] == {
        "chat_date": "2024-12-24", "max_tokens": None}
    assert rerun("toy", Chat(str(rows), str(out))) == "current"
    on_day(monkeypatch, "2025-03-02")
    assert "toy.chat_date: '2025-03-01' → '2025-03-02'" in rerun("toy", Chat(str(rows), str(out)))
    assert rerun("toy", Chat(str(rows), str(pinned), "2024-12-24")) == "current"


@dataclass
class Args:
    logging_steps: int = 10
    output_dir: str = ""
    batch_size: int = 8


@dataclass
class Trainer:
    args: Args = field(default_factory=Args)


@dataclass
class Batched:
    """A job stage's config: a job batch (records per append), and a nested trainer with a model batch."""

    input: str = ""
    output_dir: str = ""
    batch_size: int = 16
    trainer: Trainer = field(default_factory=Trainer)


def test_neutral_settings_at_any_depth_and_a_job_stages_own_batch_size_leave_an_output_current(tmp_path, rows):
    """Logging and where a nested part writes never count, at any depth; annotate's ``batch_size`` (records
    per append) does not count, but a nested ``batch_size`` (a model's) does, and so does ``batch_size`` in a
    stage that does not declare it neutral."""
    out = tmp_path / "out"
    made("annotate", Batched(str(rows), str(out)))
    neutral = Batched(str(rows), str(out), batch_size=4,
                      trainer=Trainer(Args(logging_steps=1, output_dir=str(tmp_path / "elsewhere"))))
    assert rerun("annotate", neutral) == "current"
    counted = Batched(str(rows), str(out), trainer=Trainer(Args(batch_size=4)))
    assert "annotate.trainer.args.batch_size: 8 → 4" in rerun("annotate", counted)

    toy_out = tmp_path / "toy"
    made("toy", Batched(str(rows), str(toy_out)))
    assert "toy.batch_size: 16 → 4" in rerun("toy", Batched(str(rows), str(toy_out), batch_size=4))


@dataclass
class Resumable:
    """A trainer's config: ``resume_from_checkpoint`` names a checkpoint to continue from."""

    input: str = ""
    output_dir: str = ""
    resume_from_checkpoint: str | None = None
    seed: int = 0


def test_resuming_from_another_runs_checkpoint_makes_its_weights_an_input(tmp_path, rows):
    """A checkpoint outside the output directory is another run's weights: an input (its files count), and
    the settings after it count as ever."""
    other = _checkpoint_dir(tmp_path)
    out = tmp_path / "out"
    done = made("toy", Resumable(str(rows), str(out), str(other), seed=1))
    assert done["manifest"]["settings"] == {"seed": 1}
    assert done["manifest"]["inputs"]["resume_from_checkpoint"]["kind"] == "model"
    assert rerun("toy", Resumable(str(rows), str(out), str(other), seed=1)) == "current"
    assert "toy.seed: 1 → 2" in rerun("toy", Resumable(str(rows), str(out), str(other), seed=2))
    (other / "model.safetensors").write_bytes(b"other weights " * 64)
    assert f"toy.resume_from_checkpoint ({other}): other weights (model.safetensors)" in \
        rerun("toy", Resumable(str(rows), str(out), str(other), seed=1))


def test_resuming_from_the_runs_own_checkpoint_resumes_the_same_run(tmp_path, rows):
    """A checkpoint inside the output directory is this run's own progress: the same manifest, so the run
    resumes (it is not refused as other settings)."""
    out = tmp_path / "out"
    first = StageRun.begin("toy", Resumable(str(rows), str(out), seed=1))
    try:
        first.start()
        checkpoint = _checkpoint_dir(out)  # written by the run, then it was killed
    finally:
        first.close()
    again = StageRun.begin("toy", Resumable(str(rows), str(out), str(checkpoint), seed=1))
    again.close()
    assert again.resumed and again.begun.manifest.fingerprint == first.begun.manifest.fingerprint
    assert "resume_from_checkpoint" not in again.begun.manifest.inputs
    assert "resume_from_checkpoint" not in again.begun.manifest.settings


@dataclass
class Tokenized:
    input: str = ""
    output_dir: str = ""
    tokenizer: str = ""


def test_a_tokenizer_directory_counts_by_its_tokenizer_files_not_the_weights_beside_them(tmp_path, rows):
    out = tmp_path / "out"
    directory = _checkpoint_dir(tmp_path)
    made("toy", Tokenized(str(rows), str(out), str(directory)))
    (directory / "model.safetensors").write_bytes(b"other weights " * 64)
    assert rerun("toy", Tokenized(str(rows), str(out), str(directory))) == "current"
    (directory / "tokenizer.json").write_text('{"version": "2.0"}')
    assert f"toy.tokenizer ({directory}): content changed" in rerun("toy", Tokenized(str(rows), str(out),
                                                                                     str(directory)))


def test_status_binds_an_input_an_earlier_step_has_not_made_yet_to_what_that_step_will_make(tmp_path,
                                                                                          monkeypatch):
    """``align status`` passes the fingerprint each earlier step's output will have: a later step that reads
    that output, a file in it, a file of it named from within it (the earlier step wrote into the working
    directory), or resumes from one of its checkpoints, is bound to it before it exists."""
    from align.manifests import build_manifest, dir_key

    earlier = tmp_path / "pairs"
    outputs = {dir_key(earlier): ("pairs", "e" * 64, None)}
    stage_entry = {"kind": "stage", "stage": "pairs", "fingerprint": "e" * 64, "output_id": None}
    out = str(tmp_path / "out")
    whole = build_manifest("toy", Toy(str(earlier), out), overrides=outputs)
    assert whole.inputs == {"input": {"path": str(earlier), **stage_entry}} and "input" not in whole.settings
    one_file = build_manifest("toy", Toy(str(earlier / "pairs.jsonl"), out), overrides=outputs)
    assert one_file.inputs == {"input": {"path": str(earlier / "pairs.jsonl"), **stage_entry, "file": "pairs.jsonl"}}
    resumed = build_manifest("toy", Resumable(str(earlier / "pairs.jsonl"), out, str(earlier / "checkpoint-100")),
                             overrides=outputs)
    assert resumed.inputs["resume_from_checkpoint"] == {"path": str(earlier / "checkpoint-100"), **stage_entry,
                                                        "file": "checkpoint-100"}
    earlier.mkdir()
    monkeypatch.chdir(earlier)
    here = build_manifest("toy", Toy("pairs.jsonl", out), overrides=outputs)
    assert here.inputs == {"input": {"path": "pairs.jsonl", **stage_entry, "file": "pairs.jsonl"}}


def test_status_builds_a_manifest_for_a_path_spelled_through_a_folder_named_tilde(tmp_path, monkeypatch):
    """``./~/../pairs.jsonl`` goes through a folder literally named ``~`` (not the home directory) back to
    ``pairs.jsonl``: an odd spelling of a file the earlier step has not made yet, which ``align status``
    records as an input of the later step without failing."""
    from align.manifests import build_manifest, dir_key

    earlier = tmp_path / "pairs"
    earlier.mkdir()
    monkeypatch.chdir(earlier)
    outputs = {dir_key(earlier): ("pairs", "e" * 64, None)}
    manifest = build_manifest("toy", Toy("./~/../pairs.jsonl", str(tmp_path / "out")), overrides=outputs)
    assert set(manifest.inputs) == {"input"} and "input" not in manifest.settings


@dataclass
class Hub:
    input: str = ""
    output_dir: str = ""
    model: str = ""


def test_status_calls_a_finished_step_done_when_its_model_is_a_hub_name(tmp_path, rows):
    """A hub name (no local path) counts by its spelling, whether or not ``align status`` knows of other
    steps' outputs: the step the run finished is ``done``, not stale."""
    from align.manifests import dir_key
    from align.manifests.status import step_state

    out = tmp_path / "out"
    done = made("toy", Hub(str(rows), str(out), "org/reward-model"))
    assert done["manifest"]["settings"] == {"model": "org/reward-model"}
    outputs = {dir_key(tmp_path / "pairs"): ("pairs", "e" * 64, None)}
    assert step_state("toy", Hub(str(rows), str(out), "org/reward-model"), outputs).state == "done"


def annotate_config(rows: Path, out: Path, **keys):
    from align.stages.annotate import Config

    return Config(input=str(rows), output_dir=str(out), model="org/judge", **keys)


def test_a_judges_charter_counts_by_the_text_the_judge_reads(tmp_path, rows):
    """With ``provider=judge`` the charter is an input fingerprinted by its text: another clause makes the
    output stale, naming the charter; blank lines between articles (layout) do not."""
    from rewards.charter import charter_dir

    charter = tmp_path / "mine.md"
    text = (charter_dir() / "default.md").read_text()
    charter.write_text(text)
    out = tmp_path / "scored"
    done = made("annotate", annotate_config(rows, out, provider="judge", charter=str(charter)))
    assert done["manifest"]["inputs"]["charter"]["kind"] == "charter"
    assert "charter" not in done["manifest"]["settings"]
    charter.write_text(text.replace("\n## 2.", "\n\n\n## 2."))
    assert rerun("annotate", annotate_config(rows, out, provider="judge", charter=str(charter))) == "current"
    charter.write_text(text.replace("[1.1] Answer", "[1.1] Always answer"))
    assert f"annotate.charter ({charter}): other charter text" in \
        rerun("annotate", annotate_config(rows, out, provider="judge", charter=str(charter)))


def test_the_charter_counts_only_where_the_provider_reads_it(tmp_path, rows):
    """A reward model never reads the charter: no charter input, and a charter name it cannot find is no
    error (the setting is recorded as given). Evaluate's judge (``reward.provider=judge``) reads it; its
    default provider (answer checking) does not."""
    from align.manifests import build_manifest
    from align.stages.evaluate import Config as Evaluate
    from rewards.config import RewardProviderConfig

    out = tmp_path / "scored"
    done = made("annotate", annotate_config(rows, out))
    settings = done["manifest"]["settings"]
    assert settings["provider"] == "reward_model" and settings["charter"] is None
    assert "charter" not in done["manifest"]["inputs"]
    unused = build_manifest("annotate", annotate_config(rows, out, charter="not_a_charter"))
    assert unused.settings["charter"] == "not_a_charter" and "charter" not in unused.inputs

    judged = build_manifest("evaluate", Evaluate(prompts=str(rows), output_dir=str(tmp_path / "eval"),
                                                 reward=RewardProviderConfig(provider="judge", model="org/judge")))
    assert judged.inputs["reward.charter"]["kind"] == "charter" and "reward.charter" not in judged.settings
    checked = build_manifest("evaluate", Evaluate(prompts=str(rows), output_dir=str(tmp_path / "eval")))
    assert "reward.charter" not in checked.inputs and checked.settings["reward.charter"] is None


def test_each_charter_of_a_list_counts_by_its_text(tmp_path):
    """Several charters given as one list: each is a charter input, fingerprinted as the judge reads it."""
    from align.manifests import build_manifest

    one = build_manifest("judge-validate", {"provider": "judge", "charter": "example_de"})
    both = build_manifest("judge-validate", {"provider": "judge", "charter": ["default", "example_de"]})
    assert {key: entry["kind"] for key, entry in both.inputs.items()} == {"charter[0]": "charter",
                                                                          "charter[1]": "charter"}
    assert both.inputs["charter[1]"]["fingerprint"] == one.inputs["charter"]["fingerprint"]
    assert both.inputs["charter[0]"]["fingerprint"] != one.inputs["charter"]["fingerprint"]


def test_a_charter_no_judge_reads_never_counts_by_its_content(tmp_path, rows):
    """A reward model with a charter file named (a single one or a list): the file is no input, so
    editing it leaves the output current, and a missing name in a list is no error."""
    from align.manifests import build_manifest

    charter = tmp_path / "mine.md"
    charter.write_text("Be kind.\n")
    before = build_manifest("annotate", annotate_config(rows, tmp_path / "out", charter=str(charter)))
    charter.write_text("Be cruel.\n")
    after = build_manifest("annotate", annotate_config(rows, tmp_path / "out", charter=str(charter)))
    assert "charter" not in before.inputs and before.fingerprint == after.fingerprint
    listed = build_manifest("judge-validate", {"provider": "reward_model", "charter": ["default", "no_such_charter"]})
    assert not listed.inputs
    assert (listed.settings["charter[0]"], listed.settings["charter[1]"]) == ("default", "no_such_charter")


def test_a_mapping_configs_own_checkpoint_resumes_and_another_runs_is_an_input(tmp_path, rows):
    """``output_dir`` given inside a mapping config decides, as for a dataclass, whether a checkpoint is
    this run's own progress or another run's weights."""
    from align.manifests import build_manifest

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    own, other = _checkpoint_dir(out), _checkpoint_dir(elsewhere)
    mine = build_manifest("toy", {"input": str(rows), "output_dir": str(out), "resume_from_checkpoint": str(own)})
    theirs = build_manifest("toy", {"input": str(rows), "output_dir": str(out),
                                    "resume_from_checkpoint": str(other)})
    assert "resume_from_checkpoint" not in mine.inputs
    assert theirs.inputs["resume_from_checkpoint"]["kind"] == "model"


# --------------------------------------------------------------------------- what a rerun refusal names


def _manifest(settings: dict | None = None, inputs: dict | None = None, defaults: dict | None = None):
    from align.manifests.manifest import Manifest

    return Manifest(stage="train", settings=settings or {}, inputs=inputs or {}, library="test",
                    defaults=defaults or {})


def _file(path: str, fingerprint: str, kind: str = "file", **more) -> dict:
    return {"path": path, "kind": kind, "fingerprint": fingerprint, **more}


def _stage(fingerprint: str, output_id: str | None = "o1", stage: str | None = "sample", **more) -> dict:
    entry = {"path": "runs/sample", "kind": "stage", "fingerprint": fingerprint, "output_id": output_id, **more}
    if stage is not None:
        entry["stage"] = stage
    return entry


_LONG_OLD, _LONG_NEW = "x" * 58, "y" * 59  # shown as 60 characters (whole) and 61 (cut to 57 + "...")


@pytest.mark.parametrize(("old", "settings", "defaults", "expected"), [
    ({"stage": "sample", "settings": {"seed": 1}}, {"seed": 2}, {},
     ["the directory holds the sample stage's output, not train's"]),
    ({"stage": "train", "settings": {"loss_type": "qrpo", "retired": 1, "seed": 1}},
     {"beta": 0.1, "loss_type": "dpo", "seed": 2, "warmup": 5}, {"beta": 0.1, "warmup": 0},
     ["train.loss_type: 'qrpo' → 'dpo'", "train.seed: 1 → 2", "train.warmup: '(unset)' → 5"]),
    ({"settings": {"extra": None, "flag": False, "opts": {"a": 1}}}, {"extra": "x", "flag": True, "opts": {"a": 2}},
     {}, ['train.extra: null → \'x\'', "train.flag: false → true", 'train.opts: {"a": 1} → {"a": 2}']),
    ({"settings": {"where": "a"}}, {"where": Path("b")}, {}, ["train.where: 'a' → \"b\""]),
    ({"settings": {"a": _LONG_OLD, "b": _LONG_OLD}}, {"a": "z" * 58, "b": _LONG_NEW}, {},
     [f"train.a: '{_LONG_OLD}' → '{'z' * 58}'", f"train.b: '{_LONG_OLD}' → '{'y' * 56}..."]),
])
def test_a_refused_rerun_names_each_changed_setting_as_before_and_after(old, settings, defaults, expected):
    """Each changed setting is one line ``stage.key: before → after`` (strings quoted, other values as JSON,
    long values cut to 60 characters); a setting added since at its default, or one this version no longer
    has, is not named; an output of another stage is named as such."""
    from align.manifests.differences import differences

    assert differences("train", old, _manifest(settings, defaults=defaults)) == expected


_ROWS_FILE = {"prompts": _file("p.jsonl", "1")}, {"prompts": _file("p.jsonl", "2")}
_MODEL = {"config.json": "c1", "model.safetensors": "w1", "tokenizer.json": "t"}
_SHARDS = [f"model-0000{i}.safetensors" for i in range(1, 5)]
_OTHERS = ["a.json", "b.json", "c.json", "d.json"]


def _model(files: dict | None, fingerprint: str) -> dict:
    return _file("m", fingerprint, "model", **({"files": files} if files is not None else {}))


@pytest.mark.parametrize(("old_inputs", "new_inputs", "rows", "expected"), [
    ({"eval": _file("e.jsonl", "1"), "same": _file("x.jsonl", "s"), "z": _file("z1.jsonl", "z")},
     {"prompts": _file("p.jsonl", "p"), "same": _file("moved/x.jsonl", "s"), "z": _file("z2.jsonl", "z2")}, None,
     ["train.eval: e.jsonl → (not an input)", "train.prompts: (not an input) → p.jsonl",
      "train.z (z2.jsonl): content changed"]),
    ({"prompts": _stage("f")}, {"prompts": _stage("f", changed=["a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"])}, None,
     ["train.prompts (runs/sample): the sample stage's output changed since it was made "
      "(a.jsonl; b.jsonl; c.jsonl)"]),
    ({"prompts": _stage("f", stage=None)}, {"prompts": _stage("f", stage=None, changed=["a.jsonl"])}, None,
     ["train.prompts (runs/sample): the earlier stage's output changed since it was made (a.jsonl)"]),
    ({"prompts": _stage("f1")}, {"prompts": _stage("f2", stage="annotate")}, None,
     ["train.prompts (runs/sample): now the annotate stage's output (was the sample stage's)"]),
    ({"prompts": _file("p.jsonl", "h")}, {"prompts": _stage("f")}, None,
     ["train.prompts (runs/sample): now the sample stage's output (was a plain file)"]),
    ({"prompts": _stage("f")}, {"prompts": _file("p.jsonl", "h")}, None,
     ["train.prompts (p.jsonl): the input file's content changed: a plain file now, no earlier stage's output (it "
      "was the sample stage's output)"]),
    ({"prompts": _stage("f", stage=None)}, {"prompts": _file("p.jsonl", "h")}, None,
     ["train.prompts (p.jsonl): the input file's content changed: a plain file now, no earlier stage's output (it "
      "was the earlier stage's output)"]),
    ({"prompts": _stage("f")}, {"prompts": _stage("f", output_id=None)}, None,
     ["train.prompts (runs/sample): the sample step that makes it is not current, so it will be made again"]),
    ({"prompts": _stage("f", stage=None)}, {"prompts": _stage("f", output_id=None, stage=None)}, None,
     ["train.prompts (runs/sample): the earlier step that makes it is not current, so it will be made again"]),
    ({"prompts": _stage("f")}, {"prompts": _stage("f", output_id="o2")}, None,
     ["train.prompts (runs/sample): made again since (the sample stage's output is new, though made from the "
      "same settings and inputs)"]),
    ({"prompts": _stage("f", stage=None)}, {"prompts": _stage("f", output_id="o2", stage=None)}, None,
     ["train.prompts (runs/sample): made again since (the earlier stage's output is new, though made from the "
      "same settings and inputs)"]),
    (*_ROWS_FILE, ({"prompts": {"a": "1", "b": "2", "c": "3"}}, {"prompts": {"a": "1x", "b": "2x", "d": "4"}}),
     ["train.prompts (p.jsonl): content changed (2 rows differ, 1 added, 1 removed)"]),
    (*_ROWS_FILE, ({"prompts": {"a": "1", "b": "2"}}, {"prompts": {"a": "1", "b": "2", "c": "3"}}),
     ["train.prompts (p.jsonl): content changed (1 added)"]),
    (*_ROWS_FILE, ({"prompts": {"a": "1", "b": "2"}}, {"prompts": {"a": "1x"}}),
     ["train.prompts (p.jsonl): content changed (1 row differs, 1 removed)"]),
    (*_ROWS_FILE, ({"prompts": {"a": "1", "b": "2"}}, {"prompts": {"b": "2", "a": "1"}}),
     ["train.prompts (p.jsonl): content changed (the same rows, in another order or layout)"]),
    (*_ROWS_FILE, ({"other": {"a": "1"}}, {}), ["train.prompts (p.jsonl): content changed"]),
    ({"model": _model(_MODEL, "a")}, {"model": _model({**_MODEL, "config.json": "c2", "model.safetensors": "w2"}, "b")},
     None, ["train.model (m): other weights (model.safetensors); other config.json"]),
    ({"model": _model(dict.fromkeys(_SHARDS, "1"), "a")}, {"model": _model(dict.fromkeys(_SHARDS, "2"), "b")}, None,
     ["train.model (m): other weights (model-00001.safetensors, model-00002.safetensors, "
      "model-00003.safetensors)"]),
    ({"model": _model({**dict.fromkeys(_OTHERS, "1"), "w.bin": "w"}, "a")},
     {"model": _model({**dict.fromkeys(_OTHERS, "2"), "e.json": "2", "w.bin": "w"}, "b")}, None,
     ["train.model (m): other a.json, b.json, c.json, d.json (not the weights)"]),
    ({"model": _model({"w.bin": "w"}, "a")}, {"model": _model({"w.bin": "w", "chat_template.jinja": "t"}, "b")}, None,
     ["train.model (m): other chat_template.jinja (not the weights)"]),
    ({"model": _model({"w.bin": "w"}, "a")}, {"model": _model({"w.bin": "w"}, "b")}, None,
     ["train.model (m): other files"]),
    ({"model": _model(None, "a")}, {"model": _model({"w.bin": "w"}, "b")}, None, ["train.model (m): other weights"]),
    ({"charter": _file("default", "a", "charter")}, {"charter": _file("default", "b", "charter")}, None,
     ["train.charter (default): other charter text"]),
    ({"prompts": _stage("f")}, {"prompts": _file("org/data", "h", "name")}, None,
     ["train.prompts (org/data): now a dataset name, no earlier stage's output (was the sample stage's output)"]),
    ({"prompts": _stage("f")}, {"prompts": _file("d", "h", "directory")}, None,
     ["train.prompts (d): the input directory's content changed: a plain directory now, no earlier stage's "
      "output (it was the sample stage's output)"]),
    ({"prompts": _stage("f")}, {"prompts": _file("p.jsonl", "h")}, ({"prompts": {"a": "1"}}, None),
     ["train.prompts (p.jsonl): the input file's content changed: a plain file now, no earlier stage's output (it "
      "was the sample stage's output)"]),
    ({"prompts": _stage("f")}, {"prompts": _file("p.jsonl", "h")}, ({"prompts": {"a": "1"}}, {"prompts": {"a": "1"}}),
     ["train.prompts (p.jsonl): the input file's content changed: a plain file now, no earlier stage's output (it "
      "was the sample stage's output; the same rows)"]),
    ({"model": _stage("f", stage=None)}, {"model": _model(None, "b")}, None,
     ["train.model (m): made from other settings or inputs (the earlier stage's manifest changed)"]),
])
def test_a_refused_rerun_names_how_each_changed_input_differs(old_inputs, new_inputs, rows, expected):
    """Each changed input is one line naming its path and how it changed: added or no longer an input,
    an earlier stage's output edited, re-made, from other settings or not yet current, rows that differ,
    were added or removed (where rows were recorded), which of a checkpoint's files changed, the charter."""
    from align.manifests.differences import differences

    old_rows, new_rows = rows or (None, None)
    old = {"stage": "train", "settings": {}, "inputs": old_inputs}
    assert differences("train", old, _manifest(inputs=new_inputs), old_rows, new_rows) == expected


def test_a_refused_rerun_counts_changed_rows_reading_only_the_changed_record_inputs(tmp_path, monkeypatch):
    """Row counts come from the rows recorded with the output and the inputs read again now; an unchanged
    input is not read, an unreadable one is named as changed without counts (the others still get theirs),
    and a manifest that differs in no named setting or input says so."""
    import importlib

    from align.manifests.differences import explain
    from align.manifests.inputs import row_digests
    from align.manifests.state import ROWS_FILE

    def write(path: Path, ids: list[str], answer: str = "yes") -> list[dict]:
        records = [{"id": i, "answer": answer if i == "a0" else "yes"} for i in ids]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return records

    out, shards = tmp_path / "out", tmp_path / "shards"
    out.mkdir()
    shards.mkdir()
    broken, prompts, same = tmp_path / "broken.jsonl", tmp_path / "prompts.jsonl", tmp_path / "same.jsonl"
    recorded_rows = {"broken": {"a0": "x"}, "shards": row_digests(write(shards / "s0.jsonl", ["a0"])),
                     "prompts": row_digests(write(prompts, ["a0", "a1"])), "same": row_digests(write(same, ["a0"]))}
    (out / ROWS_FILE).write_text(json.dumps(recorded_rows))
    broken.write_text('{"id": "a0"\n{not json\n')
    write(shards / "s1.jsonl", ["a1"])
    write(prompts, ["a0", "a1", "a2"], answer="no")
    kinds = {"broken": "file", "shards": "directory", "prompts": "file", "same": "file"}
    paths = {"broken": broken, "shards": shards, "prompts": prompts, "same": same}
    recorded = {"stage": "train", "settings": {},
                "inputs": {k: _file(str(paths[k]), "old" if k != "same" else "s", kinds[k]) for k in kinds}}
    new = _manifest(inputs={k: _file(str(paths[k]), "new" if k != "same" else "s", kinds[k]) for k in kinds})
    differences_module = importlib.import_module("align.manifests.differences")  # not the package's function
    read, real = [], differences_module.read_records
    monkeypatch.setattr(differences_module, "read_records", lambda path: read.append(path) or real(path))
    assert explain("train", out, recorded, new) == [
        f"train.broken ({broken}): content changed",
        f"train.prompts ({prompts}): content changed (1 row differs, 1 added)",
        f"train.shards ({shards}): content changed (1 added)",
    ]
    assert read == [str(broken), str(shards), str(prompts)]
    assert explain("train", out, {**recorded, "inputs": new.inputs}, new) == [
        "the recorded manifest differs (no setting or input differs by name: written by another version?)"]


def test_a_rerun_with_another_setting_and_edited_rows_is_refused_naming_both(tmp_path, rows):
    """End to end: a finished pairs output rerun with another seed over an edited input is refused, and the
    refusal names the setting (before → after) and how many of the input's rows differ or were added."""
    out = tmp_path / "pairs"
    run = StageRun.begin("pairs", pairs_config(rows, out))
    try:
        run.read("input")
        run.start()
        (run.output_dir / "data.txt").write_text("made\n")
        run.finish({}, announce=False)
    finally:
        run.close()
    edited = [annotated(f"a{i}") for i in range(4)]
    edited[1]["answer"] = "no"
    rows.write_text("".join(json.dumps(r) + "\n" for r in edited))
    refusal = rerun("pairs", pairs_config(rows, out, seed=1))
    assert "pairs.seed: 0 → 1" in refusal
    assert f"pairs.input ({rows}): content changed (1 row differs, 1 added)" in refusal


# --------------------------------------------------------------------------- the run's edges: locks, launches, reads


def lock_is_held(out: Path) -> bool:
    """Whether a run holds ``out``'s writer lock, as another process would find it (flock conflicts between
    two opens of the file even within one process)."""
    import fcntl
    import os

    path = out / ".align-writer.lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_run_never_begun_writes_nothing_and_ends_quietly(tmp_path, rows):
    """A ``StageRun`` made without ``begin`` has decided nothing: start, the owner check and finish do nothing
    (finish hands the summary back), and its input fingerprint is that of no input."""
    out = tmp_path / "out"
    run = StageRun("toy", Toy(str(rows), str(out)))
    assert not run.skip and not run.resumed
    run.start()
    run.check_owner()
    assert run.finish({"rows": 3}) == {"rows": 3}
    run.close()
    assert not out.exists()
    begun = StageRun.begin("toy", Toy(str(rows), str(tmp_path / "other")))
    begun.close()
    assert run.input_fingerprint("input") == begun.input_fingerprint("no_such_input")


def test_a_skipped_run_takes_no_lock_and_writes_nothing(tmp_path, rows):
    """A stage that calls ``start`` on a run that skips (complete and current) changes nothing there: no lock is
    held, so another run may read or write the directory."""
    out = tmp_path / "out"
    made("toy", Toy(str(rows), str(out)))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    run = StageRun.begin("toy", Toy(str(rows), str(out)))
    assert run.skip
    run.start()
    assert not lock_is_held(out)
    run.close()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_run_holds_its_directorys_lock_naming_itself_until_it_ends(tmp_path, rows):
    """From start to finish the writer lock is held and names this process, its host and since when (what a
    refused second run prints); once the run ends it is free, and the next run in this process holds it
    again."""
    import os
    import re
    import socket

    out = tmp_path / "out"
    first = StageRun.begin("toy", Toy(str(rows), str(out)))
    first.start()
    assert lock_is_held(out)
    note = (out / ".align-writer.lock").read_text()
    assert re.fullmatch(rf"pid {os.getpid()} on {re.escape(socket.gethostname())}, since "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", note)
    first.finish({}, announce=False)
    assert not lock_is_held(out)
    second = StageRun.begin("toy", Toy(str(rows), str(out), seed=1), overwrite=True)
    second.start()
    assert lock_is_held(out)
    second.close()
    assert not lock_is_held(out)


def test_runs_into_two_directories_each_hold_their_own_lock(tmp_path, rows):
    one, two = tmp_path / "one", tmp_path / "two"
    first = StageRun.begin("toy", Toy(str(rows), str(one)))
    second = StageRun.begin("toy", Toy(str(rows), str(two)))
    first.start()
    second.start()
    assert lock_is_held(one) and lock_is_held(two)
    first.close()
    assert not lock_is_held(one) and lock_is_held(two)
    second.close()
    assert not lock_is_held(two)


def test_a_run_that_raised_leaves_its_lock_to_the_next_run_which_releases_it(tmp_path, rows):
    """A notebook cell that failed mid-run never ended its run: the next run in the process takes its lock over,
    releases it when it ends, and closing the abandoned run later is harmless."""
    out = tmp_path / "out"
    abandoned = StageRun.begin("toy", Toy(str(rows), str(out)))
    abandoned.start()
    (out / "data.txt").write_text("half\n")
    again = StageRun.begin("toy", Toy(str(rows), str(out)))
    assert again.resumed
    again.start()
    assert lock_is_held(out)
    again.finish({}, announce=False)
    assert not lock_is_held(out)
    abandoned.close()
    assert not lock_is_held(out)


def test_the_writer_lock_has_the_permissions_of_the_files_the_stage_writes(tmp_path, rows):
    """Readable by whoever may read the output (a refused run reads who holds it), never executable."""
    import os
    import stat

    out = tmp_path / "out"
    mask = os.umask(0o022)
    try:
        made("toy", Toy(str(rows), str(out)))
    finally:
        os.umask(mask)
    lock_mode = stat.S_IMODE((out / ".align-writer.lock").stat().st_mode)
    assert lock_mode == stat.S_IMODE((out / "data.txt").stat().st_mode) == 0o644


@pytest.mark.parametrize(("note", "named"), [(b"", "another process"),
                                             (b"pid 7 on n\xff\xfe1", "pid 7 on n\ufffd\ufffd1")])
def test_a_refusal_names_the_holder_even_when_its_note_is_empty_or_not_text(tmp_path, rows, note, named):
    """The lock of another writer (here held apart from any run) whose note is empty, or not UTF-8 (another
    tool, a torn write), still gives the refusal naming what it can."""
    import fcntl
    import os

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".align-writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, note)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        run = StageRun.begin("toy", Toy(str(rows), str(out)))
        try:
            with pytest.raises(InputError) as refused:
                run.start()
        finally:
            run.close()
        assert f"toy: another run is writing {out} ({named}); two runs never write" in str(refused.value)
        assert not (out / "_manifest.json").exists()
    finally:
        os.close(fd)


def test_an_output_dir_that_cannot_hold_the_output_is_refused_naming_the_stage(tmp_path, rows):
    from align.errors import ConfigError

    data = tmp_path / "data"
    data.mkdir()
    inside = data / "rows.jsonl"
    inside.write_bytes(rows.read_bytes())
    with pytest.raises(ConfigError, match=rf"^toy: output_dir={str(data)!r} holds its input input="):
        StageRun.begin("toy", Toy(str(inside), str(data)))
    with pytest.raises(InputError, match=rf"^toy: output_dir={str(rows)!r}: .* is a file, not a directory"):
        StageRun.begin("toy", Toy(str(tmp_path / "data" / "rows.jsonl"), str(rows)))


def test_finish_says_where_it_wrote_and_what_by_default(tmp_path, rows, capsys):
    out = tmp_path / "out"
    run = StageRun.begin("toy", Toy(str(rows), str(out)))
    run.start()
    run.finish({"rows": 3})
    printed = capsys.readouterr().out
    assert f"[align toy] wrote {out}\n" in printed and '[align toy] {"rows": 3}\n' in printed


def test_a_file_written_after_the_run_ended_is_not_the_stages(tmp_path, rows):
    """Once the run has ended, what the library writes into the directory (a user's own notes through
    ``write_jsonl``) is not in the stage's ledger, so an overwrite keeps it."""
    from align.io import write_jsonl
    from align.io.ledger import written

    out = tmp_path / "out"
    made("toy", Toy(str(rows), str(out)))
    write_jsonl(out / "my_notes.jsonl", [{"note": "keep"}])
    assert "my_notes.jsonl" not in written(out)
    made("toy", Toy(str(rows), str(out), seed=1), overwrite=True)
    assert (out / "my_notes.jsonl").exists()


def test_a_files_digest_is_remembered_only_within_a_run(tmp_path, rows, monkeypatch):
    """Within a run each file is hashed once; after the run it is hashed again (a file rewritten within one clock
    tick keeps its size and times, and must not keep its old digest)."""
    from align.io import fingerprint

    monkeypatch.setattr(fingerprint, "_MEMO", [])  # not what runs other tests left open (a refused start)
    run = StageRun.begin("toy", Toy(str(rows), str(tmp_path / "out")))
    run.close()
    hashed = []
    real = fingerprint._hash_file
    monkeypatch.setattr(fingerprint, "_hash_file", lambda path: hashed.append(path) or real(path))
    fingerprint.file_digest(rows)
    fingerprint.file_digest(rows)
    assert len(hashed) == 2


# --------------------------------------------------------------------------- a sharded job's run


def test_a_jobs_tasks_share_the_directory_and_finish_it_with_one_output_id(tmp_path, rows):
    """Two tasks of a sharded job write their own shards into one directory (neither holds it alone); whichever
    finishes marks the output with an id drawn from the shards' done markers, the same for both, and a job
    made again elsewhere gets a new id."""
    from align.jobs.runner import run_job

    def task(out: Path, index: int) -> StageRun:
        run = StageRun.begin("toy", Toy(str(rows), str(out)), job=True)
        records = run.read("input")
        run.start()
        run_job(records, lambda batch: batch, out, shard_index=index, num_shards=2)
        return run

    def output_id(out: Path) -> str:
        return json.loads((out / "_COMPLETE.json").read_text())["output_id"]

    out = tmp_path / "out"
    first, second = task(out, 0), task(out, 1)
    first.finish({}, announce=False)
    once = output_id(out)
    second.finish({}, announce=False)
    assert output_id(out) == once
    again = tmp_path / "again"
    one, two = task(again, 0), task(again, 1)
    one.finish({}, announce=False)
    two.close()
    assert output_id(again) != once


def test_a_jobs_shard_writes_stop_once_another_run_took_the_directory(tmp_path, rows):
    """A run on another node recorded its own manifest in the directory: this task's next shard write stops."""
    from align.jobs.runner import run_job

    out = tmp_path / "out"
    run = StageRun.begin("toy", Toy(str(rows), str(out)), job=True)
    records = run.read("input")
    run.start()
    manifest = json.loads((out / "_manifest.json").read_text())
    (out / "_manifest.json").write_text(json.dumps({**manifest, "fingerprint": "another run's"}))
    try:
        with pytest.raises(StaleOutputError, match="taken over by another run"):
            run_job(records, lambda batch: batch, out)
    finally:
        run.close()
    assert not list(out.glob("shard-*.done.json"))


def test_a_jobs_overwrite_is_refused_while_a_shard_is_being_written(tmp_path, rows):
    import fcntl
    import os

    out = tmp_path / "out"
    made("toy", Toy(str(rows), str(out)), job=True)
    fd = os.open(out / "shard-0-of-2.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        run = StageRun.begin("toy", Toy(str(rows), str(out), seed=1), job=True, overwrite=True)
        try:
            with pytest.raises(InputError, match=r"^toy: overwrite=true, but shard-0-of-2 is being written by "
                                                 "another task"):
                run.start()
        finally:
            run.close()
    finally:
        os.close(fd)
    assert (out / "_COMPLETE.json").exists()


# --------------------------------------------------------------------------- one decision per launch


class Launch:
    """A two-rank distributed launch played in one process: what rank 0 broadcasts, rank 1 receives in order;
    barriers are counted."""

    def __init__(self, monkeypatch):
        self.monkeypatch, self.sent, self.barriers, self.rank = monkeypatch, [], 0, 0

    def as_rank(self, rank: int) -> None:
        self.rank = rank
        self.monkeypatch.setenv("RANK", str(rank))

    def get_rank(self) -> int:
        return self.rank

    def broadcast_object_list(self, box: list, src: int = 0) -> None:
        if self.rank == src:
            self.sent.append(box[0])
        else:
            box[0] = self.sent.pop(0)

    def barrier(self) -> None:
        self.barriers += 1


@pytest.fixture()
def launch(monkeypatch) -> Launch:
    from align import ranks

    group = Launch(monkeypatch)
    monkeypatch.setattr(ranks, "launch_group", lambda: group)
    group.as_rank(0)
    return group


def test_the_other_ranks_follow_rank_zeros_decision_and_leave_the_writing_to_it(tmp_path, rows, launch):
    """Rank 0 decides (here: resume a partial output), records the manifest and holds the directory; rank 1
    takes that decision as it is, even where the inputs it would look at changed meanwhile, and neither locks,
    records nor marks anything; both meet at the barrier after start."""
    out = tmp_path / "out"
    partial = StageRun.begin("toy", Toy(str(rows), str(out)))  # a launch killed earlier
    partial.start()
    (out / "data.txt").write_text("half\n")
    partial.close()
    launch.sent.clear()
    launch.barriers = 0

    zero = StageRun.begin("toy", Toy(str(rows), str(out)))
    assert zero.resumed and not zero.skip
    zero.start()
    assert launch.barriers == 1 and lock_is_held(out)
    recorded = (out / "_manifest.json").read_text()
    rows.write_text(rows.read_text() + json.dumps(annotated("a9")) + "\n")  # after rank 0 decided

    launch.as_rank(1)
    one = StageRun.begin("toy", Toy(str(rows), str(out)))
    assert one.resumed and not one.skip
    one.start()
    assert launch.barriers == 2 and (out / "_manifest.json").read_text() == recorded
    assert one.finish({"rows": 3}) == {"rows": 3} and not (out / "_COMPLETE.json").exists()
    launch.as_rank(0)
    zero.finish({}, announce=False)
    assert (out / "_COMPLETE.json").exists() and not lock_is_held(out)


def test_a_skip_decided_on_rank_zero_is_a_skip_on_every_rank(tmp_path, rows, launch):
    out = tmp_path / "out"
    made("toy", Toy(str(rows), str(out)))
    launch.sent.clear()
    zero = StageRun.begin("toy", Toy(str(rows), str(out)))
    launch.as_rank(1)
    one = StageRun.begin("toy", Toy(str(rows), str(out)))
    assert zero.skip and one.skip and not one.resumed


def test_a_refusal_on_rank_zero_stops_every_rank(tmp_path, rows, launch):
    """Rank 0 refuses the rerun (other settings over a finished output): the other ranks stop too, saying
    rank 0 stopped, instead of waiting for a decision that never comes."""
    out = tmp_path / "out"
    made("toy", Toy(str(rows), str(out)))
    launch.sent.clear()
    with pytest.raises(StaleOutputError, match="made from other settings"):
        StageRun.begin("toy", Toy(str(rows), str(out), seed=1))
    launch.as_rank(1)
    with pytest.raises(InputError, match=r"^toy: rank 0 stopped before the run started"):
        StageRun.begin("toy", Toy(str(rows), str(out), seed=1))


def edited_stage_output(tmp_path: Path, rows: Path) -> Path:
    """A finished stage output (its rows in ``rows.jsonl``) whose rows were edited since it was made."""
    out = tmp_path / "earlier"
    run = StageRun.begin("toy", Toy(str(rows), str(out)))
    run.start()
    (out / "rows.jsonl").write_bytes(rows.read_bytes())
    run.finish({}, announce=False)
    with (out / "rows.jsonl").open("a") as handle:
        handle.write(json.dumps(annotated("a9")) + "\n")
    return out


def test_an_edited_stage_output_is_refused_by_read_and_check(tmp_path, rows):
    earlier = edited_stage_output(tmp_path, rows)
    run = StageRun("next", Toy(str(earlier), str(tmp_path / "next")))
    for use in (run.read, run.check):
        with pytest.raises(InputError, match=rf"^next: input={str(earlier)!r}: the toy stage's output changed"):
            use("input")


def test_rank_zero_verifies_the_stage_outputs_it_reads_and_the_other_ranks_leave_it_to_rank_zero(
        tmp_path, rows, launch):
    """Rank 0 hashes the files of an earlier stage's output once for the launch (and refuses an edited one); the
    other ranks do not hash them again."""
    earlier = edited_stage_output(tmp_path, rows)
    run = StageRun("next", Toy(str(earlier), str(tmp_path / "next")))
    for use in (run.read, run.check):
        with pytest.raises(InputError, match="the toy stage's output changed"):
            use("input")
    launch.as_rank(1)
    assert len(run.read("input")) == 4 and run.check("input") == str(earlier)


# --------------------------------------------------------------------------- reading and checking inputs


def write_rows(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_several_paths_are_read_as_one_input(tmp_path, rows):
    """Their rows in order; an empty file among them adds nothing; rows whose id is not a string (or that have
    none) are never compared."""
    first = write_rows(tmp_path / "one.jsonl", [{"id": "a", "n": 1}, {"id": 7, "n": 2}, {"n": 3}])
    empty = write_rows(tmp_path / "empty.jsonl", [])
    second = write_rows(tmp_path / "two.jsonl", [{"id": "b", "n": 4}, {"id": 7, "n": 5}, {"n": 6}])
    run = StageRun("toy", Toy(str(rows), str(tmp_path / "out")))
    assert [r["n"] for r in run.read("input", [str(first), str(empty), str(second)])] == [1, 2, 3, 4, 5, 6]
    assert [r["n"] for r in run.read("input", [first, empty])] == [1, 2, 3]
    assert [r["id"] for r in run.read("input")] == ["a0", "a1", "a2"]
    assert [r["n"] for r in run.read("input", str(second))] == [4, 5, 6]


def test_an_id_in_two_input_files_is_refused_naming_both(tmp_path, rows):
    first = write_rows(tmp_path / "one.jsonl", [{"id": "a"}, {"id": "b"}])
    second = write_rows(tmp_path / "two.jsonl", [{"id": "c"}, {"id": "b"}])
    run = StageRun("toy", Toy(str(rows), str(tmp_path / "out")))
    with pytest.raises(InputError, match=rf"^toy: id 'b' is in {first} and in {second}: the inputs of input must"):
        run.read("input", [str(first), str(second)])


def test_an_input_with_no_rows_is_refused_naming_it(tmp_path, rows):
    empty = write_rows(tmp_path / "empty.jsonl", [])
    also = write_rows(tmp_path / "also.jsonl", [])
    run = StageRun("toy", Toy(str(rows), str(tmp_path / "out")))
    with pytest.raises(InputError, match=rf"^toy: input={str(empty)!r} holds no rows$"):
        run.read("input", str(empty))
    with pytest.raises(InputError, match=r"^toy: input=\[.*'.*empty.jsonl', '.*also.jsonl'\] hold no rows$"):
        run.read("input", [str(empty), str(also)])
    with pytest.raises(InputError, match="holds no rows"):
        run.read("input", [str(empty)])


def test_a_missing_or_unfinished_input_is_refused_naming_the_stage_and_key(tmp_path, rows):
    """By ``read`` and by ``check`` (an input the stage streams itself), for the config's path or one given."""
    from align.errors import ConfigError, MissingInputError

    missing = tmp_path / "typo.jsonl"
    unfinished = tmp_path / "sampling"
    unfinished.mkdir()
    (unfinished / "_job.json").write_text("{}")
    run = StageRun("toy", Toy(str(missing), str(tmp_path / "out")))
    for use in (run.read, run.check):
        with pytest.raises(MissingInputError, match=rf"^toy: input={str(missing)!r} does not exist"):
            use("input")
        with pytest.raises(InputError, match=rf"^toy: input={str(unfinished)!r} is an unfinished stage output"):
            use("input", str(unfinished))
    with pytest.raises(ConfigError, match="^toy: set input$"):
        StageRun("toy", Toy("", str(tmp_path / "out"))).check("input")


def test_check_hands_back_the_path_it_checked(tmp_path, rows):
    run = StageRun("toy", Toy(str(rows), str(tmp_path / "out")))
    other = write_rows(tmp_path / "other.jsonl", [{"id": "x"}])
    assert run.check("input") == str(rows)
    assert run.check("input", str(other)) == str(other)
    assert run.check("input", other) == str(other)


# --------------------------------------------------------------------------- an input's fingerprint


def test_an_inputs_fingerprint_follows_its_content_not_its_path(tmp_path, rows):
    """What a stage keys a cache of its input by (SFT's normalized rows): the same rows moved elsewhere have the
    same fingerprint, other rows another one."""
    def fingerprint(path: Path, out: str) -> str:
        run = StageRun.begin("toy", Toy(str(path), str(tmp_path / out)))
        run.close()
        return run.input_fingerprint("input")

    moved = tmp_path / "elsewhere" / "rows.jsonl"
    moved.parent.mkdir()
    moved.write_bytes(rows.read_bytes())
    other = write_rows(tmp_path / "other.jsonl", [annotated("z")])
    here = fingerprint(rows, "one")
    assert fingerprint(moved, "two") == here
    assert fingerprint(other, "three") != here


def test_closing_an_abandoned_run_leaves_the_lock_of_the_run_that_took_it_over(tmp_path):
    """A notebook keeps the object of a run that raised; a new run takes its lock over. Tidying the old
    object up later must not free the new run's lock (another process could then write beside it), nor,
    once the new run has ended, close a descriptor number that a file of the user's now has."""
    import fcntl
    import os

    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "a"}) + "\n")
    out = tmp_path / "out"

    @dataclass
    class Toy:
        input: str = ""
        output_dir: str = ""
        seed: int = 0

    def held() -> bool:
        fd = os.open(out / ".align-writer.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    abandoned = StageRun.begin("toy", Toy(str(rows), str(out)))
    abandoned.start()
    again = StageRun.begin("toy", Toy(str(rows), str(out)))
    again.start()
    abandoned.close()
    assert held()  # still the new run's
    again.finish({})
    again.close()
    assert not held()
    with open(tmp_path / "mine.txt", "w") as mine:  # may reuse the descriptor number the lock had
        abandoned.close()
        mine.write("still open")
    assert (tmp_path / "mine.txt").read_text() == "still open"
