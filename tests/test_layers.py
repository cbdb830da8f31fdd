"""The layering of docs/architecture.md, checked on the source: imports only go down.

Every module of ``align/`` and ``rewards/`` is parsed with ``ast``; its imports are the
``import`` / ``from ... import`` statements anywhere in it (module level AND inside
functions: an upward import hidden in a function is still an upward import), literal
``importlib.import_module("...")`` calls, and, in package ``__init__`` files, the module
names of the lazy re-export tables. Each import must point to the module's own component,
or to a lower layer; within the layers whose components are peers (``PEER_LAYERS``), one
component does not import another.

``LAYERS`` is the one table of components and layers; docs/architecture.md states the same
(``test_the_architecture_doc_states_the_same_layers``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("align", "rewards")

# component (a package or module, matched by longest prefix) -> layer, bottom = 1
LAYERS: dict[str, int] = {
    # 1: foundations
    "align.chat": 1,
    "align.data": 1,
    "align.jobs": 1,
    "align.io": 1,
    "align.config": 1,
    "align.bootstrap": 1,
    "align.testing": 1,
    # 2: scoring, losses, optimizers, samplers, reward providers
    "align.scoring": 2,
    "align.losses": 2,
    "align.optim": 2,
    "align.sampling": 2,
    "rewards": 2,
    # 3: the offline reference log-prob pass and its cache key
    "align.logprobs": 3,
    # 4: trainers and evaluation
    "align.trainers": 4,
    "align.eval": 4,
    # 5: stages, CLI, the API facade (align/__init__.py), the demo
    "align.stages": 5,
    "align.cli": 5,
    "align.__main__": 5,
    "align": 5,
    "align.demo": 5,
}
# Layers whose components are peers: none imports another (what they share moves down).
PEER_LAYERS = {2, 3, 4}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = module_files()


def component(module: str) -> str | None:
    """The ``LAYERS`` entry a module belongs to (longest matching prefix), None if none."""
    best = None
    for name in LAYERS:
        if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best)):
            best = name
    return best


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative import."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def imports_of(source: str, module: str, *, is_package: bool = False, known: set[str] | None = None,
               lazy_tables: bool = True) -> set[str]:
    """Every module of ours that ``source`` (module ``module``) imports, wherever the import is.

    ``lazy_tables``: count the module names of a package's lazy re-export table (loaded on
    attribute access only, so not followed when asking what an import loads).
    """
    known = set(MODULES) if known is None else known
    tree = ast.parse(source)
    found: set[str] = set()
    docstring = ast.get_docstring(tree, clean=False)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if _ours(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module) if node.level else node.module or ""
            if not _ours(base):
                continue
            for alias in node.names:  # `from align.eval import stats` imports the module align.eval.stats
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "import_module" and isinstance(node.args[0].value, str) and _ours(node.args[0].value):
                found.add(node.args[0].value)
        elif (is_package and lazy_tables and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value != docstring and node.value in known):
            found.add(node.value)  # a lazy re-export table: {"name": "align.x.y"}
    found.discard(module)
    return found


def violations(module: str, targets: set[str]) -> list[str]:
    """The imports of ``module`` that break the layering, as readable lines."""
    own = component(module)
    if own is None:
        return [f"{module}: not in LAYERS (place it in a layer, here and in docs/architecture.md)"]
    out = []
    for target in sorted(targets):
        theirs = component(target)
        if theirs is None:
            out.append(f"{module} -> {target}: {target} is not in LAYERS")
        elif theirs == own:
            continue
        elif LAYERS[theirs] > LAYERS[own]:
            out.append(f"{module} (layer {LAYERS[own]}) -> {target} (layer {LAYERS[theirs]}): upward import")
        elif LAYERS[theirs] == LAYERS[own] and LAYERS[own] in PEER_LAYERS:
            out.append(f"{module} -> {target}: peers in layer {LAYERS[own]} ({own}, {theirs}) import each other")
    return out


def import_graph(*, lazy_tables: bool = True) -> dict[str, set[str]]:
    return {module: imports_of(path.read_text(), module, is_package=path.name == "__init__.py",
                               lazy_tables=lazy_tables)
            for module, path in MODULES.items()}


GRAPH = import_graph()


def test_every_module_is_in_a_layer():
    assert [m for m in MODULES if component(m) is None] == []


def test_imports_only_go_down_and_peers_stay_independent():
    problems = [line for module, targets in sorted(GRAPH.items()) for line in violations(module, targets)]
    assert problems == [], "\n".join(problems)


def test_rewards_never_reaches_the_training_stack():
    """An annotation node loads no Trainer: nothing that importing rewards can load is align.trainers."""
    loads = import_graph(lazy_tables=False)
    seen, todo = set(), [m for m in MODULES if m.split(".")[0] == "rewards"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for target in loads.get(module, ()):
            todo.append(target)
            parts = target.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent __init__ files run too
    assert sorted(m for m in seen if m.startswith(("align.trainers", "align.stages", "align.eval"))) == []


@pytest.mark.parametrize("source", [
    "from align.trainers import PreferenceTrainer\n",
    "def f():\n    from align.trainers.preference_trainer import train\n    return train\n",
    "import align.logprobs\n",
    "def f():\n    import importlib\n    return importlib.import_module('align.eval.stats')\n",
    "from align import stages\n",
])
def test_an_upward_import_in_scoring_is_caught_at_module_or_function_level(source):
    module = "align.scoring.example"
    problems = violations(module, imports_of(source, module))
    assert problems and "upward import" in problems[0], problems


@pytest.mark.parametrize(("module", "source"), [
    ("align.eval.example", "def f():\n    from align.trainers.callbacks import bind_callbacks\n"),
    ("rewards.example", "from align.sampling.base import Completion\n"),
    ("align.scoring.example", "from align.losses import dpo_loss\n"),
])
def test_a_peer_import_is_caught(module, source):
    problems = violations(module, imports_of(source, module))
    assert problems and "peers" in problems[0], problems


def test_relative_imports_and_lazy_tables_count():
    assert imports_of("from .collators import SequenceCollator\n", "align.scoring.logps") == {
        "align.scoring.collators"}
    assert imports_of("from ..trainers import train\n", "align.scoring.logps") == {"align.trainers"}
    table = '"""Doc."""\n_LAZY = {"train": ("align.trainers.preference_trainer", "train")}\n'
    assert imports_of(table, "align.scoring", is_package=True) == {"align.trainers.preference_trainer"}


def test_the_architecture_doc_states_the_same_layers():
    """The diagram in docs/architecture.md names each component, in parentheses, on its layer's lines."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers and what may import what", 1)[1]
    diagram = section.split("```", 2)[1]
    stated: dict[str, int] = {}
    layer = None
    for line in diagram.splitlines():
        match = re.match(r"\s*(\d+)\s", line)
        if match:
            layer = int(match.group(1))
        for group in re.findall(r"\(([^)]*)\)", line):
            for name in (part.strip() for part in group.split(",")):
                if re.fullmatch(r"(align|rewards)(\.\w+)*", name):
                    stated[name] = layer
    assert stated == LAYERS
