"""The mutation check's reviewed lists and records are well formed (the check itself runs in CI, not here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"mutation_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


check = _load("check")
plants = _load("plants")


@pytest.mark.parametrize("path,kind", [(check.EQUIVALENT, "equivalent"), (check.OPEN, "open")])
def test_every_listed_mutant_names_a_covered_function_and_gives_its_reason(path, kind):
    entries = check.load_list(path, kind)
    prefixes = tuple(f"{check.module_name(m)}." for m in check.configured_modules())
    for entry in entries:
        assert entry["function"].startswith(prefixes), entry["function"]
        assert check._lines(entry["was"]) != check._lines(entry["now"]), entry
        assert len(str(entry["why"]).split()) >= 4, f"{entry['function']}: say why, in words: {entry['why']!r}"


def test_no_mutant_is_listed_twice_or_in_both_lists():
    entries = check.load_equivalent()
    keys = [(e["function"], tuple(check._lines(e["was"])), tuple(check._lines(e["now"]))) for e in entries]
    repeated = {k for k in keys if keys.count(k) > 1}
    assert not repeated


def test_a_malformed_entry_stops_the_check_naming_it(tmp_path):
    bad = tmp_path / "equivalent.yaml"
    bad.write_text("- function: align.bootstrap.x_check_resamples\n  was: a\n  now: b\n")
    with pytest.raises(SystemExit, match=r"equivalent.yaml entry 0 \(align.bootstrap.x_check_resamples\): needs "
                                         r"function, was, now and a reason \(why\); missing \['why'\]"):
        check.load_list(bad, "equivalent")


def test_each_record_adds_up_and_was_a_passing_check():
    recorded = json.loads(check.VERIFIED.read_text()) if check.VERIFIED.exists() else {}
    configured = set(check.configured_modules())
    for module, f in recorded.items():
        assert module in configured, module
        assert len(f["digest"]) == 64
        assert f["new"] == 0, f"{module}: a record is written only for a passing check"
        assert f["killed"] + f["equivalent"] + f["open"] + f["new"] == f["mutants"], module
        assert f["score"] == pytest.approx(f["killed"] / (f["mutants"] - f["equivalent"]), abs=1e-4), module


def test_a_module_digest_changes_with_its_source_and_its_listed_mutants(tmp_path, monkeypatch):
    module = "align/bootstrap.py"
    entries = check.load_equivalent()
    first = check.module_digest(module, entries)
    assert check.module_digest(module, entries) == first
    extra = {"function": "align.bootstrap.x_resample_indices", "was": "a", "now": "b", "why": "w", "kind": "open"}
    assert check.module_digest(module, [*entries, extra]) != first
    other = {**extra, "function": "align.eval.stats.x_verdict"}
    assert check.module_digest(module, [*entries, other]) == first  # another module's entry
    copy = tmp_path / "align"
    copy.mkdir()
    (copy / "bootstrap.py").write_text((ROOT / module).read_text() + "\n# edited\n")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.setattr(check, "ROOT", tmp_path)
    assert check.module_digest(module, entries) != first


def test_a_changed_or_deleted_test_of_a_module_changes_its_digest(tmp_path, monkeypatch):
    """A record lists the test files that reached the module; its digest covers their text, so editing one
    re-checks the module, and another module's tests do not."""
    module = "align/bootstrap.py"
    entries = check.load_equivalent()
    (tmp_path / "align").mkdir()
    (tmp_path / "align" / "bootstrap.py").write_text((ROOT / module).read_text())
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_bootstrap.py").write_text("def test_a(): pass\n")
    (tmp_path / "tests" / "test_other.py").write_text("def test_b(): pass\n")
    monkeypatch.setattr(check, "ROOT", tmp_path)
    record = {"digest": check.module_digest(module, entries, ["tests/test_bootstrap.py"]),
              "tests": ["tests/test_bootstrap.py"]}
    assert check.recorded_digest(module, entries, record) == record["digest"]
    (tmp_path / "tests" / "test_other.py").write_text("def test_b(): assert 1\n")
    assert check.recorded_digest(module, entries, record) == record["digest"]
    (tmp_path / "tests" / "test_bootstrap.py").write_text("def test_a(): assert 1\n")
    assert check.recorded_digest(module, entries, record) != record["digest"]
    (tmp_path / "tests" / "test_bootstrap.py").unlink()
    assert check.recorded_digest(module, entries, record) != record["digest"]
    assert check.recorded_digest(module, entries, {"digest": "x"}) == check.module_digest(module, entries)


