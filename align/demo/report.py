"""The demo's report: a JSON of every number and a summary table for the terminal."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.io import write_json


def _ci(interval: Mapping[str, Any] | None, scale: float = 100.0, signed: bool = False) -> str:
    """``42.1 [38.0, 46.3]`` in points (percent) from an interval dict, or ``-``."""
    if not interval:
        return "-"
    sign = "+" if signed else ""
    f = lambda v: f"{v * scale:{sign}.1f}"
    return f"{f(interval['estimate'])} [{f(interval['low'])}, {f(interval['high'])}]"


def summary_table(accuracy: Mapping[str, Mapping[str, Any]], gains: Mapping[str, Mapping[str, Any]]) -> str:
    """Held-out accuracy per policy and its change against SFT, in points, with 95% intervals."""
    header = f"{'policy':<8}{'sampled accuracy (T=1)':>26}{'greedy accuracy':>24}{'sampled gain vs SFT':>26}"
    lines = [header, "-" * len(header)]
    for name, values in accuracy.items():
        gain = gains.get(name, {}).get("sampled")
        lines.append(f"{name.upper():<8}{_ci(values['sampled']):>26}{_ci(values['greedy']):>24}"
                     f"{_ci(gain, signed=True) if gain else '(baseline)':>26}")
    lines.append("accuracy in % of held-out prompts (answers), [95% bootstrap interval over prompts]")
    return "\n".join(lines)


def write_report(out: Path, report: dict[str, Any]) -> Path:
    return write_json(out / "report.json", report)
