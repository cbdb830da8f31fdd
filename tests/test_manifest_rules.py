"""The rerun rules of a stage output, as a user meets them: what a rerun skips, resumes, refuses or redoes,
what ``overwrite=true`` removes and what it keeps, what ``_COMPLETE.json`` records of the files a stage
wrote, and which of them changed since (align.manifests.rerun, .state, .outputs); and which settings count
toward a stage's manifest: path settings by the content they name, neutral ones not at all, every other by
its value unless it is at its declared default (align.manifests.settings, .manifest).

A toy stage (a small dataclass config, one input file, files written by hand) runs through ``StageRun``:
no model, no subprocess.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from align.io.fingerprint import file_digest
from align.manifests import (
    StageRun,
    StaleOutputError,
    begin,
    build_manifest,
    completion_fields,
    is_path_key,
    rerun,
    start,
)
from align.manifests.redaction import is_secret_key, redact
from align.manifests.settings import field_defaults, flatten, init_settings, looks_like_path

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


# --------------------------------------------------------------------------- which settings count, and how


@dataclass
class Judge:
    model: str = ""


@dataclass
class Scoring:
    judge: Judge = field(default_factory=Judge)


@dataclass
class Reader:
    """A stage's config with a path setting of every spelling, a cache, and settings that never count."""

    personas_file: str = ""
    extra_file: str = ""
    foo_dir: str = ""
    reward_path: str = ""
    prompts: list = field(default_factory=list)
    scoring: Scoring = field(default_factory=Scoring)
    cache_dir: str = ""
    note: str = ""
    output_dir: str = ""
    logging_steps: int = 10
    seed: int = 0


def reader_files(root: Path) -> dict[str, Path]:
    """The files and directories a ``Reader`` names, each with some content."""
    paths = {"personas_file": root / "personas.jsonl", "extra_file": root / "extra.txt",
             "foo_dir": root / "data", "reward_path": root / "reward.json", "prompts[0]": root / "p0.jsonl",
             "prompts[1]": root / "p1.jsonl", "scoring.judge.model": root / "judge"}
    for key, path in paths.items():
        if key in ("foo_dir", "scoring.judge.model"):
            path.mkdir()
            (path / "config.json").write_text('{"a": 1}\n')
        else:
            path.write_text(f"{key}\n")
    return paths


def a_reader(files: dict[str, Path], **kw) -> Reader:
    spell = {k: str(v) for k, v in files.items()}
    return Reader(personas_file=spell["personas_file"], extra_file=spell["extra_file"], foo_dir=spell["foo_dir"],
                  reward_path=spell["reward_path"], prompts=[spell["prompts[0]"], spell["prompts[1]"]],
                  scoring=Scoring(Judge(spell["scoring.judge.model"])), **kw)


def test_the_files_path_settings_name_count_by_their_content_not_their_spelling(tmp_path, monkeypatch):
    """``personas_file``, ``*_file``, ``*_dir``, ``*_path``, each path of a list (``prompts[1]``) and a nested
    ``a.b.model`` are inputs: the same files spelled otherwise give the same manifest, and an edit to any of
    them gives another one."""
    files = reader_files(tmp_path)
    first = build_manifest(STAGE, a_reader(files))
    assert set(first.inputs) == set(files)
    assert not set(files) & set(first.settings)

    monkeypatch.chdir(tmp_path)
    respelled = {k: Path("." + os.sep + os.path.relpath(v, tmp_path)) for k, v in files.items()}
    assert build_manifest(STAGE, a_reader(respelled)).fingerprint == first.fingerprint

    seen = {first.fingerprint}
    for key, path in files.items():
        target = path / "config.json" if path.is_dir() else path
        target.write_text(target.read_text() + "edited\n")
        fingerprint = build_manifest(STAGE, a_reader(files)).fingerprint
        assert fingerprint not in seen, key
        seen.add(fingerprint)


def test_a_cache_dir_and_a_setting_that_is_no_path_key_count_by_spelling_even_when_they_name_a_file(tmp_path):
    """``cache_dir`` (a download cache) and ``note`` are not inputs: editing what they name leaves the manifest
    as it was; spelling them otherwise does not."""
    files = reader_files(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "blob").write_text("1\n")
    note = tmp_path / "note.txt"
    note.write_text("a note\n")
    assert not is_path_key("cache_dir") and not is_path_key("model.cache_dir")
    assert not looks_like_path("note", str(note)) and not looks_like_path("cache_dir", str(cache))

    first = build_manifest(STAGE, a_reader(files, cache_dir=str(cache), note=str(note)))
    assert first.settings["cache_dir"] == str(cache) and first.settings["note"] == str(note)
    assert "cache_dir" not in first.inputs and "note" not in first.inputs
    (cache / "blob").write_text("changed, longer\n")
    note.write_text("another note, longer\n")
    assert build_manifest(STAGE, a_reader(files, cache_dir=str(cache), note=str(note))).fingerprint == \
        first.fingerprint
    other = build_manifest(STAGE, a_reader(files, cache_dir=str(cache) + os.sep, note=f"{tmp_path}/./note.txt"))
    assert other.fingerprint != first.fingerprint


def test_neutral_settings_leave_the_manifest_as_it_was(tmp_path):
    """Where a stage writes and how often it logs (``output_dir``, ``logging_steps``) never count; a seed does."""
    files = reader_files(tmp_path)
    first = build_manifest(STAGE, a_reader(files, output_dir=str(tmp_path / "a"), logging_steps=10))
    assert "output_dir" not in first.settings and "logging_steps" not in first.settings
    assert build_manifest(STAGE, a_reader(files, output_dir=str(tmp_path / "b"), logging_steps=1)).fingerprint \
        == first.fingerprint
    assert build_manifest(STAGE, a_reader(files, seed=1)).fingerprint != first.fingerprint


@pytest.mark.parametrize("key", [
    "input", "model", "charter", "personas_file", "extra_file", "foo_dir", "reward_path", "x.y_path",
    "a.b.model", "trainer.judge.charter", "prompts[1]", "input[12]", "data.items_file[3]", "s[0].sub.model",
])
def test_path_keys_are_known_by_the_last_word_of_a_dotted_or_indexed_key(key):
    """A path setting is one of ``PATH_KEYS`` or ends in ``_path``, ``_file``, ``_dir`` (after its last dot,
    less a list index)."""
    assert is_path_key(key)


