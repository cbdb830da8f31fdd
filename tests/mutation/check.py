"""The mutation check: plant small bugs in the bookkeeping code, one at a time, and require a test to fail.

    python tests/mutation/check.py                      # every module in pyproject's [tool.mutmut] only_mutate
    python tests/mutation/check.py align/slurm/scripts.py align/bootstrap.py
    python tests/mutation/check.py --changed-since origin/main
    python tests/mutation/check.py --survivors          # list what survives, with diffs (to kill or review)

mutmut (pyproject.toml, ``[tool.mutmut]``) copies the code into ``mutants/``, makes every
mutant of every function (a flipped comparison, an operator, a number + 1, a dropped call
argument, a value set to None, a string changed), runs the selected fast tests once to learn
which tests reach which function, then runs each mutant against the tests that reach it.

This script runs mutmut on the chosen modules, prints the score of each, and fails when a
mutant survives that ``tests/mutation/equivalent.yaml`` does not list (a mutant that changes
nothing a user can see, each with the reason), or when that list holds an entry that no
longer matches a surviving mutant. docs/testing.md says how to read and close a survivor.

One change to mutmut's own mutants: a string is mutated one way (``"x"`` → ``"XXxXX"``),
not three (mutmut also tries it in lower and upper case): the two case variants of a key
are killed by whatever kills the first, and of a message they add nothing to check.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENT = Path(__file__).with_name("equivalent.yaml")
OPEN = Path(__file__).with_name("open.yaml")  # survivors not killed yet: known, not equivalent
VERIFIED = Path(__file__).with_name("verified.json")  # per module: the digest and figures of its last full check
KILLED = {"killed", "timeout", "segfault"}  # a mutant that makes the tests hang or crash is caught too


def configured_modules() -> list[str]:
    """The source files ``[tool.mutmut] only_mutate`` selects (globs expanded), relative to the root."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    found = set()
    for pattern in config["only_mutate"]:
        for path in ROOT.glob(pattern):
            if path.suffix == ".py" and path.name != "__init__.py":
                found.add(str(path.relative_to(ROOT)))
    return sorted(found)


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def changed_modules(since: str, modules: list[str]) -> list[str]:
    """The modules whose source changed since ``since``; every module when a test, the equivalents or the
    mutation settings changed (any test may be the one that kills a module's mutants)."""
    out = subprocess.run(["git", "diff", "--name-only", since, "--"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    if any(p.startswith("tests/") or p == "pyproject.toml" for p in out):
        return modules
    return [m for m in modules if m in out]


# --------------------------------------------------------------------------- running mutmut


def run_mutmut(modules: list[str], jobs: int, log: Path) -> float:
    """``mutmut run`` on the modules' mutants (all of them rerun), its output into ``log``."""
    globs = [f"{module_name(m)}.*" for m in modules]
    command = [sys.executable, __file__, "--mutmut", "run", "--max-children", str(jobs), *globs]
    start = time.monotonic()
    with log.open("w") as handle:
        done = subprocess.run(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        sys.exit(f"[mutation] mutmut stopped (exit {done.returncode}); the end of {log}:\n{tail}")
    return time.monotonic() - start


def mutmut_main(args: list[str]) -> None:
    """mutmut's command line, with strings mutated one way (see the module docstring)."""
    import libcst as cst
    from mutmut.mutation import mutators

    def one_string_mutant(node: cst.BaseString):
        for mutant in mutators.operator_string(node):
            if "XX" in getattr(mutant, "value", ""):
                yield mutant

    mutators.mutation_operators[:] = [(kind, one_string_mutant if op is mutators.operator_string else op)
                                      for kind, op in mutators.mutation_operators]
    from mutmut.__main__ import cli

    cli.main(args=args, prog_name="mutmut")


# --------------------------------------------------------------------------- reading the results


@dataclass
class Mutant:
    name: str  # align.bootstrap.x_resample_indices__mutmut_8
    module: str  # align/bootstrap.py
    status: str
    was: list[str] = field(default_factory=list)
    now: list[str] = field(default_factory=list)

    @property
    def function(self) -> str:
        return self.name.rsplit("__mutmut_", 1)[0]

    def matches(self, entry: dict) -> bool:
        return entry["function"] == self.function and _lines(entry.get("was")) == self.was and \
            _lines(entry.get("now")) == self.now


def _lines(text: str | None) -> list[str]:
    return [line.strip() for line in (text or "").strip().splitlines() if line.strip()]


def read_results(modules: list[str]) -> list[Mutant]:
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    out = []
    for module in modules:
        meta = ROOT / "mutants" / f"{module}.meta"
        if not meta.exists():
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in sorted(codes.items()):
            mutant = Mutant(name, module, status_by_exit_code[code])
            if mutant.status not in KILLED:
                diff = get_diff_for_mutant(name, path=module).splitlines()
                mutant.was = [d[1:].strip() for d in diff if d.startswith("-") and not d.startswith("---")]
                mutant.now = [d[1:].strip() for d in diff if d.startswith("+") and not d.startswith("+++")]
            out.append(mutant)
    return out


def load_list(path: Path, kind: str) -> list[dict]:
    """The entries of equivalent.yaml or open.yaml, each with ``kind`` set; a malformed entry stops the check."""
    entries = (yaml.safe_load(path.read_text()) or []) if path.exists() else []
    if not isinstance(entries, list):
        sys.exit(f"[mutation] {path.name}: a list of entries, not {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            sys.exit(f"[mutation] {path.name} entry {i}: a mapping with function, was, now and why")
        missing = {"function", "was", "now", "why"} - set(entry)
        if missing or not str(entry.get("why", "")).strip():
            sys.exit(f"[mutation] {path.name} entry {i} ({entry.get('function')}): needs function, was, now "
                     f"and a reason (why); missing {sorted(missing) or ['why']}")
        entry["kind"] = kind
    return entries


def load_equivalent() -> list[dict]:
    """Both lists: the equivalent mutants, then the open ones (killing one means removing its entry)."""
    return load_list(EQUIVALENT, "equivalent") + load_list(OPEN, "open")


# Settings whose change leaves a recorded module's result standing: which modules are mutated (adding
# one checks the new one), and which test files run (a record stands while every test file that reached
# the module is still selected, ``still_selected``; more files can only kill more).
UNBINDING_SETTINGS = ("only_mutate", "pytest_add_cli_args_test_selection")


def module_digest(module: str, entries: list[dict], tests: list[str] | None = None) -> str:
    """What a module's recorded check was made from: its source, its listed mutants, the mutation settings
    (but ``UNBINDING_SETTINGS``), and (``tests``: the test files that reached it when it was recorded) the
    text of its tests, so a changed or deleted test re-checks the modules it reached."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    config = {k: v for k, v in config.items() if k not in UNBINDING_SETTINGS}
    prefix = f"{module_name(module)}."
    listed = sorted(json.dumps({k: e[k] for k in ("function", "was", "now", "kind")}, sort_keys=True)
                    for e in entries if e["function"].startswith(prefix))
    content: dict[str, Any] = {"source": (ROOT / module).read_text(), "listed": listed, "config": config}
    if tests is not None:
        content["tests"] = {path: _file_sha(ROOT / path) for path in sorted(tests)}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _file_sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def reaching_tests(module: str) -> list[str]:
    """The test files whose tests reached the module's functions in the last mutmut run (its stats)."""
    stats = ROOT / "mutants" / "mutmut-stats.json"
    if not stats.exists():
        return []
    by_function = json.loads(stats.read_text()).get("tests_by_mangled_function_name", {})
    prefix = f"{module_name(module)}."
    return sorted({test.split("::")[0] for name, tests in by_function.items() if name.startswith(prefix)
                   for test in tests})


def selected_tests() -> list[str]:
    """The test files and folders of ``[tool.mutmut] pytest_add_cli_args_test_selection`` (options left out)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    args, paths, skip = config["pytest_add_cli_args_test_selection"], [], False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = "=" not in arg and arg in ("-m", "-k", "-p")  # an option that takes the next word
        else:
            paths.append(arg.rstrip("/"))
    return paths


def still_selected(record: dict | None, selection: list[str]) -> bool:
    """Every test file that reached the module when it was recorded is still in the selection."""
    return all(any(test == path or test.startswith(f"{path}/") for path in selection)
               for test in (record or {}).get("tests") or [])


def is_current(module: str, entries: list[dict], record: dict | None, selection: list[str]) -> bool:
    """A module's record stands: made from the same source, listed mutants, settings and tests."""
    return bool(record) and record.get("digest") == recorded_digest(module, entries, record) and \
        still_selected(record, selection)


def recorded_digest(module: str, entries: list[dict], record: dict | None) -> str:
    """The digest to compare with a module's record: over the tests the record lists, where it lists them."""
    return module_digest(module, entries, (record or {}).get("tests"))


def report(mutants: list[Mutant], modules: list[str], entries: list[dict]
           ) -> tuple[list[Mutant], list[dict], dict[str, dict[str, Any]]]:
    """Print the per-module table; return the unlisted survivors, the stale list entries, each module's figures."""
    by_module: dict[str, Counter] = defaultdict(Counter)
    unlisted, used = [], set()
    for m in mutants:
        listed = next((i for i, e in enumerate(entries) if i not in used and m.status not in KILLED and m.matches(e)),
                      None)
        if m.status in KILLED:
            by_module[m.module]["killed"] += 1
        elif listed is not None:
            used.add(listed)
            by_module[m.module][entries[listed]["kind"]] += 1
        else:
            by_module[m.module][m.status] += 1
            unlisted.append(m)
    prefixes = tuple(f"{module_name(m)}." for m in modules)
    stale = [e for i, e in enumerate(entries) if i not in used and e["function"].startswith(prefixes)]
    figures = {module: module_figures(by_module[module]) for module in modules}
    print_table(figures)
    return unlisted, stale, figures


def module_figures(c: Counter) -> dict[str, Any]:
    """mutants, killed, equivalent, open (listed, not killed yet), new (unlisted survivors), score."""
    total = sum(c.values())
    new = total - c["killed"] - c["equivalent"] - c["open"]
    score = c["killed"] / (total - c["equivalent"]) if total - c["equivalent"] else 1.0
    return {"mutants": total, "killed": c["killed"], "equivalent": c["equivalent"], "open": c["open"], "new": new,
            "score": round(score, 4)}


def print_table(figures: dict[str, dict[str, Any]], note: dict[str, str] | None = None) -> None:
    """The score of each module: killed / (mutants - equivalent)."""
    print(f"{'module':40} {'mutants':>7} {'killed':>6} {'equiv.':>6} {'open':>5} {'new':>4} {'score':>7}")
    for module, f in figures.items():
        print(f"{module:40} {f['mutants']:7} {f['killed']:6} {f['equivalent']:6} {f['open']:5} {f['new']:4} "
              f"{f['score']:7.1%}{'  ' + note[module] if note and module in note else ''}")


def show(mutant: Mutant) -> str:
    lines = [f"{mutant.name} ({mutant.status})"]
    lines += [f"  - {line}" for line in mutant.was] + [f"  + {line}" for line in mutant.now]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--mutmut"]:
        mutmut_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="source files (default: every configured module)")
    parser.add_argument("--changed-since", metavar="REF", help="only the modules changed since this git ref")
    parser.add_argument("--unverified", action="store_true", help="only the modules whose source or listed "
                        "mutants differ from their record in verified.json (what CI runs); the others' recorded "
                        "figures are printed")
    parser.add_argument("--record", action="store_true", help="write the checked modules' figures and digests to "
                        "verified.json when the check passes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--survivors", action="store_true", help="read the last run's results; run nothing")
    parser.add_argument("--fresh", action="store_true", help="start from an empty mutants/ (CI does)")
    parser.add_argument("--propose", metavar="WHY", help="with --survivors: print list entries for the unlisted "
                        "survivors, each with this reason (review every one before adding it)")
    args = parser.parse_args(argv)

    os.chdir(ROOT)
    configured = configured_modules()
    modules = args.modules or configured
    unknown = [m for m in modules if m not in configured and not any(fnmatch.fnmatch(m, c) for c in configured)]
    if unknown:
        sys.exit(f"[mutation] not among pyproject's [tool.mutmut] only_mutate: {unknown}")
    entries = load_equivalent()
    if args.changed_since:
        modules = changed_modules(args.changed_since, modules)
        print(f"[mutation] changed since {args.changed_since}: {modules or 'none'}")
    recorded = json.loads(VERIFIED.read_text()) if VERIFIED.exists() else {}
    if args.unverified:
        selection = selected_tests()
        current = [m for m in modules if is_current(m, entries, recorded.get(m), selection)]
        never = [m for m in modules if m not in recorded]
        modules = [m for m in modules if m not in current and m not in never]
        print(f"[mutation] recorded in {VERIFIED.name} and unchanged since: {len(current)} module(s); changed since "
              f"their record, to check now: {modules or 'none'}")
        if current:
            print_table({m: recorded[m] for m in current})
        if never:
            print(f"[mutation] never checked in full, so not held to the check yet ({len(never)}; run "
                  f"`python tests/mutation/check.py MODULE --record`): {', '.join(never)}")
    if not modules:
        return 0
    if not args.survivors:
        if args.fresh:
            subprocess.run(["rm", "-rf", "mutants"], check=True)
        (ROOT / "mutants").mkdir(exist_ok=True)
        seconds = run_mutmut(modules, args.jobs, ROOT / "mutants" / "run.log")
        print(f"[mutation] mutmut ran {len(modules)} module(s) in {seconds:.0f}s with {args.jobs} worker(s)")
    mutants = read_results(modules)
    pending = [m for m in mutants if m.status == "not checked"]
    if pending and args.survivors:  # a run in progress (or stopped): what it has not run yet is no survivor
        if args.record:
            sys.exit(f"[mutation] {len(pending)} mutant(s) not run yet: run the check to the end before --record")
        print(f"[mutation] {len(pending)} mutant(s) not run yet, left out of the lists below")
        mutants = [m for m in mutants if m.status != "not checked"]
    unlisted, stale, figures = report(mutants, modules, entries)
    if args.propose:
        proposals = [{"function": m.function, "was": "\n".join(m.was), "now": "\n".join(m.now), "why": args.propose}
                     for m in unlisted]
        print(yaml.safe_dump(proposals, sort_keys=False, allow_unicode=True, width=120))
        return 0
    for m in unlisted:
        print(show(m))
    for e in stale:
        where = EQUIVALENT.name if e["kind"] == "equivalent" else OPEN.name
        print(f"[mutation] {where}: no surviving mutant matches {e['function']}: {_lines(e['was'])} → "
              f"{_lines(e['now'])} (the code changed or a test kills it now: remove the entry)")
    if unlisted or stale:
        print(f"[mutation] {len(unlisted)} surviving mutant(s) not listed, {len(stale)} stale entr(ies): kill each "
              f"survivor with a test of what a user sees, or list it in {EQUIVALENT.name} with the reason it "
              "changes nothing (docs/testing.md)")
        return 1
    missing = [m for m in modules if not figures[m]["mutants"]]
    if missing:
        print(f"[mutation] no results for {missing}: run without --survivors first")
        return 1
    if args.record:
        for module in modules:
            tests = reaching_tests(module)
            recorded[module] = {"digest": module_digest(module, entries, tests), **figures[module], "tests": tests}
        VERIFIED.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
        print(f"[mutation] recorded {len(modules)} module(s) in {VERIFIED.relative_to(ROOT)}")
    opened = sum(f["open"] for f in figures.values())
    print("[mutation] every mutant is killed or listed" + (f" ({opened} listed open in {OPEN.name})" if opened else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
