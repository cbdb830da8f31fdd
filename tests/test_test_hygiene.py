"""Rules the test suite itself follows, checked on its source (an `ast` pass over tests/).

* No test changes ``sys.path`` for the whole session: helpers of another folder are loaded
  from their file (``importlib``) or with ``monkeypatch.syspath_prepend``.
* ``pytest.importorskip`` only for vLLM, the one optional dependency: a hard or dev
  dependency that fails to import must fail the run, not skip it (CI allows no other skip,
  see ``ALLOWED_SKIPS`` in tests/conftest.py).
* Distributed launchers (``torch.distributed.run``, ``accelerate launch``) start on a free
  port: only tests/ports.py spells them, and files that pass a port themselves take it from
  ``ports.free_port``. The default rendezvous port 29500 collides between concurrent runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LAUNCHERS = ("torch.distributed.run", "accelerate.commands.launch", "torchrun ")
OPTIONAL = {"vllm"}


def _sources() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = str(path.relative_to(TESTS.parent))
        out.append((rel, ast.parse(path.read_text(), filename=rel)))
    return out


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (they may name a launcher)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_the_rules_see_the_suite():
    names = [rel for rel, _ in _sources()]
    assert "tests/ports.py" in names and "tests/conftest.py" in names and len(names) > 50


def test_no_test_changes_sys_path():
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _dotted(node.func) in ("sys.path.insert", "sys.path.append",
                                                                     "sys.path.extend"):
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"sys.path changed for the whole session (use importlib or monkeypatch): {found}"


def test_importorskip_only_for_optional_dependencies():
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _dotted(node.func) == "pytest.importorskip":
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if name not in OPTIONAL:
                    found.append(f"{rel}:{node.lineno} ({name})")
    assert not found, f"importorskip of a required dependency (import it plainly): {found}"


def test_launchers_start_on_a_free_port():
    offending = []
    for rel, tree in _sources():
        if rel in ("tests/ports.py", "tests/test_test_hygiene.py"):
            continue
        docstrings = _docstrings(tree)
        spelled = [node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                   and any(launcher in node.value for launcher in LAUNCHERS)]
        from_ports = {alias.name for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module == "ports" for alias in node.names}
        if spelled and "free_port" not in from_ports:
            offending.append(f"{rel}:{spelled}")
    assert not offending, (f"a launcher spelled outside tests/ports.py without a port from ports.free_port: "
                           f"{offending}; use ports.torchrun / ports.accelerate_launch")


def _imported(tree: ast.Module) -> set[str]:
    """Every module a test file imports (anywhere in it), by its dotted name."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def _quick_modules() -> set[str]:
    """QUICK_MODULES as tests/conftest.py writes it (read from its source: `conftest` may name another folder's)."""
    tree = ast.parse((TESTS / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "QUICK_MODULES" for t in node.targets):
            return set(ast.literal_eval(node.value.args[0]))
    raise AssertionError("tests/conftest.py defines no QUICK_MODULES")


def test_the_quick_selection_reaches_every_package():
    QUICK_MODULES = _quick_modules()
    root = TESTS.parent
    assert all((root / path).is_file() for path in QUICK_MODULES), "a quick module that does not exist"
    assert not any(path.startswith(("tests/slurm/", "tests/distributed/", "tests/vllm/")) for path in QUICK_MODULES)
    imported = set()
    for path in QUICK_MODULES:
        imported |= _imported(ast.parse((root / path).read_text()))
    packages = sorted({".".join(init.parent.relative_to(root).parts) for top in ("align", "rewards")
                       for init in (root / top).rglob("__init__.py")})
    missed = [p for p in packages if not any(name == p or name.startswith(p + ".") for name in imported)]
    assert not missed, f"packages no quick test imports: {missed}"