@pytest.mark.parametrize("key", [
    "cache_dir", "model.cache_dir", "output_dir", "logging_dir", "trainer.output_dir", "seed", "items[3]",
    "model.seed", "input.size", "model_dir.x", "output_dir[0]", "resume_from_checkpoint", "path_count",
])
def test_other_keys_are_not_path_keys(key):
    """Neutral keys, caches, and keys whose last word is no path word are not path settings."""
    assert not is_path_key(key)


def test_only_a_plain_one_line_path_of_at_most_4096_characters_is_looked_for(tmp_path):
    """A path setting's value counts as a path (to fingerprint) only when it is a string of one line, of at most
    4096 characters, that names something that exists; otherwise it is a setting compared by spelling (and a
    name too long for the file system is no error)."""
    (tmp_path / "f").write_text("x\n")
    base = str(tmp_path)

    def spelled(length: int) -> str:  # the file f, with as many redundant separators as make that length
        return base + os.sep * (length - len(base) - 1) + "f"

    assert looks_like_path("data_file", spelled(4096))
    assert not looks_like_path("data_file", spelled(4097))
    two_lines = tmp_path / "two\nlines"
    two_lines.write_text("x\n")
    too_long = str(tmp_path / ("a" * 300))
    assert not looks_like_path("data_file", str(two_lines))
    assert not looks_like_path("data_file", too_long)
    assert not looks_like_path("data_file", "") and not looks_like_path("data_file", None)
    assert looks_like_path("data_file", str(tmp_path / "f"))

    @dataclass
    class Files:
        a_file: str = ""
        b_file: str = ""
        c_file: str = ""
        d_file: str = ""

    manifest = build_manifest(STAGE, Files(spelled(4096), spelled(4097), str(two_lines), too_long))
    assert set(manifest.inputs) == {"a_file"}
    assert manifest.settings == {"b_file": spelled(4097), "c_file": str(two_lines), "d_file": too_long}


def test_nested_settings_flatten_to_dotted_keys_and_a_list_of_mappings_to_indexed_ones():
    """``a: {b: 1}`` is ``a.b``; ``servers: [{url: u}]`` is ``servers[0].url``; an empty mapping, an empty
    list and a list that is not all mappings stay one value."""
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}
    assert flatten({"servers": [{"url": "u", "opts": {"x": 1}}, {"url": "v"}]}) == {
        "servers[0].url": "u", "servers[0].opts.x": 1, "servers[1].url": "v"}
    assert flatten({"m": {}, "l": [], "mixed": [{"a": 1}, 2], "names": ["x"]}) == {
        "m": {}, "l": [], "mixed": [{"a": 1}, 2], "names": ["x"]}
    assert flatten({"engine": {"servers": [{"model": "m"}]}}) == {"engine.servers[0].model": "m"}


def test_a_mapping_config_counts_as_its_plain_values(tmp_path):
    """A config given as a mapping (not a dataclass) counts by its plain values (paths as strings); the files
    its path settings name are inputs, and it declares no defaults."""
    rows = tmp_path / "in.jsonl"
    rows.write_text("{}\n")
    config = {"input": rows, "seed": 1, "judge": {"servers": [{"url": Path("u")}]}}
    assert init_settings(config) == {"input": str(rows), "seed": 1, "judge": {"servers": [{"url": "u"}]}}
    assert field_defaults(config) == {}
    manifest = build_manifest(STAGE, config)
    assert set(manifest.inputs) == {"input"}
    assert manifest.settings == {"seed": 1, "judge.servers[0].url": "u"}


class Mode(enum.Enum):
    A = "a"
    B = "b"


@dataclass
class Inner:
    lr: float = 0.1
    tags: list = field(default_factory=lambda: ["a"])


@dataclass
class Middle:
    model: str = ""
    inner: Inner = field(default_factory=Inner)


@dataclass
class Declared:
    """Settings of every kind of default: none (required), not an init field, a value, an enum, a path, a
    factory, a nested config (two levels)."""

    name: str
    hidden: int = field(default=7, init=False)
    seed: int = 3
    mode: Mode = Mode.A
    where: Path = Path("x")
    middle: Middle = field(default_factory=Middle)
    tags: list = field(default_factory=lambda: ["t"])
    last: int = 0


def test_declared_defaults_are_reported_under_the_manifests_dotted_keys():
    """Each init setting with a default, as a plain value; a nested config's under ``outer.inner.key``; no
    entry for a required setting or one that is not an init field; none for a class or a mapping."""
    assert init_settings(Declared("n"))["middle"] == {"model": "", "inner": {"lr": 0.1, "tags": ["a"]}}
    assert "hidden" not in init_settings(Declared("n"))
    assert field_defaults(Declared("n", seed=5, mode=Mode.B, last=9)) == {
        "seed": 3, "mode": "a", "where": "x", "middle.model": "", "middle.inner.lr": 0.1,
        "middle.inner.tags": ["a"], "tags": ["t"], "last": 0}
    assert field_defaults(Declared) == {} and field_defaults({"seed": 1}) == {} and field_defaults(None) == {}


@dataclass
class InnerV2:
    lr: float = 0.1
    tags: list = field(default_factory=lambda: ["a"])
    knob: int = 0


@dataclass
class MiddleV2:
    model: str = ""
    inner: InnerV2 = field(default_factory=InnerV2)


@dataclass
class DeclaredV2:
    """``Declared`` of a later version: new settings (nested, a factory, an enum) at defaults that keep the
    old behaviour."""

    name: str
    hidden: int = field(default=7, init=False)
    seed: int = 3
    mode: Mode = Mode.A
    where: Path = Path("x")
    middle: MiddleV2 = field(default_factory=MiddleV2)
    tags: list = field(default_factory=lambda: ["t"])
    last: int = 0
    added: list = field(default_factory=list)
    style: Mode = Mode.B


def test_settings_at_their_declared_defaults_leave_a_finished_output_current():
    """A new version that adds settings at defaults keeping the old behaviour gives the same fingerprint (every
    setting is still recorded); a setting set away from its default counts."""
    old = build_manifest(STAGE, Declared("n", seed=4))
    new = build_manifest(STAGE, DeclaredV2("n", seed=4))
    assert new.fingerprint == old.fingerprint
    assert new.settings["middle.inner.knob"] == 0 and new.settings["added"] == [] and new.settings["style"] == "b"
    assert build_manifest(STAGE, DeclaredV2("n", seed=4, added=["x"])).fingerprint != old.fingerprint
    assert build_manifest(STAGE, DeclaredV2("n", seed=4, middle=MiddleV2(inner=InnerV2(knob=1)))).fingerprint \
        != old.fingerprint
    assert build_manifest(STAGE, DeclaredV2("n", seed=4, last=1)).fingerprint != old.fingerprint


