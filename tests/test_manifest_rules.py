"""The rerun rules of a stage output, as a user meets them: what a rerun skips, resumes, refuses or redoes,
what ``overwrite=true`` removes and what it keeps, what ``_COMPLETE.json`` records of the files a stage
wrote, and which of them changed since (align.manifests.rerun, .state, .outputs).

A toy stage (a small dataclass config, one input file, files written by hand) runs through ``StageRun``:
no model, no subprocess.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from align.io.fingerprint import file_digest
from align.manifests import StageRun, StaleOutputError, begin, completion_fields, rerun, start
from align.manifests.redaction import is_secret_key, redact

STAGE = "toy"


@dataclass
class Toy:
    """A stage's config: the rows it reads, where it writes, one setting that counts."""

    input: str = ""
    output_dir: str = ""
    seed: int = 0
    overwrite: bool = False


@pytest.fixture()
def rows(tmp_path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"a{i}", "text": f"row {i}"}) + "\n" for i in range(3)))
    return path


@pytest.fixture(autouse=True)
def a_plain_process(monkeypatch):
    """Rank 0 (or no launch at all), unless a test says otherwise."""
    monkeypatch.delenv("RANK", raising=False)


def forward(out: Path) -> str:
    return f"use another output_dir, or overwrite=true to remove what the stage wrote in {out} and redo it"


def toy(out: Path, rows: Path, files: dict | None = None, *, seed: int = 0, overwrite: bool = False,
        finish: bool = True, stage: str = STAGE, read: bool = True) -> StageRun:
    """One run of the toy stage: begin, read its rows, start, write ``files`` (relative path -> text or
    bytes; default one data file), then finish (or stop there, as a killed run does)."""
    run = StageRun.begin(stage, Toy(str(rows), str(out), seed, overwrite))
    if run.skip:
        return run
    try:
        if read:
            run.read("input")
        run.start()
        for rel, content in (files if files is not None else {"data.txt": f"seed {seed}\n"}).items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        if finish:
            run.finish({"rows": 3}, announce=False)
    finally:
        run.close()
    return run


def complete(out: Path) -> dict:
    return json.loads((out / "_COMPLETE.json").read_text())


def manifest_file(out: Path) -> dict:
    return json.loads((out / "_manifest.json").read_text())


def decision(run_or_begun) -> tuple:
    begun = getattr(run_or_begun, "begun", run_or_begun)
    return begun.skip, begun.resumed, begun.overwrite, begun.redo


# --------------------------------------------------------------------------- what a rerun decides


def test_a_fresh_output_starts_and_a_finished_one_is_skipped_with_its_manifest(tmp_path, rows, capsys):
    out = tmp_path / "out"
    first = StageRun.begin(STAGE, Toy(str(rows), str(out)))
    try:
        assert decision(first) == (False, False, False, False)
        first.read("input")
        first.start()
        (out / "data.txt").write_text("seed 0\n")
        first.finish({}, announce=False)
    finally:
        first.close()
    assert (out / "_manifest.json").is_file()
    recorded = manifest_file(out)
    assert recorded["stage"] == STAGE and recorded["settings"]["seed"] == 0
    assert isinstance(recorded["started_at"], float)
    assert complete(out)["manifest_fingerprint"] == recorded["fingerprint"]

    capsys.readouterr()
    again = begin(STAGE, Toy(str(rows), str(out)), out)
    assert decision(again) == (True, False, False, False)
    assert again.output_dir == out and again.manifest.fingerprint == recorded["fingerprint"]
    assert capsys.readouterr().out == (f"[align {STAGE}] {out} is already complete; skipping (made from the same "
                                       "settings and inputs)\n")
    assert StageRun.begin(STAGE, Toy(str(rows), str(out))).skip


