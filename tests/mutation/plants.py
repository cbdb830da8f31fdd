"""Planted bugs: realistic slips in the bookkeeping code, each of which the suite must catch.

Each plant edits one line of a copy of the repository and runs the tests of what it breaks;
a plant the tests pass is a hole in the suite. They are the slips that once went unseen (a
checkpoint fingerprinted by its weights only, a shard list with a wrong range, a doubled
loss, a chosen point by the wrong figure, a halved KV cache, ...) and others of their kind.
The mutation check (``check.py``) covers the same modules mechanically; these are the
reviewed, human-sized cases, run as one command:

    python tests/mutation/plants.py            # every plant
    python tests/mutation/plants.py kv array   # the plants whose name holds a word

Exit status 1 when a plant is not caught, or when its line is no longer in the source (a
plant that silently stops applying would prove nothing).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("align", "rewards", "tests", "recipes", "charter", "examples", "docs", "pyproject.toml", "README.md")


@dataclass(frozen=True)
class Plant:
    name: str
    path: str
    was: str  # the text replaced; it must occur exactly once in the file
    now: str
    tests: tuple[str, ...]


PLANTS = (
    Plant("checkpoint fingerprinted by its weight files only", "align/manifests/inputs.py",
          "            files = [p for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(\".\")\n"
          "                     and p.suffix != \".lock\" and not is_marker(p.name)]",
          "            files = weights", ("tests/test_lifecycle.py",)),
    Plant(".bin weights dropped from the fingerprint", "align/io/fingerprint.py",
          'WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")',
          'WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth")', ("tests/test_fingerprint.py",)),
    Plant("file names left out of a set's fingerprint", "align/io/fingerprint.py",
          "[[p.name, p.stat().st_size, file_digest(p)] for p in files]",
          "[[p.stat().st_size, file_digest(p)] for p in files]", ("tests/test_fingerprint.py",)),
    Plant("array spec [0, 2, 3] written 0,0-3", "align/slurm/scripts.py",
          "            parts.append(str(start) if start == value else f\"{start}-{value}\")\n            start = None\n",
          "            parts.append(str(start) if start == value else f\"{start}-{value}\")\n",
          ("tests/test_slurm_scripts.py",)),
    Plant("the last missing shard left out of a resubmission", "align/manifests/status.py",
          "return total, [i for i in range(total) if i not in done]",
          "return total, [i for i in range(total - 1) if i not in done]", ("tests/stages/test_status.py",)),
    Plant("an edited complete output trusted as current", "align/manifests/rerun.py",
          'if state == "complete" and same and not changed:', 'if state == "complete" and same:',
          ("tests/test_lifecycle.py",)),
    Plant("the loss of a step doubled", "align/trainers/loss_scale.py",
          "return losses.sum() / step_samples * num_processes",
          "return 2 * losses.sum() / step_samples * num_processes", ("tests/trainers/test_loss_scale.py",)),
    Plant("at_edge reports the maximum only", "align/sweep/grid.py",
          "out[key] = chosen[key] in (min(numbers), max(numbers))", "out[key] = chosen[key] == max(numbers)",
          ("tests/test_sweep_bookkeeping.py",)),
    Plant("win_rate_greedy chooses by the sampled figure", "align/sweep/settings.py",
          '"win_rate_greedy": win("greedy")', '"win_rate_greedy": win("sampled")',
          ("tests/test_sweep_bookkeeping.py",)),
    Plant("round 4 on starts from round 2's policy", "align/demo/rounds.py",
          "return state.rounds[method][-1].policy_dir", "return state.rounds[method][0].policy_dir",
          ("tests/demo/test_demo_round_wiring.py",)),
    Plant("KV cache bytes per token halved", "align/plan/memory.py",
          "return 2 * shape.num_layers * heads * shape.head_dim * kv_bytes",
          "return shape.num_layers * heads * shape.head_dim * kv_bytes", ("tests/test_plan_memory_figures.py",)),
    Plant("ZeRO-1 shards gradients", "align/plan/memory.py",
          "(n if stage >= 2 else 1), (n if stage >= 1 else 1)", "(n if stage >= 1 else 1), (n if stage >= 1 else 1)",
          ("tests/test_plan_memory_figures.py",)),
    Plant("a NaN judge probability counted as a loss", "align/eval/stats.py",
          "if p_first_wins is None or not math.isfinite(p_first_wins):", "if p_first_wins is None:",
          ("tests/eval/test_eval_stats.py",)),
    Plant("an interval touching zero said to exclude it", "align/bootstrap.py",
          "return value < self.low or value > self.high", "return value <= self.low or value >= self.high",
          ("tests/test_bootstrap.py",)),
    Plant("weighted bootstrap replicates normalised by the full weight", "align/bootstrap.py",
          "/ np.maximum(w[idx].sum(axis=1), 1e-300)", "/ w.sum()", ("tests/test_bootstrap.py",)),
    Plant('"+5" no longer equal to "5"', "rewards/verifiable.py",
          "(?P<sign>[+-]?)", "(?P<sign>-?)", ("tests/rewards/test_verifiable.py", "tests/rewards/test_verifiable_edges.py")),
    Plant("exact match made case-insensitive", "rewards/verifiable.py",
          "return predicted.strip() == reference.strip()",
          "return predicted.strip().lower() == reference.strip().lower()", ("tests/rewards/test_verifiable.py", "tests/rewards/test_verifiable_edges.py")),
)


def _copy(into: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif source.exists():
            shutil.copy2(source, into / name)


def _caught(plant: Plant, copy: Path) -> tuple[bool, float, str]:
    """Apply the plant to the copy, run its tests there (the copy's modules first on the path), undo it."""
    target = copy / plant.path
    original = target.read_text(encoding="utf-8")
    count = original.count(plant.was)
    if count != 1:
        raise SystemExit(f"[plants] {plant.name}: the planted text occurs {count} times in {plant.path}, "
                         "not once: update the plant to the code as it is now")
    target.write_text(original.replace(plant.was, plant.now), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "-m", "not slow and not distributed and not vllm", *plant.tests],
                              cwd=copy, env=env, capture_output=True, text=True)
    finally:
        target.write_text(original, encoding="utf-8")
    lines = [line for line in done.stdout.splitlines() if line.startswith("FAILED") or " passed" in line
             or " failed" in line or "error" in line.lower()]
    if done.returncode not in (0, 1):  # 2: interrupted or a collection error, 5: nothing ran
        raise SystemExit(f"[plants] {plant.name}: pytest exited {done.returncode}:\n{done.stdout[-3000:]}"
                         f"{done.stderr[-2000:]}")
    return done.returncode == 1, time.monotonic() - start, (lines[0] if lines else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", help="only the plants whose name holds one of these words")
    args = parser.parse_args(argv)
    chosen = [p for p in PLANTS if not args.words or any(w.lower() in p.name.lower() for w in args.words)]
    if not chosen:
        raise SystemExit(f"[plants] no plant's name holds {args.words}")
    missed = []
    with tempfile.TemporaryDirectory(prefix="align-plants-") as tmp:
        copy = Path(tmp)
        _copy(copy)
        for plant in chosen:
            caught, seconds, first = _caught(plant, copy)
            print(f"[plants] {'caught' if caught else 'MISSED'}  {plant.name}  ({plant.path}; "
                  f"{' '.join(plant.tests)}; {seconds:.0f}s){'  ' + first if caught and first else ''}", flush=True)
            if not caught:
                missed.append(plant.name)
    print(f"[plants] {len(chosen) - len(missed)} of {len(chosen)} caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