@dataclass
class PresetInner:
    model: str = ""
    temperature: float = 1.0


@dataclass
class WithPreset:
    """A nested config whose factory presets a value other than the nested class's own default."""

    sampler: PresetInner = field(default_factory=lambda: PresetInner(model="preset"))


@dataclass
class WithPresetV2:
    sampler: PresetInner = field(default_factory=lambda: PresetInner(model="preset"))
    added: int = 0


def test_a_nested_factory_preset_is_the_declared_default():
    """`field(default_factory=lambda: Sampler(model="preset"))`: the preset is the default of
    `sampler.model`, so a later version adding a setting at its default keeps the output current,
    and the preset changed away from counts."""
    assert field_defaults(WithPreset()) == {"sampler.model": "preset", "sampler.temperature": 1.0}
    old = build_manifest(STAGE, WithPreset())
    assert build_manifest(STAGE, WithPresetV2()).fingerprint == old.fingerprint
    moved = build_manifest(STAGE, WithPresetV2(sampler=PresetInner(model="")))
    assert moved.fingerprint != old.fingerprint


@dataclass
class WithOptionalNested:
    """A nested config that is off (None) by default and set in this run."""

    inner: PresetInner | None = None
    after: int = 0


def test_a_nested_config_set_where_the_default_is_none_reports_its_own_class_defaults():
    """`sampler: Sampler | None = None`, given a Sampler: its keys' defaults are the Sampler
    class's, under the dotted keys, and the settings after it are still reported."""
    assert field_defaults(WithOptionalNested(inner=PresetInner(model="m"), after=3)) == {
        "inner.model": "", "inner.temperature": 1.0, "after": 0}
    assert field_defaults(WithOptionalNested()) == {"inner": None, "after": 0}


# --------------------------------------------------------------------------- which input rows changed


def refusal(stage: str, config) -> str:
    """What a rerun over a finished output decides: ``current`` (skipped), else the refusal's text."""
    try:
        run = StageRun.begin(stage, config)
    except StaleOutputError as error:
        return str(error)
    run.close()
    return "current" if run.skip else "not finished"


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_an_edited_input_is_refused_counting_its_rows_by_id_wherever_they_moved(tmp_path, rows):
    """Rows with an id are matched by it: a row put in front of the others is one added (not every row after it
    differing), an edited row differs, a dropped one is removed."""
    out = tmp_path / "out"
    toy(out, rows)
    write_rows(rows, [{"id": "new", "text": "row n"}, {"id": "a0", "text": "row 0"},
                      {"id": "a1", "text": "row 1, edited"}])
    assert refusal(STAGE, Toy(str(rows), str(out))) == (
        f"{STAGE}: {out} holds an output made from other settings or inputs: {STAGE}.input ({rows}): content "
        f"changed (1 row differs, 1 added, 1 removed). {forward(out)}")
    write_rows(rows, [{"id": "new", "text": "row n"}, {"id": "a0", "text": "row 0"},
                      {"id": "a1", "text": "row 1"}, {"id": "a2", "text": "row 2"}])
    assert f"{STAGE}.input ({rows}): content changed (1 added)." in refusal(STAGE, Toy(str(rows), str(out)))


def test_rows_without_a_usable_id_are_counted_by_their_position(tmp_path):
    """A row with no id, an empty id or an id that is not a string is ``<row N>``: editing one of them is one row
    that differs, not rows added and removed."""
    data = write_rows(tmp_path / "in.jsonl", [{"text": "no id"}, {"id": "", "text": "empty id"},
                                              {"id": 7, "text": "a number"}, {"id": 8, "text": "another"}])
    out = tmp_path / "out"
    toy(out, data)
    assert sorted(manifest_rows(out)["input"]) == ["<row 0>", "<row 1>", "<row 2>", "<row 3>"]
    for edited in range(4):
        rows = [{"text": "no id"}, {"id": "", "text": "empty id"}, {"id": 7, "text": "a number"},
                {"id": 8, "text": "another"}]
        rows[edited]["text"] += ", edited"
        write_rows(data, rows)
        assert f"{STAGE}.input ({data}): content changed (1 row differs)." in refusal(STAGE, Toy(str(data), str(out)))


def manifest_rows(out: Path) -> dict:
    return json.loads((out / "_manifest_rows.json").read_text())


def test_the_rows_file_records_sixteen_hex_digits_of_each_rows_digest_by_its_id(tmp_path, rows):
    """``_manifest_rows.json``: input key -> row id -> the first 16 hex digits of the row's digest; the format
    outputs already made hold, so that after an upgrade a rerun still names only the rows that changed."""
    from align.io import read_records
    from align.io.fingerprint import json_digest

    out = tmp_path / "out"
    toy(out, rows)
    assert manifest_rows(out) == {"input": {row["id"]: json_digest(row)[:16] for row in read_records(rows)}}


def test_a_row_that_is_not_a_mapping_is_named_by_its_position():
    """``row_digests`` (public) takes a caller's own rows: one that is not a mapping has no id to read."""
    from align.io.fingerprint import json_digest
    from align.manifests import row_digests

    assert row_digests([{"id": "a"}, ["id", "b"], "id"]) == {
        "a": json_digest({"id": "a"})[:16], "<row 1>": json_digest(["id", "b"])[:16], "<row 2>": json_digest("id")[:16]}


# --------------------------------------------------------------------------- a directory of data files


def test_a_directory_of_data_files_is_refused_counting_its_rows(tmp_path):
    """A directory read as rows (the union of its data files) is recorded as a directory; an edit to one of its
    files names the rows that changed, as for a single file."""
    data = tmp_path / "shards"
    data.mkdir()
    write_rows(data / "part-0.jsonl", [{"id": "a0", "text": "0"}, {"id": "a1", "text": "1"}])
    write_rows(data / "part-1.jsonl", [{"id": "a2", "text": "2"}])
    out = tmp_path / "out"
    toy(out, data)
    assert manifest_file(out)["inputs"]["input"]["kind"] == "directory"
    write_rows(data / "part-1.jsonl", [{"id": "a2", "text": "2, edited"}, {"id": "a3", "text": "3"}])
    assert refusal(STAGE, Toy(str(data), str(out))) == (
        f"{STAGE}: {out} holds an output made from other settings or inputs: {STAGE}.input ({data}): content "
        f"changed (1 row differs, 1 added). {forward(out)}")