def test_the_tests_reaching_a_module_are_read_from_mutmuts_stats(tmp_path, monkeypatch):
    (tmp_path / "mutants").mkdir()
    (tmp_path / "mutants" / "mutmut-stats.json").write_text(json.dumps({"tests_by_mangled_function_name": {
        "align.bootstrap.x_resample_indices": ["tests/test_bootstrap.py::test_a", "tests/test_x.py::test_b[1]"],
        "align.bootstrap.xǁBootǁrun": ["tests/test_bootstrap.py::test_c"],
        "align.eval.stats.x_verdict": ["tests/eval/test_eval_stats.py::test_d"]}}))
    monkeypatch.setattr(check, "ROOT", tmp_path)
    assert check.reaching_tests("align/bootstrap.py") == ["tests/test_bootstrap.py", "tests/test_x.py"]
    assert check.reaching_tests("align/sweep/run.py") == []


@pytest.mark.parametrize("plant", plants.PLANTS, ids=lambda p: p.name)
def test_every_plant_still_applies_to_the_code_as_it_is(plant):
    source = (ROOT / plant.path).read_text(encoding="utf-8")
    assert source.count(plant.was) == 1, f"{plant.name}: update the plant to {plant.path} as it is now"
    for target in plant.tests:
        assert (ROOT / target).exists(), target


def _with_settings(tmp_path, monkeypatch, **changes) -> None:
    """A copy of the project's pyproject.toml with ``[tool.mutmut]`` list keys replaced, and of the module and
    its test, as check.py's root."""
    import re

    text = (ROOT / "pyproject.toml").read_text()
    for key, values in changes.items():
        text, count = re.subn(rf"^{key} = \[.*?\]$", f"{key} = {_toml_list(values)}".replace("\\", "\\\\"), text,
                              count=1, flags=re.M | re.S)
        assert count == 1, key
    (tmp_path / "pyproject.toml").write_text(text)
    for path in ("align/bootstrap.py", "tests/test_bootstrap.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text())
    monkeypatch.setattr(check, "ROOT", tmp_path)


def _toml_list(values) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def test_a_record_stands_when_modules_or_test_files_are_added_and_falls_when_one_it_needs_leaves(tmp_path,
                                                                                                 monkeypatch):
    """Adding a module to the check, or a test file to the selection, cannot weaken a recorded result; taking
    away a test file that reached the module, or changing how mutants are made, can."""
    import tomllib

    module, entries = "align/bootstrap.py", check.load_equivalent()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    selection = config["pytest_add_cli_args_test_selection"]
    record = {"digest": check.module_digest(module, entries, ["tests/test_bootstrap.py"]),
              "tests": ["tests/test_bootstrap.py"]}
    assert "tests/test_bootstrap.py" in check.selected_tests()
    assert "-m" not in check.selected_tests() and "not slow and not distributed and not vllm" not in \
        check.selected_tests()
    assert check.is_current(module, entries, record, check.selected_tests())

    _with_settings(tmp_path, monkeypatch, only_mutate=[*config["only_mutate"], "align/chat/*"],
                   pytest_add_cli_args_test_selection=[*selection, "tests/chat/"])
    assert check.is_current(module, entries, record, check.selected_tests())
    assert "tests/chat" in check.selected_tests()

    _with_settings(tmp_path, monkeypatch, pytest_add_cli_args_test_selection=[
        a for a in selection if a != "tests/test_bootstrap.py"])
    assert not check.is_current(module, entries, record, check.selected_tests())  # its test left the selection
    assert check.still_selected({"tests": ["tests/test_fingerprint.py"]}, check.selected_tests())

    _with_settings(tmp_path, monkeypatch, do_not_mutate_patterns=["^\\s*raise "])
    assert not check.is_current(module, entries, record, check.selected_tests())  # other mutants made
    assert check.still_selected({"tests": ["tests/chat/test_x.py"]}, ["tests/chat"])
    assert not check.still_selected({"tests": ["tests/chatty.py"]}, ["tests/chat"])
    assert not check.is_current(module, entries, None, check.selected_tests())