def test_a_partial_output_of_the_same_settings_is_resumed_and_its_manifest_kept(tmp_path, rows):
    out = tmp_path / "out"
    toy(out, rows, {"part-1.txt": "half\n"}, finish=False)
    before = (out / "_manifest.json").read_bytes()
    run = StageRun.begin(STAGE, Toy(str(rows), str(out)))
    try:
        assert run.resumed and decision(run) == (False, True, False, False)
        run.read("input")
        run.start()
        assert (out / "_manifest.json").read_bytes() == before  # the first attempt's start, as it was
        assert (out / "part-1.txt").read_text() == "half\n"
    finally:
        run.close()


def test_a_run_that_stopped_before_writing_anything_leaves_nothing_to_resume_or_refuse(tmp_path, rows):
    """Only the library's files and the user's own (there before it started): the next run starts afresh,
    whatever its settings."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("mine\n")
    toy(out, rows, {}, finish=False)
    assert "README.md" in manifest_file(out)["preexisting"]
    same = StageRun.begin(STAGE, Toy(str(rows), str(out)))
    same.close()
    assert decision(same) == (False, False, False, False)
    other = toy(out, rows, seed=1)  # no overwrite needed
    assert decision(other) == (False, False, False, False)
    assert complete(out)["manifest"]["settings"]["seed"] == 1
    assert sorted(complete(out)["files"]) == ["data.txt"]
    assert (out / "README.md").read_text() == "mine\n"


def test_a_file_added_beside_a_stopped_run_survives_the_overwrite_that_follows_and_the_next(tmp_path, rows):
    """A file that appears after a run started reads as that run's (partial); overwrite=true keeps it all the
    same (the stage's ledger does not list it), and from then on it is recorded as there before."""
    out = tmp_path / "out"
    toy(out, rows, {}, finish=False)
    (out / "later.md").write_text("added after the stopped run\n")
    with pytest.raises(StaleOutputError, match="holds a partial output made from other settings"):
        toy(out, rows, seed=1)
    toy(out, rows, seed=1, overwrite=True)
    assert sorted(complete(out)["files"]) == ["data.txt"]
    assert "later.md" in manifest_file(out)["preexisting"]
    toy(out, rows, seed=2, overwrite=True)
    assert (out / "later.md").read_text() == "added after the stopped run\n"


def test_other_settings_are_refused_word_for_word_over_a_finished_and_a_partial_output(tmp_path, rows):
    done, part = tmp_path / "done", tmp_path / "part"
    toy(done, rows)
    toy(part, rows, finish=False)
    with pytest.raises(StaleOutputError) as info:
        StageRun.begin(STAGE, Toy(str(rows), str(done), seed=1))
    assert str(info.value) == (f"{STAGE}: {done} holds an output made from other settings or inputs: "
                               f"{STAGE}.seed: 0 → 1. {forward(done)}")
    with pytest.raises(StaleOutputError) as info:
        StageRun.begin(STAGE, Toy(str(rows), str(part), seed=2))
    assert str(info.value) == (f"{STAGE}: {part} holds a partial output made from other settings or inputs: "
                               f"{STAGE}.seed: 0 → 2. {forward(part)}")
    with pytest.raises(StaleOutputError, match="holds an output made from other settings"):
        begin(STAGE, Toy(str(rows), str(done), seed=1), done)  # overwrite is off unless asked for
    assert complete(done)["manifest"]["settings"]["seed"] == 0


def test_other_settings_over_an_edited_output_name_the_settings_not_the_edit(tmp_path, rows):
    out = tmp_path / "out"
    toy(out, rows)
    (out / "data.txt").write_text("seed 9\n")  # same size, other bytes
    with pytest.raises(StaleOutputError) as info:
        StageRun.begin(STAGE, Toy(str(rows), str(out), seed=1))
    assert str(info.value) == (f"{STAGE}: {out} holds an output made from other settings or inputs: "
                               f"{STAGE}.seed: 0 → 1. {forward(out)}")
    run = StageRun.begin(STAGE, Toy(str(rows), str(out), seed=1), overwrite=True)
    run.close()
    assert decision(run) == (False, False, True, False)


def test_another_stages_output_is_refused_even_under_overwrite(tmp_path, rows):
    out = tmp_path / "out"
    toy(out, rows, stage="other")
    for overwrite in (False, True):
        with pytest.raises(StaleOutputError) as info:
            StageRun.begin(STAGE, Toy(str(rows), str(out)), overwrite=overwrite)
        assert str(info.value) == (f"{STAGE}: {out} holds the other stage's output; choose another output_dir "
                                   "(overwrite=true never removes another stage's output)")
    assert (out / "data.txt").exists() and complete(out)["stage"] == "other"


def test_an_output_written_without_a_manifest_is_refused_and_left_alone(tmp_path, rows):
    out = tmp_path / "out"
    out.mkdir()
    (out / "pairs.jsonl").write_text('{"id": "x"}\n')
    for overwrite in (False, True):
        with pytest.raises(StaleOutputError) as info:
            StageRun.begin(STAGE, Toy(str(rows), str(out)), overwrite=overwrite)
        assert str(info.value) == (
            f"{STAGE}: {out} holds a stage output written without a manifest (by an earlier version of align), "
            "so what it was made from, and which of its files the stage wrote, are unknown: remove it yourself, "
            "or use another output_dir")
    assert sorted(p.name for p in out.iterdir()) == ["pairs.jsonl"]


# --------------------------------------------------------------------------- what a finished output records


def test_the_completion_record_lists_every_file_written_with_digests_and_leaves_symlinks_out(tmp_path, rows):
    out = tmp_path / "out"
    weights = b"w" * 64

    def write_links():
        (out / "a-link").symlink_to(out / "data.txt")  # a symbolic link the stage made, to its own file
        (out / "ckpt" / "link").symlink_to(out / "data.txt")
        (out / "ckpt" / "empty").mkdir()

    run = StageRun.begin(STAGE, Toy(str(rows), str(out)))
    try:
        run.read("input")
        run.start()
        for rel, text in {"a.txt": "a\n", "data.txt": "seed 0\n", "ckpt/b.txt": "b\n",
                          "ckpt/sub/c.txt": "c\n"}.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text)
        (out / "model.safetensors").write_bytes(weights)
        write_links()
        run.finish({}, announce=False)
    finally:
        run.close()
    files = complete(out)["files"]
    assert sorted(files) == ["a.txt", "ckpt/b.txt", "ckpt/sub/c.txt", "data.txt", "model.safetensors"]
    for rel in ("a.txt", "ckpt/b.txt", "ckpt/sub/c.txt", "data.txt"):
        stat = (out / rel).stat()
        assert files[rel] == {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "digest": file_digest(out / rel)}
    stat = (out / "model.safetensors").stat()
    assert files["model.safetensors"] == {"size": 64, "mtime_ns": stat.st_mtime_ns}  # weights: no digest
    assert StageRun.begin(STAGE, Toy(str(rows), str(out))).skip