def test_a_directory_counts_by_its_data_files_and_their_names_not_hidden_or_lock_files(tmp_path):
    """Every file under the directory counts, nested ones too, by its name there and its bytes; hidden files,
    files under hidden directories and lock files do not."""
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / ".cache").mkdir()
    (data / "a.jsonl").write_text('{"id": "a"}\n')
    (data / "sub" / "b.jsonl").write_text('{"id": "b"}\n')
    (data / ".notes").write_text("mine\n")
    (data / ".cache" / "blob").write_text("cached\n")
    (data / "a.jsonl.lock").write_text("")
    (data / "sub" / "b.lock").write_text("")
    out = tmp_path / "out"
    toy(out, data, read=False)

    (data / ".notes").write_text("mine, edited\n")
    (data / ".cache" / "blob").write_text("cached again\n")
    (data / "a.jsonl.lock").write_text("pid 1\n")
    (data / "sub" / "b.lock").write_text("pid 2\n")
    (data / "sub" / "c.lock").write_text("pid 3\n")
    assert refusal(STAGE, Toy(str(data), str(out))) == "current"

    changed = f"{STAGE}: {out} holds an output made from other settings or inputs: {STAGE}.input ({data}): " \
              f"content changed. {forward(out)}"
    (data / "sub" / "b.jsonl").write_text('{"id": "B"}\n')
    assert refusal(STAGE, Toy(str(data), str(out))) == changed
    (data / "sub" / "b.jsonl").write_text('{"id": "b"}\n')
    assert refusal(STAGE, Toy(str(data), str(out))) == "current"
    (data / "a.jsonl").rename(data / "b.jsonl")  # the same bytes, in the same place among them, another name
    assert refusal(STAGE, Toy(str(data), str(out))) == changed


# --------------------------------------------------------------------------- a tokenizer, a hub name, a charter


@dataclass
class TokenizerOf:
    tokenizer: str = ""


@dataclass
class Encoding:
    of: TokenizerOf = field(default_factory=TokenizerOf)


@dataclass
class Tokenized:
    """A stage that reads rows and a tokenizer named under a nested key (``encoding.of.tokenizer``)."""

    input: str = ""
    output_dir: str = ""
    encoding: Encoding = field(default_factory=Encoding)


def test_a_tokenizer_under_a_nested_key_counts_by_its_tokenizer_files_only(tmp_path, rows):
    """A ``tokenizer`` setting, however deeply nested, names a tokenizer: its visible files count, not the weights
    of a checkpoint it sits in nor hidden files; it is recorded as a tokenizer."""
    from align.io.fingerprint import files_fingerprint

    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "tokenizer.json").write_text('{"version": "1.0"}')
    (directory / "model.safetensors").write_bytes(b"w" * 64)
    (directory / ".notes").write_text("mine\n")
    out = tmp_path / "out"
    config = Tokenized(str(rows), str(out), Encoding(TokenizerOf(str(directory))))
    made = toy_run(config)
    assert made["inputs"]["encoding.of.tokenizer"] == {
        "path": str(directory), "kind": "tokenizer", "fingerprint": files_fingerprint([directory / "tokenizer.json"])}
    (directory / "model.safetensors").write_bytes(b"v" * 64)
    (directory / ".notes").write_text("mine, edited\n")
    assert refusal(STAGE, config) == "current"
    (directory / "tokenizer.json").write_text('{"version": "2.0"}')
    assert f"{STAGE}.encoding.of.tokenizer ({directory}): content changed" in refusal(STAGE, config)


def toy_run(config, stage: str = STAGE) -> dict:
    """A finished run of ``stage`` over ``config`` (one file written, no rows read): its recorded manifest."""
    run = StageRun.begin(stage, config)
    assert not run.skip
    try:
        run.start()
        (run.output_dir / "data.txt").write_text("made\n")
        run.finish({}, announce=False)
    finally:
        run.close()
    return complete(Path(run.output_dir))["manifest"]


@dataclass
class Resumed:
    """A stage that continues from another run's checkpoint, given as a hub name."""

    input: str = ""
    output_dir: str = ""
    resume_from_checkpoint: str = ""


def test_a_hub_name_counts_by_its_name(tmp_path, rows):
    """A name that is no local path (a hub checkpoint) is recorded as a name, fingerprinted by its spelling:
    another name makes the output stale, the same name leaves it current."""
    from align.io.fingerprint import json_digest

    out = tmp_path / "out"
    made = toy_run(Resumed(str(rows), str(out), "org/ckpt-a"))
    assert made["inputs"]["resume_from_checkpoint"] == {"path": "org/ckpt-a", "kind": "name",
                                                        "fingerprint": json_digest("org/ckpt-a")}
    assert refusal(STAGE, Resumed(str(rows), str(out), "org/ckpt-a")) == "current"
    assert refusal(STAGE, Resumed(str(rows), str(out), "org/ckpt-b")) == (
        f"{STAGE}: {out} holds an output made from other settings or inputs: {STAGE}.resume_from_checkpoint "
        f"(org/ckpt-b): content changed. {forward(out)}")


@dataclass
class Judged:
    """A stage whose judge reads a charter (the bundled one unless a file is given)."""

    input: str = ""
    output_dir: str = ""
    provider: str = "judge"
    charter: str | None = None


def test_going_back_to_the_bundled_charter_is_named_as_the_default(tmp_path, rows):
    """The charter a judge reads counts by its text; the bundled one (no charter given) is named ``default``."""
    from rewards.charter import charter_dir

    charter = tmp_path / "mine.md"
    charter.write_text((charter_dir() / "default.md").read_text().replace("[1.1] Answer", "[1.1] Always answer"))
    out, bundled = tmp_path / "out", tmp_path / "bundled"
    assert toy_run(Judged(str(rows), str(bundled)))["inputs"]["charter"]["path"] == "default"
    toy_run(Judged(str(rows), str(out), charter=str(charter)))
    assert refusal(STAGE, Judged(str(rows), str(out))) == (
        f"{STAGE}: {out} holds an output made from other settings or inputs: {STAGE}.charter (default): other "
        f"charter text. {forward(out)}")


