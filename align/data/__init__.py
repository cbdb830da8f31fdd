"""Dataset records and validation, quantile rewards, pair selection, decontamination.

Submodules are imported lazily so that a light stage (e.g. annotation) does not pay for
the others.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RecordError": "align.data.records",
    "validate_prompt": "align.data.records",
    "validate_completions": "align.data.records",
    "validate_rewards": "align.data.records",
    "validate_pair": "align.data.records",
    "quantile_rewards": "align.data.quantiles",
    "select_pair": "align.data.pairs",
    "make_pairs": "align.data.pairs",
    "decontaminate": "align.data.decontaminate",
    "MatchSettings": "align.data.decontaminate_types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'align.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
