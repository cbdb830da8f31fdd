"""The SLURM tests' session: one local cluster (tests/slurm/local_cluster.py) and a workspace.

The cluster starts once for the session and is always stopped at its end, failed tests
included. Where it cannot start (not root, slurm-wlm and munge not installed and
ALIGN_INSTALL_SLURM=1 not set to let apt-get install them), the tests that need it are skipped
with the reason; CI allows no such skip (tests/conftest.py, ALLOWED_SKIPS) and sets
ALIGN_REQUIRE_SLURM=1, which turns the skip into a failure that shows the daemons' logs.

Jobs run as root in the directory given with --chdir, with the environment of the command
that submitted them (--export=ALL): ``job_env`` is that environment (this python's
directory first on PATH, one OpenMP thread, the session's caches, SLURM_CONF).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from local_cluster import ClusterUnavailable, LocalCluster

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "ALIGN_REQUIRE_SLURM"


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: submits jobs to the local SLURM cluster (tests/slurm/local_cluster.py)")


@pytest.fixture(scope="session")
def slurm_cluster():
    root = Path(tempfile.mkdtemp(prefix="align-slurm-"))  # short: the munge socket path must fit a sockaddr
    cluster = LocalCluster(root)
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set and the local SLURM cluster did not start: {exc}", pytrace=False)
        pytest.skip(f"no local SLURM cluster: {str(exc).splitlines()[0]}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def job_env(slurm_cluster) -> dict[str, str]:
    """The environment to submit with: the jobs get it too (--export=ALL)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "ACCELERATE_"))}
    env.update(slurm_cluster.env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    env.pop("ALIGN_TRACEBACK", None)
    return env