def test_a_model_directory_records_each_files_digest_in_sixteen_hex_digits(tmp_path):
    """A checkpoint's recorded ``files`` (name -> the first 16 hex digits of its digest, what a refusal compares
    to name the files that changed) keep the format outputs already made hold."""
    from align.manifests import fingerprint_input

    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"w" * 64)
    (directory / "config.json").write_text('{"a": 1}')
    entry = fingerprint_input(str(directory), key="model_name_or_path")
    assert entry["kind"] == "model"
    assert entry["files"] == {name: file_digest(directory / name)[:16] for name in ("config.json", "model.safetensors")}


# --------------------------------------------------------------------------- an earlier stage's output


def made_from(tmp_path, rows) -> tuple[Path, Path]:
    """The toy stage's output ``first`` (two files of rows), and the ``reader`` stage's output made from one."""
    first, second = tmp_path / "first", tmp_path / "second"
    toy(first, rows, {"pairs.jsonl": '{"id": "p"}\n', "other.jsonl": '{"id": "o"}\n'})
    toy_run(Toy(str(first / "pairs.jsonl"), str(second)), stage="reader")
    return first, second


def test_an_earlier_output_is_bound_by_its_manifest_and_output_id_and_by_the_file_read(tmp_path, rows):
    """A file of another stage's output counts as that output (its stage, manifest fingerprint and output id)
    and the file's name in it; another file of the same output is another input."""
    first, second = made_from(tmp_path, rows)
    recorded = complete(second)["manifest"]["inputs"]["input"]
    assert recorded == {"path": str(first / "pairs.jsonl"), "kind": "stage", "stage": STAGE,
                        "fingerprint": complete(first)["manifest_fingerprint"],
                        "output_id": complete(first)["output_id"], "file": "pairs.jsonl"}
    assert refusal("reader", Toy(str(first / "pairs.jsonl"), str(second))) == "current"
    assert f"reader.input ({first / 'other.jsonl'}): " in refusal("reader", Toy(str(first / "other.jsonl"),
                                                                                 str(second)))


def test_an_earlier_output_made_again_from_other_settings_makes_what_read_it_stale(tmp_path, rows):
    """Even when the file read holds the same bytes: the earlier output is other work now."""
    first, second = made_from(tmp_path, rows)
    toy(first, rows, {"pairs.jsonl": '{"id": "p"}\n', "other.jsonl": '{"id": "o"}\n'}, seed=1, overwrite=True)
    assert refusal("reader", Toy(str(first / "pairs.jsonl"), str(second))) == (
        f"reader: {second} holds an output made from other settings or inputs: reader.input "
        f"({first / 'pairs.jsonl'}): made from other settings or inputs (the {STAGE} stage's manifest changed). "
        f"{forward(second)}")


def test_an_earlier_output_edited_since_it_was_made_makes_what_read_it_stale_naming_the_file(tmp_path, rows):
    """A file of the earlier output edited after it was made: that output is no longer the one its id names."""
    first, second = made_from(tmp_path, rows)
    (first / "pairs.jsonl").write_text('{"id": "q"}\n')  # the same size, other bytes
    assert refusal("reader", Toy(str(first / "pairs.jsonl"), str(second))) == (
        f"reader: {second} holds an output made from other settings or inputs: reader.input "
        f"({first / 'pairs.jsonl'}): the {STAGE} stage's output changed since it was made (pairs.jsonl (other "
        f"bytes)). {forward(second)}")


def test_status_calls_a_step_that_read_a_current_earlier_steps_file_done(tmp_path, rows):
    """``align status`` binds a later step to what the earlier step will be, the same way the run recorded it: a
    finished pipeline is done, step by step."""
    from align.manifests.status import step_state

    first, second = made_from(tmp_path, rows)
    outputs: dict = {}
    assert step_state(STAGE, Toy(str(rows), str(first)), outputs).state == "done"
    assert step_state("reader", Toy(str(first / "pairs.jsonl"), str(second)), outputs).state == "done"
    later: dict = {}
    assert step_state(STAGE, Toy(str(rows), str(first), seed=1), later).state == "stale"
    assert step_state("reader", Toy(str(first / "pairs.jsonl"), str(second)), later).state == "stale"


# --------------------------------------------------------------------------- output_dir apart from the inputs


@dataclass
class Several:
    """A stage that reads several files as one input."""

    input: list = field(default_factory=list)
    output_dir: str = ""


def apart_refusal(config) -> str:
    """What ``StageRun.begin`` says of an ``output_dir`` that is not apart from the stage's inputs."""
    from align.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        StageRun.begin(STAGE, config)
    return str(info.value)


def apart(out, how: str, key: str, value) -> str:
    return (f"{STAGE}: output_dir={str(out)!r} {how} its input {key}={str(value)!r}: writing there would overwrite "
            "(or be read back as) what the stage reads; choose another output_dir")


def test_an_output_dir_that_is_holds_or_sits_inside_an_input_is_refused_saying_which(tmp_path, rows):
    """Writing there would overwrite, or read back, what the stage reads: each of the three is named."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "part.jsonl").write_text('{"id": "d"}\n')
    assert apart_refusal(Toy(str(data), str(data))) == apart(data, "is", "input", data)
    inner = tmp_path / "out" / "in.jsonl"
    inner.parent.mkdir()
    inner.write_text(rows.read_text())
    assert apart_refusal(Toy(str(inner), str(inner.parent))) == apart(inner.parent, "holds", "input", inner)
    assert apart_refusal(Toy(str(data), str(data / "out"))) == apart(data / "out", "is inside", "input", data)
    assert not (data / "out").exists()


def test_an_output_dir_beside_its_inputs_or_named_like_one_starts(tmp_path, rows):
    """Apart means apart on the path's parts: ``data-out`` beside ``data`` (a prefix of its spelling only), or a
    directory under a path that is a file, is no input's."""
    from align.manifests.lifecycle import check_apart

    data = tmp_path / "data"
    data.mkdir()
    (data / "part.jsonl").write_text('{"id": "d"}\n')
    run = StageRun.begin(STAGE, Toy(str(data), str(tmp_path / "data-out")))
    run.close()
    assert not run.skip
    check_apart(STAGE, Toy(str(rows), ""), rows / "out")  # under a file: no directory is inside it


