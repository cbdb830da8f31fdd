"""Trust at the edges of `align.io`: what an input directory may hold, file modes, symlinks.

Inputs are read by one rule (`align.io.records`): every file in an input directory is read
or named in an error; the library's own markers are skipped by name. Outputs get the
umask's mode, and a job never appends through a symlink.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from align.errors import InputError
from align.io import read_records, write_json, write_jsonl
from align.io.shards import ShardWriter


def _rows(path: Path, *ids: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return path


# --------------------------------------------------------------------------- reading


def test_every_data_file_of_a_directory_is_read_whatever_the_case_of_its_suffix(tmp_path):
    _rows(tmp_path / "a.jsonl", "a")
    _rows(tmp_path / "b.JSONL", "b")
    (tmp_path / "c.json").write_text(json.dumps([{"id": "c"}]))
    (tmp_path / "d.Json").write_text(json.dumps([{"id": "d"}]))
    assert [r["id"] for r in read_records(tmp_path)] == ["a", "b", "c", "d"]
    assert [r["id"] for r in read_records(tmp_path / "b.JSONL")] == ["b"]


def test_the_librarys_own_markers_are_skipped_by_name(tmp_path):
    _rows(tmp_path / "shard-00000-of-00001.jsonl", "a")
    for name in ("_COMPLETE.json", "_job.json", "_manifest.json", "shard-00000-of-00001.done.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "shard-00000-of-00001.lock").write_text("")
    (tmp_path / ".shard.jsonl.x1y2.tmp").write_text("half")
    assert [r["id"] for r in read_records(tmp_path)] == ["a"]


@pytest.mark.parametrize("name,needle", [
    ("_extra.jsonl", "named like one of the library's markers"),
    (".hidden.jsonl", "named like one of the library's markers"),
    ("_done.json", "named like one of the library's markers"),
    ("notes.txt", "not a data file"),
    ("data.csv", "not a data file"),
])
def test_any_other_file_in_an_input_directory_is_an_error_naming_it(tmp_path, name, needle):
    _rows(tmp_path / "a.jsonl", "a")
    (tmp_path / name).write_text("{}\n")
    with pytest.raises(ValueError, match=needle) as error:
        read_records(tmp_path)
    assert name in str(error.value)


def test_a_subdirectory_is_an_error_naming_it(tmp_path):
    _rows(tmp_path / "a.jsonl", "a")
    _rows(tmp_path / "more" / "b.jsonl", "b")
    with pytest.raises(ValueError, match=r"more: a subdirectory"):
        read_records(tmp_path)


def test_an_empty_path_is_an_error_not_the_current_directory(tmp_path, monkeypatch):
    _rows(tmp_path / "a.jsonl", "a")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="input path is empty"):
        read_records("")


@pytest.mark.parametrize("path", ["./gone", "missing/dir/x", "gone.jsonl", "gone.JSONL", "/no/such/file.parquet",
                                  "~/no-such-align-input"])
def test_a_missing_local_path_is_not_found_without_asking_the_hub(tmp_path, monkeypatch, path):
    import datasets

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail(f"hub asked for {a}"))
    with pytest.raises(FileNotFoundError, match="not found"):
        read_records(path)


def test_hub_names_still_go_to_datasets(monkeypatch):
    import datasets

    from align.io.records import looks_local

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: calls.append(name) or datasets.Dataset.from_list(
        [{"id": "h"}]))
    assert not looks_local("org/name") and not looks_local("squad")
    assert all(looks_local(p) for p in ("./gone", "missing/dir/x", "gone.JSONL", "/abs", "~/x"))
    assert read_records("org/name") == [{"id": "h"}] and calls == ["org/name"]


def test_marker_names():
    from align.io.records import is_marker

    assert all(is_marker(n) for n in ("_COMPLETE.json", "_job.json", "_manifest.json", "shard-00001-of-00004.lock",
                                      "shard-00001-of-00004.done.json", ".out.jsonl.abc123.tmp"))
    assert not any(is_marker(n) for n in ("_complete.json", "_other.json", "shard-1-of-4.lock", "x.tmp", ".tmp"))


# --------------------------------------------------------------------------- writing


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_atomic_writes_honour_the_umask(tmp_path, umask_022):
    paths = [write_json(tmp_path / "a.json", {"x": 1}), write_jsonl(tmp_path / "b.jsonl", [{"id": "a"}])]
    with ShardWriter(tmp_path / "shard-00000-of-00001.jsonl") as writer:
        writer.write(b"{}\n")
    paths.append(tmp_path / "shard-00000-of-00001.jsonl")
    (tmp_path / "plain.txt").write_text("x")  # what any other output gets
    paths.append(tmp_path / "plain.txt")
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in paths} == {p.name: "0o644" for p in paths}
    os.umask(0o077)
    assert stat.S_IMODE(write_json(tmp_path / "private.json", {}).stat().st_mode) == 0o600


def test_an_atomic_replace_keeps_the_umask_mode_not_the_old_files(tmp_path, umask_022):
    target = write_json(tmp_path / "a.json", {"x": 1})
    target.chmod(0o600)
    assert stat.S_IMODE(write_json(target, {"x": 2}).stat().st_mode) == 0o644


def test_a_shard_that_is_a_symlink_is_refused(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    shard = out / "shard-00000-of-00001.jsonl"
    shard.symlink_to(outside)
    with pytest.raises(InputError, match="symlink") as error:
        ShardWriter(shard)
    assert str(shard) in str(error.value)
    assert outside.read_text() == "precious\n"
    assert not (out / "shard-00000-of-00001.lock").exists() or not (out / "shard-00000-of-00001.lock").is_symlink()


def test_a_lock_file_that_is_a_symlink_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    lock = out / "shard-00000-of-00001.lock"
    lock.symlink_to(outside)
    with pytest.raises(InputError, match="symlink") as error:
        ShardWriter(out / "shard-00000-of-00001.jsonl")
    assert str(lock) in str(error.value)
    assert outside.read_text() == "keep"
    assert not (out / "shard-00000-of-00001.jsonl").exists()


def test_a_dangling_shard_symlink_is_refused_and_nothing_is_created_outside(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere.jsonl"
    (out / "shard-00000-of-00001.jsonl").symlink_to(target)
    with pytest.raises(InputError, match="symlink"):
        ShardWriter(out / "shard-00000-of-00001.jsonl")
    assert not target.exists()
