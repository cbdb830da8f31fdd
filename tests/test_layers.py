"""The layering of docs/architecture.md, checked on the source: imports only go down.

Every module of ``align/`` and ``rewards/`` is parsed with ``ast``; its imports are the
``import`` / ``from ... import`` statements anywhere in it (module level AND inside
functions: an upward import hidden in a function is still an upward import), literal
``importlib.import_module("...")`` calls, and, in package ``__init__`` files, the module
names of the lazy re-export tables. Each import must point to the module's own component,
or to a lower layer; within the layers whose components are peers (``PEER_LAYERS``), one
component does not import another.

More rules, with no exception: no stage module imports anything of ``align.stages`` (stages
talk through datasets on disk; the drivers, ``align.drivers``, reach a stage through the stage
table, ``align.stage_table``), no module imports a private name (``_something``) of another
component (what a component offers others is public, and what two components both need
moves down a layer or becomes public), and no module reaches itself through its imports: an
import cycle of any length is one module in several files.

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
    "align.errors": 1,
    "align.slurm": 1,
    "align.stage_table": 1,  # what each stage is: module, job kind, row contract... (no heavy imports)
    "align.ranks": 1,  # who writes, rank 0's decision shared, a launch's process group
    "align.stopping": 1,  # stopping at a safe point when the cluster asks (time limit, preemption)
    "align.recipe": 1,  # recipes of every shape read into steps (the stage configs are handed in)
    "rewards.charter": 1,  # charters and prompt templates: the judge and the manifests read them
    # 2: scoring, losses, optimizers, samplers
    "align.scoring": 2,
    "align.losses": 2,
    "align.optim": 2,
    "align.sampling": 2,
    # 3: the offline reference log-prob pass and its cache key; stage manifests and rerun rules;
    # reward providers (their generators are samplers)
    "rewards": 3,
    "align.logprobs": 3,
    "align.manifests": 3,
    "align.plan": 3,  # memory plans: bytes per GPU from a model's config.json
    # 4: trainers and evaluation
    "align.trainers": 4,
    "align.eval": 4,
    # 5: stages, CLI, the API facade (align/__init__.py), the demo, tuning on a grid (trainers + eval)
    "align.stages": 5,
    "align.drivers": 5,  # the commands whose input is a whole recipe: pipeline, step, status, submit, plan
    "align.cli": 5,
    "align.__main__": 5,
    "align": 5,
    "align.demo": 5,
    "align.card": 5,  # a model card written from the manifests and the evaluation
    "align.sweep": 5,
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


def stage_violations(module: str, targets: set[str]) -> list[str]:
    """A stage module's imports of other stage modules."""
    if not module.startswith("align.stages."):
        return []
    return [f"{module} -> {target}: a stage imports another stage (stages talk through datasets on disk; "
            "what two stages share goes to a lower layer)"
            for target in sorted(targets) if target == "align.stages" or target.startswith("align.stages.")]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Private names (``_x``, or a name inside a private module) that ``source`` imports from
    another component, wherever the import is."""
    own = component(module)
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module) if node.level else node.module or ""
            names = [(base, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [(alias.name, None) for alias in node.names]
        else:
            continue
        for base, name in names:
            if not _ours(base) or component(base) == own:
                continue
            dotted = f"{base}.{name}" if name else base
            if any(_private(part) for part in dotted.split(".")):
                out.append(f"{module} -> {dotted}: imports a private name of {component(base)} "
                           "(make it public, or move what both need down a layer)")
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


def test_no_stage_imports_another_stage():
    problems = [line for module, targets in sorted(GRAPH.items()) for line in stage_violations(module, targets)]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(("module", "source"), [
    ("align.stages.judge_validate", "from align.stages.annotate import _generate\n"),
    ("align.stages.evaluate", "def f():\n    from align.stages import annotate\n    return annotate.Config\n"),
    ("align.stages.sample", "import align.stages.train\n"),
    ("align.stages.pairs", "from . import logprobs\n"),
    ("align.stages.demo", "from align.stages.pipeline import Config\n"),
    ("align.stages.sft", "from align.stages import common\n"),
    ("align.stages.train", "from align.stages import stage_module\n"),
])
def test_a_stage_importing_another_stage_is_caught(module, source):
    problems = stage_violations(module, imports_of(source, module))
    assert problems and "a stage imports another stage" in problems[0], problems


@pytest.mark.parametrize(("module", "source"), [
    ("align.stages.annotate", "from align.manifests.lifecycle import run_stage\n"),
    ("align.drivers.pipeline", "from align.stage_table import spec\nfrom align.drivers.args import load_recipe\n"),
    ("align.stages.annotate", "from rewards.config import build_reward_provider\n"),
])
def test_what_a_stage_and_a_driver_may_import(module, source):
    assert stage_violations(module, imports_of(source, module)) == []


def test_no_module_imports_a_private_name_of_another_component():
    problems = [line for module, path in sorted(MODULES.items())
                for line in private_imports(path.read_text(), module, is_package=path.name == "__init__.py")]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(("module", "source"), [
    ("align.stages.example", "from rewards.reward_model import _load\n"),
    ("align.eval.example", "def f():\n    from align.io.files import _umask\n    return _umask()\n"),
    ("rewards.example", "from align.jobs import run_job, _check as check\n"),
    ("align.trainers.example", "import align.scoring._kernels\n"),
    ("align.stages.example", "from align.stages.annotate import ok\nfrom align.eval._impl import thing\n"),
])
def test_a_private_import_across_components_is_caught(module, source):
    problems = private_imports(source, module)
    assert problems and "imports a private name" in problems[0], problems


@pytest.mark.parametrize(("module", "source"), [
    ("rewards.judge", "from rewards.text import _within_the_package\n"),
    ("align.stages.evaluate", "from align.stages.common import _shared_by_stages\n"),
    ("align.eval.report", "from .summary import _helper\n"),
    ("align.stages.annotate", "from align import __version__\n"),
])
def test_private_imports_within_a_component_are_allowed(module, source):
    assert private_imports(source, module) == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that reach each other through their imports (strongly connected
    components of two or more modules, Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_module_reaches_itself_through_its_imports():
    """What an import loads (lazy tables aside): modules that import each other, directly or around a
    cycle of any length, even for type annotations only, are one module in several files; what they
    share moves to another."""
    assert import_cycles(import_graph(lazy_tables=False)) == []


def test_a_cycle_of_three_modules_is_found():
    graph = {"align.demo.measures": {"align.demo.rounds"}, "align.demo.rounds": {"align.demo.report"},
             "align.demo.report": {"align.demo.measures", "align.io"}, "align.io": set()}
    assert import_cycles(graph) == [["align.demo.measures", "align.demo.report", "align.demo.rounds"]]
    graph["align.demo.report"] = {"align.io"}
    assert import_cycles(graph) == []


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
    ("rewards.example", "from align.logprobs import ref_cache_key\n"),
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