def test_each_of_several_input_files_is_named_by_its_position(tmp_path, rows):
    other = tmp_path / "more.jsonl"
    other.write_text('{"id": "m"}\n')
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "mine.jsonl"
    mine.write_text('{"id": "x"}\n')
    assert apart_refusal(Several([str(rows), str(mine)], str(out))) == apart(out, "holds", "input[1]", mine)
    assert apart_refusal(Several([str(mine)], str(out))) == apart(out, "holds", "input", mine)
    run = StageRun.begin(STAGE, Several([str(rows), str(other)], str(out)))
    run.close()
    assert not run.skip


def test_a_checkpoint_to_resume_from_may_sit_inside_the_output_dir(tmp_path, rows):
    """A trainer resumes from its own checkpoints: ``resume_from_checkpoint`` is no input to keep apart."""
    from align.manifests.lifecycle import check_apart

    out = tmp_path / "out"
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "checkpoint-5" / "config.json").write_text("{}")
    check_apart(STAGE, Resumed(str(rows), str(out), str(out / "checkpoint-5")), out)
    check_apart(STAGE, {"train": {"resume_from_checkpoint": str(out / "checkpoint-5")}}, out)


# --------------------------------------------------------------------------- an output_dir that cannot be written


def begin_refusal(out) -> str:
    from align.errors import InputError

    with pytest.raises(InputError) as info:
        StageRun.begin(STAGE, Toy("", str(out)))
    return str(info.value)


def test_an_output_dir_under_a_file_or_a_dangling_link_is_refused_before_any_work(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    assert begin_refusal(afile / "out") == (f"{STAGE}: output_dir={str(afile / 'out')!r}: {str(afile)!r} is a "
                                            "file, not a directory")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    assert begin_refusal(link) == (f"{STAGE}: output_dir={str(link)!r} is a symbolic link to nothing (or to "
                                   "itself): point it at a directory, or remove it")
    assert afile.read_text() == "mine\n" and not (tmp_path / "gone").exists()


def test_an_output_dir_that_is_a_link_to_a_directory_is_written_through_it(tmp_path, rows):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "out"
    link.symlink_to(target)
    toy(link, rows)
    assert (target / "data.txt").read_text() == "seed 0\n" and (target / "_COMPLETE.json").is_file()


def unwritable_directory(tmp_path) -> Path:
    """A directory this process may not write: one made read-only, or (root writes anywhere) ``/proc/self``."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if not os.access(locked, os.W_OK):
        return locked
    if os.path.isdir("/proc/self") and not os.access("/proc/self", os.W_OK):
        return Path("/proc/self")
    pytest.skip("no directory here that this process may not write")


def test_an_output_dir_under_a_directory_that_cannot_be_written_is_refused(tmp_path):
    locked = unwritable_directory(tmp_path)
    out = locked / "align-out"
    assert begin_refusal(out) == (f"{STAGE}: output_dir={str(out)!r}: {str(locked)!r} is not writable (a read-only "
                                  "mount, or no write permission): make it writable, or choose another output_dir")


# --------------------------------------------------------------------------- an overwrite of a job's output


def a_job_with_a_shard_being_written(out: Path, rows: Path):
    """The toy stage as a sharded job: a task has started and is writing shard 0 of 2 (it holds its lock)."""
    from align.io.shards import ShardWriter

    first = StageRun.begin(STAGE, Toy(str(rows), str(out)), job=True)
    try:
        first.read("input")
        first.start()
        writer = ShardWriter(out / "shard-00000-of-00002.jsonl")
        writer.write(b'{"id": "a0"}\n')
        writer.sync()
    finally:
        first.close()
    return writer


def test_an_overwrite_of_a_job_output_waits_for_no_task_and_goes_on_once_none_writes(tmp_path, rows):
    """Refused while a task holds its shard's lock, naming the shard, with nothing removed; once the task has
    let go of it (the lock file is still there), the overwrite removes what the job wrote."""
    from align.errors import InputError

    out = tmp_path / "out"
    writer = a_job_with_a_shard_being_written(out, rows)
    again = StageRun.begin(STAGE, Toy(str(rows), str(out), seed=1, overwrite=True), job=True)
    try:
        again.read("input")
        with pytest.raises(InputError) as info:
            again.start()
        assert str(info.value) == (f"{STAGE}: overwrite=true, but shard-00000-of-00002 is being written by another "
                                   f"task of {out}; let it finish (or cancel it) first")
        assert (out / "shard-00000-of-00002.jsonl").read_text() == '{"id": "a0"}\n'
        assert manifest_file(out)["settings"]["seed"] == 0
        writer.close()
        assert (out / "shard-00000-of-00002.lock").exists()
        again.start()
        assert not (out / "shard-00000-of-00002.jsonl").exists()
        assert manifest_file(out)["settings"]["seed"] == 1
    finally:
        if writer._fd >= 0:  # the test stopped while the task still wrote
            writer.close()
        again.close()


def test_an_overwrite_never_follows_a_shard_lock_that_is_a_symbolic_link(tmp_path, rows):
    """A lock in the output directory replaced by a link is never followed out of it: the overwrite stops
    before it removes anything."""
    from align.errors import InputError

    out = tmp_path / "out"
    a_job_with_a_shard_being_written(out, rows).close()
    elsewhere = tmp_path / "elsewhere.lock"
    elsewhere.write_text("")
    (out / "shard-00001-of-00002.lock").symlink_to(elsewhere)
    again = StageRun.begin(STAGE, Toy(str(rows), str(out), seed=1, overwrite=True), job=True)
    try:
        again.read("input")
        with pytest.raises(InputError, match=r"shard-00001-of-00002.lock is a symbolic link.*nothing was deleted"):
            again.start()
    finally:
        again.close()
    assert (out / "shard-00000-of-00002.jsonl").read_text() == '{"id": "a0"}\n'
    assert manifest_file(out)["settings"]["seed"] == 0


# --------------------------------------------------------------------------- what a launch computes once


class Launch:
    """``torch.distributed`` as one rank of a two-rank launch sees it: what each rank broadcasts is given
    (``sent``); a broadcast from another rank fills the list with that rank's objects."""

    def __init__(self, rank: int, sent: dict):
        self.rank, self.sent = rank, sent

    def broadcast_object_list(self, object_list, src=None, group=None, device=None, group_src=None):
        if src != self.rank:
            object_list[:] = [self.sent[src]]


@pytest.fixture()
def launch(monkeypatch):
    """Make this process rank ``rank`` of a launch of ``world`` processes whose process group is ``up``."""
    import torch.distributed as dist

    def make(rank: int = 0, *, world: str | None = "2", up: bool = True, sent: dict | None = None) -> Launch:
        fake = Launch(rank, sent if sent is not None else {0: "rank 0's", 1: "rank 1's"})
        if world is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", world)
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: up)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
        monkeypatch.setattr(dist, "broadcast_object_list", fake.broadcast_object_list)
        return fake

    return make


