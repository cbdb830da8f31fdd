"""A charter named by a path that does not exist is an error naming it, never the bundled
charter of the same file name; `charter_fingerprint` hashes the text the judge sees."""

from __future__ import annotations

import hashlib
import json

import pytest

from rewards.charter import charter_dir, find_charter, load_charter


@pytest.mark.parametrize("value", ["{root}/mine/default.md", "{root}/default.md", "mine/default.md",
                                   "./default.md", "~/no-such-dir/default.md", "a/b/example_de.md",
                                   "{root}/mine/example_de", "charter/sub/default.md"])
def test_a_missing_path_is_an_error_naming_it(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    value = value.format(root=tmp_path)
    with pytest.raises(FileNotFoundError, match="file not found") as error:
        find_charter(value)
    assert repr(value) in str(error.value)


def test_a_name_that_is_neither_a_file_nor_bundled_lists_the_bundled_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no charter 'defualt'.*not one of the bundled charters.*default\.md"):
        find_charter("defualt")
    with pytest.raises(ValueError, match="empty name"):
        find_charter("")


@pytest.mark.parametrize("value", [None, "default", "default.md", "charter/default.md"])
def test_bundled_names_still_resolve(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_charter(value) == charter_dir() / "default.md"


def test_an_existing_file_is_that_file(tmp_path, monkeypatch):
    own = tmp_path / "mine" / "default.md"
    own.parent.mkdir()
    own.write_text("## 1. Only\n[1.1] Be brief.\n")
    assert find_charter(own) == own
    monkeypatch.chdir(tmp_path)
    assert find_charter("mine/default.md") == own.relative_to(tmp_path)
    assert [c.text for c in load_charter("mine/default.md").clauses] == ["Be brief."]


def test_charter_fingerprint_is_the_sha256_of_the_rendered_text(tmp_path):
    from rewards.charter import charter_fingerprint

    default = charter_fingerprint(None)
    assert default == hashlib.sha256(load_charter().text().encode()).hexdigest()
    assert charter_fingerprint("default") == charter_fingerprint(charter_dir() / "default.md") == default
    assert charter_fingerprint(load_charter()) == default
    assert charter_fingerprint("example_de") != default
    copy = tmp_path / "copy.md"
    copy.write_text((charter_dir() / "default.md").read_text() + "\n\n")  # same clauses, other bytes
    assert charter_fingerprint(copy) == default
    edited = tmp_path / "edited.md"
    edited.write_text((charter_dir() / "default.md").read_text().replace("[1.1] ", "[1.1] Above all, ", 1))
    assert charter_fingerprint(edited) != default
    with pytest.raises(FileNotFoundError, match="file not found"):
        charter_fingerprint(tmp_path / "gone.md")


def test_annotate_with_a_missing_charter_stops_naming_it(tiny_dirs, tmp_path, capsys, monkeypatch):
    from align.cli import main

    monkeypatch.delenv("ALIGN_TRACEBACK", raising=False)
    row = {"id": "a", "messages": [{"role": "user", "content": "q"}],
           "completions": [{"text": "x", "num_tokens": 1, "finish_reason": "stop", "is_reference": True,
                            "source": "p"}]}
    (tmp_path / "in.jsonl").write_text(json.dumps(row) + "\n")
    missing = tmp_path / "mine" / "default.md"
    rc = main(["annotate", f"input={tmp_path / 'in.jsonl'}", f"output_dir={tmp_path / 'out'}", "provider=judge",
               f"model={tiny_dirs['policy']}", f"charter={missing}", "device=cpu"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"align annotate: MissingInputError: no charter {str(missing)!r}: file not found" in err, err
    assert not (tmp_path / "out" / "_COMPLETE.json").exists()