def test_rows_are_recorded_only_for_an_input_read_as_rows(tmp_path, rows):
    from align.io import read_records
    from align.manifests.inputs import row_digests

    read, streamed = tmp_path / "read", tmp_path / "streamed"
    toy(read, rows)
    assert json.loads((read / "_manifest_rows.json").read_text()) == {"input": row_digests(read_records(rows))}
    toy(streamed, rows, read=False)
    assert not (streamed / "_manifest_rows.json").exists()


# --------------------------------------------------------------------------- changed since it was made


def test_missing_files_are_each_named(tmp_path, rows):
    out = tmp_path / "out"
    toy(out, rows, {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"})
    (out / "a.txt").unlink()
    (out / "b.txt").unlink()
    with pytest.raises(StaleOutputError) as info:
        StageRun.begin(STAGE, Toy(str(rows), str(out)))
    assert str(info.value) == (f"{STAGE}: {out} changed since it was made: a.txt (missing); b.txt (missing). "
                               f"{forward(out)}")


def test_a_rewritten_weight_file_of_the_same_size_is_named(tmp_path, rows):
    out = tmp_path / "out"
    toy(out, rows, {"model.safetensors": b"w" * 64})
    path = out / "model.safetensors"
    stat = path.stat()
    path.write_bytes(b"v" * 64)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(StaleOutputError) as info:
        StageRun.begin(STAGE, Toy(str(rows), str(out)))
    assert str(info.value) == (f"{STAGE}: {out} changed since it was made: model.safetensors (rewritten since). "
                               f"{forward(out)}")


def test_an_edited_output_is_redone_under_overwrite_removing_what_the_stage_wrote_first(tmp_path, rows, capsys):
    out = tmp_path / "out"
    toy(out, rows, {"data.txt": "seed 0\n", "extra.txt": "x\n", "ckpt/sub/w.txt": "w\n"})
    (out / "notes.txt").write_text("mine\n")
    recorded = manifest_file(out)
    recorded["started_at"] = 1.0
    (out / "_manifest.json").write_text(json.dumps(recorded))
    (out / "data.txt").write_text("seed 9\n")
    run = StageRun.begin(STAGE, Toy(str(rows), str(out)), overwrite=True)
    try:
        assert decision(run) == (False, False, True, True)
        run.read("input")
        capsys.readouterr()
        run.start()
        assert not (out / "data.txt").exists() and not (out / "extra.txt").exists() and not (out / "ckpt").exists()
        assert (out / "notes.txt").read_text() == "mine\n"
        assert capsys.readouterr().out == (f"[align {STAGE}] overwrite=true: removed the 6 entries the stage wrote "
                                           f"in {out}; kept 1 it did not write: notes.txt\n")
        assert manifest_file(out)["started_at"] > 1.0  # this run's start
        (out / "data.txt").write_text("seed 0\n")
        run.finish({}, announce=False)
    finally:
        run.close()
    assert StageRun.begin(STAGE, Toy(str(rows), str(out))).skip


def test_an_edited_output_whose_ledger_is_lost_is_still_cleaned_by_its_completion_record(tmp_path, rows):
    """The completion record lists what the stage wrote, nested files by their top-level entry."""
    out = tmp_path / "out"
    toy(out, rows, {"data.txt": "seed 0\n", "ckpt/sub/w.txt": "w\n"})
    (out / "_written.jsonl").unlink()
    (out / "notes.txt").write_text("mine\n")
    (out / "data.txt").write_text("seed 9\n")
    run = StageRun.begin(STAGE, Toy(str(rows), str(out)), overwrite=True)
    try:
        run.read("input")
        run.start()
        assert not (out / "ckpt").exists() and not (out / "data.txt").exists()
        assert (out / "notes.txt").exists()
    finally:
        run.close()


# --------------------------------------------------------------------------- what overwrite removes and keeps


def test_overwrite_keeps_the_users_files_hidden_files_and_what_was_there_before(tmp_path, rows, capsys):
    from align.io import write_json

    out = tmp_path / "out"
    (out / "mine").mkdir(parents=True)
    (out / "mine" / "user.txt").write_text("u\n")
    (out / "README.md").write_text("readme\n")
    run = StageRun.begin(STAGE, Toy(str(rows), str(out)))
    try:
        run.read("input")
        run.start()
        (out / "data.txt").write_text("seed 0\n")
        (out / "ckpt" / "sub").mkdir(parents=True)
        (out / "ckpt" / "sub" / "w.txt").write_text("w\n")
        write_json(out / "mine" / "stage.json", {"by": "the stage"})  # into a directory that was there before
        run.finish({}, announce=False)
    finally:
        run.close()
    assert {"README.md", "mine"} <= set(manifest_file(out)["preexisting"])
    assert not {"data.txt", "ckpt"} & set(manifest_file(out)["preexisting"])
    (out / "notes.txt").write_text("notes\n")
    (out / ".hidden").write_text("h\n")

    second = StageRun.begin(STAGE, Toy(str(rows), str(out), seed=1), overwrite=True)
    try:
        second.read("input")
        capsys.readouterr()
        second.start()
        assert capsys.readouterr().out == (f"[align {STAGE}] overwrite=true: removed the 5 entries the stage "
                                           f"wrote in {out}; kept 1 it did not write: notes.txt\n")
        assert sorted(p.name for p in out.iterdir()) == [".align-stage.lock", ".align-writer.lock", ".hidden",
                                                          "README.md", "_manifest.json", "_manifest_rows.json", "mine",
                                                          "notes.txt"]
        assert (out / "mine" / "user.txt").read_text() == "u\n"
        recorded = manifest_file(out)
        assert recorded["settings"]["seed"] == 1 and "README.md" in recorded["preexisting"]
        (out / "data.txt").write_text("seed 1\n")
        second.finish({}, announce=False)
    finally:
        second.close()
    assert "README.md" not in complete(out)["files"]

    toy(out, rows, seed=2, overwrite=True)
    assert (out / "README.md").read_text() == "readme\n" and (out / "mine" / "user.txt").read_text() == "u\n"


# --------------------------------------------------------------------------- two runs, one directory


def test_a_run_whose_directory_was_taken_over_is_not_marked_complete(tmp_path, rows):
    out = tmp_path / "out"
    first = begin(STAGE, Toy(str(rows), str(out)), out)
    start(first)
    fields = completion_fields(first)
    assert fields["manifest_fingerprint"] == first.manifest.fingerprint and len(fields["output_id"]) == 32
    assert completion_fields(None) == {}
    other = begin(STAGE, Toy(str(rows), str(out), seed=1), out, overwrite=True)
    start(other)
    with pytest.raises(StaleOutputError) as info:
        completion_fields(first)
    assert str(info.value) == (f"{STAGE}: {out} was taken over by a run with other settings or inputs while this "
                               f"one worked; it is not marked complete. {forward(out)}")


# --------------------------------------------------------------------------- ranks other than 0


class Clock:
    """``time`` for the rerun module: a monotonic clock that moves only when a rank sleeps."""

    def __init__(self, ticks: list[float] | None = None, on_sleep=None):
        self.now, self.ticks, self.slept, self.on_sleep = 0.0, list(ticks or []), [], on_sleep

    def monotonic(self) -> float:
        if self.ticks:
            return self.ticks.pop(0)
        return self.now

    def sleep(self, seconds) -> None:
        self.slept.append(seconds)
        assert len(self.slept) < 50, "still waiting"
        self.now += 0.2
        if self.on_sleep:
            self.on_sleep()

    @staticmethod
    def time() -> float:
        import time

        return time.time()


def test_another_rank_starts_at_once_on_the_manifest_rank_0_recorded(tmp_path, rows, monkeypatch):
    out = tmp_path / "out"
    start(begin(STAGE, Toy(str(rows), str(out)), out))
    before = (out / "_manifest.json").read_bytes()
    clock = Clock()
    monkeypatch.setattr(rerun, "time", clock)
    monkeypatch.setenv("RANK", "1")
    start(begin(STAGE, Toy(str(rows), str(out)), out))
    assert clock.slept == [] and (out / "_manifest.json").read_bytes() == before


def test_another_rank_waits_for_rank_0_and_never_writes_the_manifest_itself(tmp_path, rows, monkeypatch):
    out = tmp_path / "out"
    clock = Clock(ticks=[0.0, 0.0, 1800.0, 1e9])
    monkeypatch.setattr(rerun, "time", clock)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(TimeoutError) as info:
        start(begin(STAGE, Toy(str(rows), str(out)), out))
    assert str(info.value) == f"rank 0 did not record the manifest in {out} within 1800 s"
    assert clock.slept == [0.2]
    assert not (out / "_manifest.json").exists()


def test_another_rank_waits_while_the_directory_holds_an_older_manifest(tmp_path, rows, monkeypatch):
    from align.io import write_json

    out = tmp_path / "out"
    start(begin(STAGE, Toy(str(rows), str(out), seed=5), out))  # an earlier run that wrote nothing
    mine = begin(STAGE, Toy(str(rows), str(out)), out)

    def rank_0_records():
        write_json(out / "_manifest.json", {**mine.manifest.as_json(), "preexisting": [], "started_at": 0.0})

    clock = Clock(on_sleep=rank_0_records)
    monkeypatch.setattr(rerun, "time", clock)
    monkeypatch.setenv("RANK", "1")
    start(mine)
    assert clock.slept == [0.2]


@pytest.mark.parametrize("name", ["notes.txt", ".notes"])
def test_a_file_a_user_adds_between_two_overwrites_is_never_taken_for_the_stages(tmp_path, rows, name):
    """Added after the first run: the second overwrite keeps it, does not list it as its own, and the
    third keeps it too (it was once adopted by the second run's record and deleted by the third)."""
    out = tmp_path / "out"
    toy(out, rows, seed=0)
    (out / name).write_text("my notes\n")
    toy(out, rows, seed=1, overwrite=True)
    assert sorted(complete(out)["files"]) == ["data.txt"]
    assert name in manifest_file(out)["preexisting"]
    toy(out, rows, seed=2, overwrite=True)
    assert (out / name).read_text() == "my notes\n"
    assert sorted(complete(out)["files"]) == ["data.txt"]


def test_an_overwrite_of_an_output_whose_manifest_is_lost_keeps_what_the_completion_record_does_not_list(
        tmp_path, rows):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("mine\n")
    toy(out, rows, seed=0)
    (out / "_manifest.json").unlink()
    toy(out, rows, seed=1, overwrite=True)
    assert sorted(complete(out)["files"]) == ["data.txt"]
    toy(out, rows, seed=2, overwrite=True)
    assert (out / "README.md").read_text() == "mine\n"


# --------------------------------------------------------------------------- secrets: which names are credentials


@pytest.mark.parametrize("name", [
    "token", "auth", "key", "Token",                       # the bare words
    "hf_token", "my_hf_token", "wandb-token", "hubToken",  # <anything but a vocabulary kind>_token
    "password", "db_passwd", "client_secret", "clientSecret", "apikey", "Authorization", "passphrase",
    "credentials", "api_key", "OPENAI_API_KEY", "access_key_id", "private.key", "refresh_token",
])
def test_credential_names_are_secret(name):
    assert is_secret_key(name)


@pytest.mark.parametrize("name", [
    "eos_token", "pad_token", "max_tokens", "chat_token", "bos_token_id", "tokenizer", "tokens",
    "api_key_env", "secret_env", "HF_TOKEN_ENV",  # the name of a variable, not its value
    "keys", "monkey", "author", "max_new_tokens", "key_field", "model", "",
])
def test_settings_that_mention_tokens_or_keys_are_not(name):
    assert not is_secret_key(name)


def test_redact_drops_secret_keys_at_every_depth_and_cuts_credentials_out_of_urls():
    value = {"model": "m", "hf_token": "hf_x", "engine_kwargs": {"password": "p", "dtype": "bf16"},
             "servers": [{"base_url": "http://user:pw@host:8000/v1", "clientSecret": "s"}], "pad_token": "<pad>"}
    assert redact(value) == {"model": "m", "engine_kwargs": {"dtype": "bf16"},
                             "servers": [{"base_url": "http://host:8000/v1"}], "pad_token": "<pad>"}
