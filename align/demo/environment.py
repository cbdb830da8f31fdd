"""What a rerun of the demo must match to give the same digits: library versions, torch's
threads, kernels and BLAS, the CPU. Recorded in report.json beside the figures.

On one machine the demo is deterministic (the same report twice, tested). Across machines
the same code can give other digits: float sums in another order (another thread count,
or matmul and vector kernels chosen for another instruction set: AVX-512 against AVX2) turn
into a different SFT stopping step, then different samples. The demo fixes the thread count
(2) and, on x86 CPUs with AVX2, pins the kernels to their AVX2 versions (``pin_cpu_kernels``);
the fields below say what a run had.
"""

from __future__ import annotations

import platform
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# The kernels an x86 CPU with AVX2 runs, whatever more it has (AVX-512, AMX): torch's own
# vector kernels, MKL's matmuls (its conditional numerical reproducibility branch) and
# oneDNN's. Read when torch loads, so set before it does; a value already set is kept.
PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

PACKAGES = ("align", "torch", "transformers", "trl", "accelerate", "peft", "datasets", "numpy", "tokenizers")


def _cpuinfo(name: str) -> str | None:
    """One field of /proc/cpuinfo (Linux; the first CPU's), or None."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    match = re.search(rf"^{name}\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else None


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform module says."""
    return _cpuinfo("model name") or platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    """The vector instruction sets that decide which kernels run (AVX2, AVX-512 and its parts, AMX)."""
    flags = set((_cpuinfo("flags") or "").split())
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))


def blas() -> str:
    """torch's BLAS and its settings, from its build configuration."""
    import torch

    config = torch.__config__.show()
    found = re.search(r"BLAS_INFO=(\w+)", config)
    return found.group(1) if found else "unknown"


def pin_cpu_kernels() -> dict[str, str]:
    """Set ``PINNED_KERNELS`` where torch is not loaded yet and the CPU has AVX2 (else nothing:
    another architecture, or too late); returns what the environment holds for them."""
    import os
    import sys

    if "torch" not in sys.modules and "avx2" in cpu_flags():
        for name, value in PINNED_KERNELS.items():
            os.environ.setdefault(name, value)
    return pinned_kernels()


def pinned_kernels() -> dict[str, str]:
    import os

    return {name: os.environ[name] for name in PINNED_KERNELS if name in os.environ}


def run_environment() -> dict[str, Any]:
    """Everything above, as plain values."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {
        "versions": versions,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "blas": blas(),
        "cpu": cpu_model(),
        "cpu_vector_flags": cpu_flags(),
        "machine": platform.machine(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "pinned_kernels": pinned_kernels(),
    }
