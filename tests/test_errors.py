"""The user-facing errors (align.errors): the CLI prints only these as one line with exit
status 2, anything else keeps its traceback; the classes that existed before are these;
library errors from what a user named are translated where they happen; and no module
raises a bare ValueError / OSError / ImportError for a user's mistake (an ``ast`` pass over
``align/`` and ``rewards/``, with an allow-list of internal argument checks, each with its
reason).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import align
from align.cli import main
from align.errors import (
    AlignError,
    ConfigError,
    InputError,
    MissingDependencyError,
    MissingInputError,
    RecordError,
    ServiceError,
    loading,
    optional_import,
)

ROOT = Path(__file__).resolve().parents[1]


def run_main(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(args)
    return rc, err.getvalue()


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("error", [ValueError("a bug"), KeyError("a bug"), OSError("a bug"), TypeError("a bug")])
def test_an_exception_that_is_not_an_align_error_keeps_its_traceback(monkeypatch, error):
    """A ValueError or OSError raised inside a stage is a bug: it leaves main() as it is (the
    interpreter prints its traceback, exit status 1), never the one-line exit 2."""
    import align.stages.pairs

    def run(config):
        raise error

    monkeypatch.delenv("ALIGN_TRACEBACK", raising=False)
    monkeypatch.setattr(align.stages.pairs, "run", run)
    with pytest.raises(type(error), match="a bug"):
        run_main(["pairs", "input=x.jsonl"])


def test_an_align_error_is_one_line_with_exit_2_and_a_traceback_on_request(monkeypatch):
    import align.stages.pairs

    def run(config):
        raise RecordError("a", "rewards[1]", "nan")

    monkeypatch.setattr(align.stages.pairs, "run", run)
    monkeypatch.delenv("ALIGN_TRACEBACK", raising=False)
    rc, err = run_main(["pairs", "input=x.jsonl"])
    assert rc == 2
    assert err.splitlines() == ["align pairs: RecordError: record 'a': field 'rewards[1]': nan"]
    monkeypatch.setenv("ALIGN_TRACEBACK", "1")
    with pytest.raises(RecordError):
        run_main(["pairs", "input=x.jsonl"])


def test_the_console_script_exits_1_with_a_traceback_for_a_bug(tmp_path):
    """What `align` does on a terminal: an uncaught KeyError from a stage is a traceback and
    exit status 1 (the same main() the console script runs)."""
    code = ("import sys, align.stages.pairs as stage\n"
            "def run(config):\n    raise KeyError('not the user’s fault')\n"
            "stage.run = run\n"
            "from align.cli import main\n"
            "sys.exit(main(['pairs', 'input=x.jsonl']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          check=False)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "KeyError" in done.stderr
    assert "align pairs: KeyError" not in done.stderr


def test_a_bad_input_file_is_one_line_naming_the_file_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ALIGN_TRACEBACK", raising=False)
    (tmp_path / "in.jsonl").write_bytes(b'{"id": "a"}\n{"id": "\xff"}\n')
    rc, err = run_main(["pairs", f"input={tmp_path / 'in.jsonl'}", f"output_dir={tmp_path / 'out'}"])
    assert rc == 2
    expected = (f"align pairs: InputError: {tmp_path / 'in.jsonl'}:2: not UTF-8 text: byte 20 is b'\\xff' (invalid "
                "start byte); JSONL is read as UTF-8: save it as UTF-8 (a Latin-1 file: iconv -f latin1 -t utf-8)")
    assert err.splitlines() == [expected]


# --------------------------------------------------------------------------- the classes


def test_each_class_is_also_the_built_in_it_replaced():
    assert issubclass(ConfigError, ValueError) and issubclass(InputError, ValueError)
    assert issubclass(RecordError, ValueError) and issubclass(MissingInputError, InputError)
    assert issubclass(MissingInputError, FileNotFoundError) and issubclass(ServiceError, RuntimeError)
    assert issubclass(MissingDependencyError, ImportError)
    for cls in (ConfigError, InputError, MissingInputError, RecordError, ServiceError, MissingDependencyError):
        assert issubclass(cls, AlignError)
        assert getattr(align, cls.__name__) is cls  # the Python API exports them
    assert align.AlignError is AlignError


def test_the_errors_that_existed_before_are_these_classes():
    from align.config import ConfigError as config_error
    from align.data.decontaminate import FieldProblem
    from align.data.records import RecordError as record_error
    from align.io.http import ServerError
    from align.manifests import StaleOutputError
    from align.sampling.base import PromptTooLongError
    from align.scoring import OverMaxLengthError
    from rewards.charter import CharterError

    assert config_error is ConfigError and record_error is RecordError
    assert issubclass(ServerError, ServiceError) and issubclass(ServerError, OSError)
    for cls in (StaleOutputError, PromptTooLongError, CharterError, FieldProblem):
        assert issubclass(cls, InputError), cls
    assert issubclass(OverMaxLengthError, RecordError)
    error = RecordError("r1", "chosen", "empty")
    assert (error.record_id, error.field, error.problem) == ("r1", "chosen", "empty")


# --------------------------------------------------------------------------- library errors, translated


def test_loading_names_the_setting_for_what_a_library_cannot_load(tmp_path):
    from transformers import AutoTokenizer

    not_a_model = tmp_path / "not_a_model"
    not_a_model.mkdir()
    with (pytest.raises(InputError, match=r"^tokenizer='.*not_a_model': cannot be loaded \(ValueError: "),
          loading("tokenizer", not_a_model)):
        AutoTokenizer.from_pretrained(str(not_a_model))
    with (pytest.raises(MissingInputError, match=r"^input='.*gone.jsonl': not found \(FileNotFoundError: "),
          loading("input", tmp_path / "gone.jsonl")):
        (tmp_path / "gone.jsonl").read_text()
    with pytest.raises(KeyError), loading("model", "m"):  # anything else is not the user's input: untouched
        raise KeyError("bug")


def test_optional_import_says_what_to_install():
    with pytest.raises(MissingDependencyError, match=r"backend=vllm needs align_no_such_module_xyz, which did not "
                                                     r"import \(ModuleNotFoundError: .*\): pip install x") as raised:
        optional_import("align_no_such_module_xyz", needed_by="backend=vllm", install="pip install x")
    assert isinstance(raised.value, ImportError)
    assert optional_import("json", needed_by="x", install="y") is json


def test_a_marker_or_job_file_that_is_not_json_names_the_file(tmp_path):
    from align.io import stage_completion_info
    from align.io.shards import check_fingerprint

    (tmp_path / "_COMPLETE.json").write_text('{"stage": "pairs", ')
    with pytest.raises(InputError, match=r"_COMPLETE\.json: not a completion marker \(not valid JSON"):
        stage_completion_info(tmp_path)
    (tmp_path / "_job.json").write_text("{oops")
    with pytest.raises(InputError, match=r"_job\.json: not a job fingerprint \(not valid JSON"):
        check_fingerprint(tmp_path, {"model": "m"})


def test_a_file_that_is_not_parquet_names_the_file(tmp_path):
    from align.io import read_records

    path = tmp_path / "rows.parquet"
    path.write_text("not parquet at all")
    with pytest.raises(InputError, match=r"rows\.parquet: not a readable Parquet file"):
        read_records(path)


@dataclass
class Inner:
    size: int = 1

    def __post_init__(self):
        if self.size < 1:
            raise ConfigError(f"size: must be >= 1, got {self.size}")


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)


@dataclass
class Buggy:
    size: int = 1

    def __post_init__(self):
        raise ValueError("a bug in a check")


def test_a_config_check_is_a_config_error_naming_the_nested_section_and_a_bug_is_not():
    from align.config import from_dict

    with pytest.raises(ConfigError, match=r"^inner: size: must be >= 1, got 0$"):
        from_dict(Outer, {"inner": {"size": 0}})
    with pytest.raises(ValueError, match="a bug in a check") as raised:
        from_dict(Buggy, {})
    assert not isinstance(raised.value, AlignError)


def test_transformers_own_argument_checks_are_config_errors(tmp_path):
    from align.trainers.preference_config import PreferenceConfig

    with pytest.raises(ConfigError, match="load_best_model_at_end"):
        PreferenceConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], eval_strategy="steps",
                         save_strategy="epoch", load_best_model_at_end=True)


# --------------------------------------------------------------------------- the rule, on the source

# Raising these for a user's mistake is what align.errors replaces.
BUILT_INS = {"ValueError", "OSError", "EnvironmentError", "IOError", "FileNotFoundError", "FileExistsError",
             "IsADirectoryError", "NotADirectoryError", "PermissionError", "ImportError", "ModuleNotFoundError"}

# The internal ones: argument checks of functions that only align's own code feeds, where a
# failure is a bug. module -> (functions, why).
INTERNAL = {
    "align/losses.py": (
        {"_as_vector", "_check_lengths", "_check_same_size", "_check_quantiles", "qrpo_terms", "dpo_loss"},
        ("tensor arguments of the pure loss functions: the trainer builds them from rows checked before "
         "(RecordError there), so a bad one is a bug; ValueError is a pure function's argument contract")),
    "align/bootstrap.py": (
        {"_as_array", "resample_indices", "bootstrap_mean", "bootstrap_statistic", "paired_difference"},
        "per-unit statistics that evaluation and judge validation compute themselves"),
    "align/eval/stats.py": ({"win_rate", "pooled_win_rate"}, "comparison outcomes (1, 0.5, 0) that the evaluation computes"),
    "align/eval/kl.py": ({"sequence_logps"}, "the evaluation's own generations, each with its end-of-turn token"),
    "rewards/validation/ranks.py": ({"kendall_tau", "spearman_rho"}, "score lists judge validation pairs up itself"),
    "align/scoring/flex.py": ({"layout_block_mask"}, "the collators make block_ids and block_parts together, "
                                                      "of one (rows, L) shape"),
    "align/scoring/collators.py": (
        {"_check_sequences", "collate_padding_free"},
        "sequences the pass and the trainer encode from checked rows, and the mask dtype they pass"),
    "align/scoring/logps.py": (
        {"token_logps_at", "last_hidden_state"},
        "tiled=True and a backbone are asked for by align's own callers, after tiled_head said yes"),
    "align/jobs/runner.py": (
        {"_check_outputs", "plan_batches"},
        "process_batch is the caller's code: outputs that do not match its batch are a bug; run_job computes "
        "plan_batches' one size per record itself (a user's budget is checked before it, ConfigError)"),
    "align/logprobs.py": ({"ref_cache_key"}, "the key's fields come from cache_fields_for, never from a user"),
    "rewards/base.py": ({"Score.__post_init__"}, "a Score is made by a provider's code, not from user input"),
    "align/plan/memory.py": ({"head_peak"}, "the head kind is set by align.plan itself from the stage's kind"),
}


def built_in_raises(source: str) -> list[tuple[str, str, int]]:
    """(enclosing function, exception, line) of each ``raise X(...)`` / ``raise X`` /
    ``return X(...)`` (an error built to be raised elsewhere) of a ``BUILT_INS`` class."""
    found = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope + (child.name,) if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                 ast.ClassDef)) else scope
            target = child.exc if isinstance(child, ast.Raise) else child.value if isinstance(child, ast.Return) \
                else None
            func = target.func if isinstance(target, ast.Call) else target if isinstance(child, ast.Raise) else None
            if isinstance(func, ast.Name) and func.id in BUILT_INS:
                found.append((".".join(scope), func.id, child.lineno))
            visit(child, inner)

    visit(ast.parse(source), ())
    return found


def test_user_facing_modules_raise_align_errors_not_bare_built_ins():
    problems, seen = [], set()
    for package in ("align", "rewards"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            allowed = INTERNAL.get(rel, (set(), ""))[0]
            for function, name, line in built_in_raises(path.read_text()):
                if function in allowed:
                    seen.add((rel, function))
                else:
                    problems.append(f"{rel}:{line} ({function or 'module'}): raise {name}(...): a user's mistake "
                                    "raises a class of align.errors; an internal check goes into INTERNAL with why")
    assert problems == [], "\n".join(problems)
    stale = sorted((rel, f) for rel, (functions, _) in INTERNAL.items() for f in functions if (rel, f) not in seen)
    assert stale == [], f"allow-listed but raising no built-in any more: {stale}"


@pytest.mark.parametrize(("source", "expected"), [
    ("def f(x):\n    if x:\n        raise ValueError('bad')\n", [("f", "ValueError", 3)]),
    ("class C:\n    def g(self):\n        raise FileNotFoundError\n", [("C.g", "FileNotFoundError", 3)]),
    ("def e(i):\n    return OSError(f'{i}')\n", [("e", "OSError", 2)]),
    ("def f():\n    raise ConfigError('x')\n", []),
    ("def f():\n    raise RuntimeError('invariant')\n", []),
])
def test_the_source_check_finds_what_it_should(source, expected):
    assert built_in_raises(source) == expected
