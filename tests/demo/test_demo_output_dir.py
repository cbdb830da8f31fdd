"""`align demo` never removes a file it did not write, and checks its settings before removing anything."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from align.cli import main
from align.demo.output import DEMO_MANIFEST, RUN_OUTPUTS, check_demo_output_dir
from align.demo.output import clear_previous_run as _clear_previous_run
from align.errors import InputError


def _demo(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["demo", *args])
    return rc, err.getvalue()


def _earlier_run(root):
    (root / "data").mkdir(parents=True)
    (root / "data" / "sft.jsonl").write_text("{}\n")
    (root / "report.json").write_text("{}")
    (root / DEMO_MANIFEST).write_text(json.dumps({"written_by": "align demo", "outputs": list(RUN_OUTPUTS)}))


def test_a_directory_with_other_files_is_refused_before_anything_happens(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.csv").write_text("a user's file")
    (tmp_path / "evaluate").mkdir()
    rc, err = _demo([f"output_dir={tmp_path}", "preset=ci"])
    assert rc == 2
    assert "holds files that no demo run wrote (data, evaluate); choose a new or empty output_dir" in err
    assert (tmp_path / "data" / "mine.csv").read_text() == "a user's file"


def test_settings_are_checked_before_an_earlier_run_is_removed(tmp_path):
    _earlier_run(tmp_path)
    rc, err = _demo([f"output_dir={tmp_path}", "preset=ci", "length=2"])
    assert rc == 2 and "100 problems of 2 digits" in err
    assert (tmp_path / "data" / "sft.jsonl").exists() and (tmp_path / "report.json").exists()


def test_an_earlier_run_is_removed_exactly_as_its_manifest_lists(tmp_path):
    _earlier_run(tmp_path)
    check_demo_output_dir(tmp_path)  # an earlier demo run: accepted
    _clear_previous_run(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_file_next_to_an_earlier_run_is_refused(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "notes.md").write_text("keep me")
    with pytest.raises(InputError, match=r"\(notes.md\)"):
        check_demo_output_dir(tmp_path)


def test_a_new_or_empty_directory_is_accepted(tmp_path):
    check_demo_output_dir(tmp_path / "new")
    check_demo_output_dir(tmp_path)