def computed(calls: list):
    """A value a launch needs once (a fingerprint): each call is counted."""
    def compute() -> str:
        calls.append(1)
        return "computed here"

    return compute


def test_rank_0_of_a_launch_computes_and_every_other_rank_receives_its_value(launch):
    from align.ranks import launch_group, on_rank_zero

    launch(0)
    assert launch_group() is not None
    calls: list = []
    assert on_rank_zero(computed(calls)) == "computed here" and len(calls) == 1
    launch(1, sent={0: "rank 0's", 1: "rank 1's"})
    assert on_rank_zero(computed(calls)) == "rank 0's" and len(calls) == 1


@pytest.mark.parametrize("world, up", [(None, True), ("1", True), ("2", False)])
def test_without_a_launch_whose_group_is_up_each_process_computes_its_own(launch, world, up):
    """No ``WORLD_SIZE``, a launch of one process, or ranks whose process group is not (yet) up: nothing is
    broadcast, and every process computes for itself."""
    from align.ranks import launch_group, on_rank_zero

    launch(1, world=world, up=up, sent={})
    assert launch_group() is None
    calls: list = []
    assert on_rank_zero(computed(calls)) == "computed here" and len(calls) == 1


# --------------------------------------------------------------------------- reading an input outside a run


def read_refusal(path, error=None) -> str:
    """What ``read_input`` (a sweep's reader of its inputs) says of ``path``, given as its ``input``."""
    from align.errors import InputError
    from align.manifests.lifecycle import read_input

    with pytest.raises(error or InputError) as info:
        read_input(path, "sweep", "input")
    return str(info.value)


def unfinished(path) -> str:
    return (f"sweep: input={str(path)!r} is an unfinished stage output (no _COMPLETE.json): finish the stage that "
            "writes it first (rerun it; for a SLURM array, every task)")


def test_read_input_gives_the_rows_of_a_file_or_of_a_finished_output(tmp_path, rows):
    from align.manifests.lifecycle import read_input

    expected = [{"id": f"a{i}", "text": f"row {i}"} for i in range(3)]
    assert read_input(rows, "sweep", "input") == expected
    out = tmp_path / "made"
    toy(out, rows, {"rows.jsonl": rows.read_text()})
    assert read_input(str(out), "sweep", "input") == expected
    assert read_input(out / "rows.jsonl", "sweep", "input") == expected


def test_read_input_refuses_an_empty_missing_or_rowless_input_naming_it(tmp_path):
    from align.errors import ConfigError, MissingInputError

    assert read_refusal("  ", ConfigError) == "sweep: set input (an empty path is never read as the current directory)"
    missing = tmp_path / "nope.jsonl"
    assert read_refusal(missing, MissingInputError) == f"sweep: input={str(missing)!r} does not exist"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert read_refusal(empty) == f"sweep: input={str(empty)!r} holds no rows"


def test_an_unfinished_job_output_is_refused_by_its_fingerprint_or_its_shards_alone(tmp_path):
    """Either sign of a job (``_job.json``, or shard files) without a completion marker: reading it would use a
    subset of the records; a file of it is refused too."""
    fingerprinted, sharded = tmp_path / "fingerprinted", tmp_path / "sharded"
    fingerprinted.mkdir()
    (fingerprinted / "_job.json").write_text("{}")
    (fingerprinted / "rows.jsonl").write_text('{"id": "a"}\n')
    sharded.mkdir()
    (sharded / "shard-00000-of-00002.jsonl").write_text('{"id": "a"}\n')
    assert read_refusal(fingerprinted) == unfinished(fingerprinted)
    assert read_refusal(sharded) == unfinished(sharded)
    afile = fingerprinted / "rows.jsonl"
    assert read_refusal(afile) == (f"sweep: input={str(afile)!r} is a file of an unfinished stage output "
                                   f"({fingerprinted}): finish the stage that writes it first")


def test_an_output_edited_since_it_was_made_is_refused_unless_its_files_were_left_to_rank_0(tmp_path, rows):
    """``read_input`` verifies an earlier stage's files; ``verify=False`` (another rank of a launch, whose
    rank 0 verified them) does not hash them again."""
    from align.manifests.lifecycle import check_stage_input

    out = tmp_path / "made"
    toy(out, rows, {"rows.jsonl": rows.read_text()})
    (out / "rows.jsonl").write_text(rows.read_text().replace("row 1", "row 9"))
    edited = (f"the {STAGE} stage's output changed since it was made (rows.jsonl (other bytes)); rerun that stage "
              "(overwrite=true redoes it), or, to read edited rows as data of your own, copy the data files (not "
              "the _*.json markers) to a directory of their own and read that")
    assert read_refusal(out) == f"sweep: input={str(out)!r}: {edited}"
    assert read_refusal(out / "rows.jsonl") == f"sweep: input={str(out / 'rows.jsonl')!r}: {edited}"
    check_stage_input(out, "sweep", "input", verify=False)


def test_an_output_of_two_kinds_of_rows_is_read_by_the_file_named(tmp_path, rows):
    """A finished ``pairs`` output also holds the prompts it skipped: the directory is refused, naming the file."""
    from align.manifests.lifecycle import read_input

    out = tmp_path / "pairs"
    toy(out, rows, {"pairs.jsonl": '{"id": "p"}\n', "skipped.jsonl": '{"id": "s"}\n'}, stage="pairs")
    assert read_refusal(out) == (f"sweep: input={str(out)!r} is the pairs stage's output, which holds more than "
                                 f"one kind of row; name the file instead: input={out / 'pairs.jsonl'}")
    assert read_input(out / "pairs.jsonl", "sweep", "input") == [{"id": "p"}]


# --------------------------------------------------------------------------- a model to load


