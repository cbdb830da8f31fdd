"""charter/ from a non-editable install: build a wheel from a copy of the sources, install it
(no deps, no build isolation) into a fresh target directory, and load every charter and
template from another working directory, with the checkout nowhere on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import rewards, rewards.charter as c
site = sys.argv[1]
assert rewards.__file__.startswith(site), rewards.__file__
assert str(c.charter_dir()).startswith(site), c.charter_dir()
names = sorted(p.name for p in c.charter_dir().iterdir())
default = c.load_charter()
example = c.load_charter("charter/example_de.md")
for t in ("judge_pointwise", "judge_pairwise", "controversy_system", "controversy_user", "degrade"):
    c.load_template(t)
print(names, default.source, len(default.clauses), example.source, len(example.clauses))
"""


@pytest.mark.slow
def test_charter_folder_is_found_from_a_wheel_install(tmp_path):
    import setuptools  # noqa: F401  (the build backend pyproject.toml names; --no-build-isolation uses this one)

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("align", "rewards", "charter"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    # pip runs `rustc --version` for its user agent; where rustc is a rustup proxy with no
    # ~/.rustup yet, that writes ~/.rustup/settings.toml: keep it in this test's directory
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1",
           **({} if (Path.home() / ".rustup").is_dir() else {"RUSTUP_HOME": str(tmp_path / "rustup")})}
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, env=env, cwd=tmp_path, capture_output=True)
    wheel = next((tmp_path / "dist").glob("align-*.whl"))
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "-q", "--target", str(site), str(wheel)],
                   check=True, env=env, cwd=tmp_path, capture_output=True)
    assert (site / "charter" / "default.md").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the installed copy first on the path; the checkout's editable hook comes after it
    run_env = {**env, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", CHECK, str(site)], env=run_env, cwd=elsewhere,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'default.md'" in out.stdout and "'example_de.md'" in out.stdout and "'degrade.txt'" in out.stdout
    assert "charter/default.md" in out.stdout and "charter/example_de.md 7" in out.stdout
