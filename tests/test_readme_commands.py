"""Every command in README.md's `bash` blocks runs as written in a fresh clone, or is named
here with the reason it does not run in this test (and where it does run).

The commands run in order, each in its own shell, from the root of a copy of the
repository's tracked and unignored files (what a clone holds), with this environment's
`align` and `python` first on PATH. A README command this test neither runs nor names
fails it, so a new command cannot slip in untested.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND_TIMEOUT_S = 900  # a guard against a hang, not a timing check

# (regular expression a command matches, why this test does not run it and what does)
NOT_RUN = (
    (r"^python3 -m venv .venv && \. \.venv/bin/activate && pip install ",
     "the install: .ci/run runs it from scratch; tests/test_install_pairing.py resolves it"),
    (r"^pip install -e '\.\[(train|vllm)\]'",
     "a GPU node's environment: tests/test_install_pairing.py resolves it against the index"),
    (r"^align demo( reward=graded)?$", "about 4 minutes each; tests/demo runs the graded one with preset=ci"),
    (r"^python -m pytest$", "the test command itself: .ci/run runs it"),
    (r"^bash \.ci/setup_vllm_env\.sh && ", "the vLLM environment: .ci/run builds it and runs these tests"),
    (r"^align submit recipes/apertus-8b/pipeline\.yaml$",
     "submits to a SLURM cluster with GPUs; tests/slurm submits the tiny graph to a one-machine cluster"),
    (r"^align judge-validate .*charter/my_charter\.md$", "a placeholder for the reader's own charter and an 8B judge"),
)

_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)


def readme_commands(markdown: str) -> list[str]:
    """The commands of the `bash` blocks, one per line, comments after `  #` removed."""
    commands = []
    for block in _BASH_BLOCK.findall(markdown):
        for line in block.splitlines():
            command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def why_not_run(command: str) -> str | None:
    return next((why for pattern, why in NOT_RUN if re.search(pattern, command)), None)


COMMANDS = readme_commands((ROOT / "README.md").read_text())


def test_the_parser_reads_bash_blocks_only():
    text = ("```bash\nalign a x.yaml   # note\n\n# a comment\nalign b\n```\n\n```python\nimport x\n```\n"
            "```\nalign c\n```\n")
    assert readme_commands(text) == ["align a x.yaml", "align b"]


def test_each_exception_still_names_a_readme_command():
    """A NOT_RUN entry that matches nothing is stale: the README changed under it."""
    stale = [pattern for pattern, _ in NOT_RUN if not any(re.search(pattern, c) for c in COMMANDS)]
    assert not stale, f"NOT_RUN entries that match no README command: {stale}"


def _clone_copy(dest: Path) -> Path:
    """The files a fresh clone holds: tracked, plus untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow
def test_every_readme_command_runs_as_written_in_a_fresh_clone(tmp_path, say):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no way to tell what a clone holds")
    clone = _clone_copy(tmp_path / "clone")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran = []
    for command in COMMANDS:
        if why_not_run(command):
            continue
        say(command)
        done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False)
        assert done.returncode == 0, (f"README command `{command}` exited {done.returncode}:\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        ran.append(command)
    assert any(c.startswith("align pipeline recipes/tiny/pipeline.yaml") for c in ran)
    assert (clone / "runs" / "tiny" / "evaluate").is_dir(), "the tiny pipeline ran but left no evaluation"