def test_a_model_is_a_directory_with_a_config_or_a_hub_name(tmp_path):
    """Named as the stage's key: unset, a directory that holds no saved model, a local path that is not there;
    a saved model and a hub name ``org/name`` (left to ``from_pretrained``) pass."""
    from align.errors import ConfigError, InputError, MissingInputError
    from align.manifests.lifecycle import check_model_path

    saved, bare = tmp_path / "saved", tmp_path / "bare"
    saved.mkdir()
    (saved / "config.json").write_text("{}")
    bare.mkdir()
    check_model_path(str(saved), "sft", "model_name_or_path")
    check_model_path(saved, "sft", "model_name_or_path")
    check_model_path("org/name", "sft", "model_name_or_path")
    for unset in (None, ""):
        with pytest.raises(ConfigError) as info:
            check_model_path(unset, "sft", "model_name_or_path")
        assert str(info.value) == "sft: set model_name_or_path (a model directory or name)"
    with pytest.raises(InputError) as info:
        check_model_path(str(bare), "sft", "model_name_or_path")
    assert str(info.value) == f"sft: model_name_or_path={str(bare)!r} has no config.json (not a saved model)"
    for missing in (str(tmp_path / "gone"), "./gone", "~/align-no-such-model"):
        with pytest.raises(MissingInputError) as info:
            check_model_path(missing, "sft", "model_name_or_path")
        assert str(info.value) == (f"sft: model_name_or_path={missing!r} does not exist (a model directory, or a "
                                   "hub name such as org/name)")


# --------------------------------------------------------------------------- the settings a marker records


def test_the_settings_written_into_markers_and_logs_leave_secrets_out():
    from align.manifests.lifecycle import redacted_settings

    @dataclass
    class Served:
        input: str = "in.jsonl"
        api_key: str = "sk-secret"
        endpoint: str = "https://user:pw@example.com/v1"

    assert redacted_settings(Served()) == {"input": "in.jsonl", "endpoint": redact("https://user:pw@example.com/v1")}
    assert "pw" not in json.dumps(redacted_settings(Served()))


def test_a_hub_dataset_name_is_no_file_of_the_unfinished_job_the_stage_runs_in(tmp_path, monkeypatch):
    """``squad`` (a hub dataset with no organisation) is a name, not ``./squad`` of the directory the stage runs
    in: it is left to ``datasets`` even when that directory is an unfinished job's output."""
    from align.manifests.lifecycle import check_input_exists, check_stage_input

    (tmp_path / "_job.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    check_input_exists("squad", "sweep", "input")
    check_stage_input("squad", "sweep", "input")


def test_a_file_of_an_unfinished_job_is_refused_however_its_path_is_spelled(tmp_path, monkeypatch):
    """Named from inside the job's directory, the file's parent is ``.``: it is still a partial output."""
    from align.errors import InputError
    from align.manifests.lifecycle import read_input

    job = tmp_path / "job"
    job.mkdir()
    (job / "_job.json").write_text("{}")
    (job / "shard-00000-of-00002.jsonl").write_text(json.dumps({"id": "a"}) + "\n")
    for spelling in (job / "shard-00000-of-00002.jsonl", "shard-00000-of-00002.jsonl", "./shard-00000-of-00002.jsonl"):
        if not str(spelling).startswith("/"):
            monkeypatch.chdir(job)
        with pytest.raises(InputError, match="file of an unfinished stage output"):
            read_input(spelling, "sweep", "input")


def test_a_plain_copy_of_an_earlier_output_is_named_as_the_input_files_content_changed(tmp_path, rows):
    """No earlier stage is involved any more: the message names the file's content, not a manifest."""
    first, second = made_from(tmp_path, rows)
    copy = tmp_path / "copy.jsonl"
    copy.write_text((first / "pairs.jsonl").read_text())
    assert refusal("reader", Toy(str(copy), str(second))) == (
        f"reader: {second} holds an output made from other settings or inputs: reader.input ({copy}): the input "
        f"file's content changed: a plain file now, no earlier stage's output (it was the {STAGE} stage's output). "
        f"{forward(second)}")


def test_a_plain_copy_read_as_rows_names_how_its_rows_differ(tmp_path, rows):
    first, second = tmp_path / "first", tmp_path / "second"
    toy(first, rows, {"pairs.jsonl": '{"id": "p"}\n{"id": "q"}\n'})
    toy(second, first / "pairs.jsonl", stage="reader")
    copy = write_rows(tmp_path / "copy.jsonl", [{"id": "p"}])
    assert refusal("reader", Toy(str(copy), str(second))).endswith(
        f"(it was the {STAGE} stage's output; 1 removed). {forward(second)}")
    write_rows(copy, [{"id": "p"}, {"id": "q"}])
    assert f"(it was the {STAGE} stage's output; the same rows)" in refusal("reader", Toy(str(copy), str(second)))


def test_an_input_that_became_an_earlier_stages_output_is_named_so(tmp_path, rows):
    first, _ = made_from(tmp_path, rows)
    toy_run(Toy(str(rows), str(tmp_path / "third")), stage="reader")
    assert f"reader.input ({first / 'pairs.jsonl'}): now the {STAGE} stage's output (was a plain file)" in \
        refusal("reader", Toy(str(first / "pairs.jsonl"), str(tmp_path / "third")))


@pytest.mark.parametrize(("text", "why"), [('{"stage": "toy", "fingerp', "truncated or not valid JSON (line 1: "),
                                           ("[1, 2]", "not a manifest (a JSON list)"),
                                           (b"\xff\xfe{}", "unreadable (not UTF-8 text)")])
def test_a_partial_output_whose_manifest_is_cut_off_names_it_and_overwrite_redoes_it(tmp_path, rows, text, why):
    """Not taken for an earlier version's output: the manifest is there and cannot be read; overwrite=true
    removes what the stage's ledger lists and starts afresh."""
    out = tmp_path / "out"
    toy(out, rows, finish=False)
    (out / "notes.txt").write_text("mine")
    manifest = out / "_manifest.json"
    manifest.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(StaleOutputError) as info:
        StageRun.begin(STAGE, Toy(str(rows), str(out)))
    assert str(info.value).startswith(f"{STAGE}: {out} holds a partial output whose manifest (_manifest.json) is "
                                      f"{why}")
    assert str(info.value).endswith("so what it was made from is unknown: rerun with overwrite=true to remove what "
                                    f"the stage wrote there and redo it, or remove {out} yourself")
    toy(out, rows, overwrite=True)
    assert complete(out)["manifest"]["stage"] == STAGE and (out / "notes.txt").read_text() == "mine"
    assert refusal(STAGE, Toy(str(rows), str(out))) == "current"
