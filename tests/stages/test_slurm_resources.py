"""Every SLURM command a recipe writes in its header asks for the GPUs its recipe needs.

A recipe opens with the commands that run it. For each ``sbatch`` line there, the GPUs one
task gets (``--gpus-per-task`` on the line, else the script's ``#SBATCH --gpus-per-task``
default) must be at least the largest tensor-parallel size the recipe sets anywhere
(``tensor_parallel_size`` in a sampler section or in ``engine_kwargs``, of the stage or of
its reward provider): with fewer, vLLM cannot start its engine. The ``STAGE`` a line passes
must be one the script accepts, and a recipe of a stage other than ``annotate`` must pass it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
SLURM = RECIPES / "slurm"
RECIPE_FILES = sorted(RECIPES.glob("*/*.yaml")) + sorted(RECIPES.glob("*.yaml"))


def header(path: Path) -> list[str]:
    """The recipe's opening comment lines, without the leading '#'."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return lines


def sbatch_commands(path: Path) -> list[list[str]]:
    """The shell words of each sbatch command in a recipe's header (env assignments included):
    a line that is a command (``sbatch ...``, ``STAGE=x sbatch ...``, ``As a SLURM array: sbatch ...``),
    not one that only mentions sbatch."""
    commands = []
    for line in header(path):
        text = (line[line.index(":") + 1:] if line.startswith("As a SLURM") else line).strip()
        if not re.match(r"(?:[A-Z_]+=\S+\s+)*sbatch\s", text):
            continue
        words = shlex.split(text)
        start = next(i for i, w in enumerate(words) if w == "sbatch")
        env = [w for w in words[:start] if re.fullmatch(r"[A-Z_]+=\S*", w)]
        commands.append(env + words[start:])
    return commands


def script_default(script: Path, option: str) -> str | None:
    for line in script.read_text().splitlines():
        if m := re.match(rf"#SBATCH\s+--{option}[= ](\S+)", line):
            return m.group(1)
    return None


def accepted_stages(script: Path) -> set[str]:
    """The STAGE values the script's case statement lets through."""
    text = script.read_text()
    m = re.search(r'case "\$STAGE" in\s*\n\s*([a-z_|]+)\)', text)
    assert m, f"{script.name}: no STAGE case statement"
    return set(m.group(1).split("|"))


def largest_tp(node: Any) -> int:
    """The largest tensor_parallel_size anywhere in a recipe (1 when none is set)."""
    if isinstance(node, dict):
        own = [int(v) for k, v in node.items() if k == "tensor_parallel_size" and v is not None]
        return max([1, *own, *(largest_tp(v) for v in node.values())])
    if isinstance(node, list):
        return max([1, *(largest_tp(v) for v in node)])
    return 1


COMMANDS = [(path, words) for path in RECIPE_FILES for words in sbatch_commands(path)]


def test_recipes_write_sbatch_commands():
    assert len(COMMANDS) >= 10  # the apertus recipes' annotation, sampling and evaluation lines


@pytest.mark.parametrize(("path", "words"), COMMANDS,
                         ids=[f"{p.parent.name}/{p.name}:{i}" for i, (p, _) in enumerate(COMMANDS)])
def test_sbatch_line_asks_for_the_gpus_its_recipe_uses(path, words):
    script = next((ROOT / w for w in words if w.endswith(".sbatch")), None)
    assert script is not None and script.exists(), f"{path}: {' '.join(words)} names no sbatch script here"
    assert str(path.relative_to(ROOT)) in words, f"{path}: the command runs another recipe: {' '.join(words)}"
    options = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
    gpus = options.get("gpus-per-task") or script_default(script, "gpus-per-task")
    if gpus is None:  # a whole-node script (train_multinode): GPUs per node
        gpus = options.get("gpus-per-node") or script_default(script, "gpus-per-node")
    needed = largest_tp(yaml.safe_load(path.read_text()))
    assert gpus is not None and int(gpus) >= needed, (
        f"{path.relative_to(ROOT)}: `{' '.join(words)}` gives each task {gpus} GPU(s), but the recipe sets "
        f"tensor_parallel_size {needed}")
    if script.name == "annotate_array.sbatch":
        env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=\S*", w))
        stage = env.get("STAGE", "annotate")
        assert stage in accepted_stages(script), f"{path}: STAGE={stage} is refused by {script.name}"
        recipe = yaml.safe_load(path.read_text())
        expected = ("evaluate" if "policies" in recipe else "sample" if "sampler" in recipe and "provider" not in recipe
                    else "annotate")
        assert stage == expected, f"{path}: runs as STAGE={stage}, but it is a recipe of align {expected}"


def test_the_array_script_accepts_every_sharded_stage():
    assert accepted_stages(SLURM / "annotate_array.sbatch") >= {"annotate", "sample", "evaluate"}


def test_the_array_scripts_default_gpus_cover_its_own_usage_lines():
    """The usage lines in the scripts' own headers follow the same rule."""
    for script in sorted(SLURM.glob("*.sbatch")):
        for line in header(script):
            if "sbatch " not in line or ".yaml" not in line:
                continue
            words = shlex.split(line)
            recipe = ROOT / next(w for w in words if w.endswith(".yaml") and w.startswith("recipes/apertus"))
            options = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
            gpus = options.get("gpus-per-task") or script_default(script, "gpus-per-task") \
                or options.get("gpus-per-node") or script_default(script, "gpus-per-node")
            needed = largest_tp(yaml.safe_load(recipe.read_text()))
            assert int(gpus) >= needed, f"{script.name}: `{line}` gives {gpus} GPU(s), {recipe.name} uses TP {needed}"
