"""The manifest itself: a stage's settings (less neutral keys and secrets) and the
fingerprints of its inputs, digested into one fingerprint."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from align.io.fingerprint import json_digest
from align.manifests.inputs import charter_input, dir_key, fingerprint_input
from align.manifests.redaction import redact
from align.manifests.settings import (
    NEUTRAL_KEYS,
    STAGE_NEUTRAL_KEYS,
    field_defaults,
    flatten,
    init_settings,
    is_path_key,
    looks_like_path,
)


@dataclass
class Manifest:
    """What one stage output is made from (``fingerprint`` is the digest of the rest).

    The fingerprint covers the settings that differ from their declared defaults (``defaults``),
    so a new version that adds a setting, at a default that keeps the old behaviour, leaves
    finished outputs current; every setting is still recorded.
    """

    stage: str
    settings: dict[str, Any]
    inputs: dict[str, dict[str, Any]]
    library: str = ""
    fingerprint: str = ""
    rows: dict[str, dict[str, str]] = field(default_factory=dict)  # input key -> id -> row digest
    defaults: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.library:
            self.library = _library_version()
        chosen = {k: v for k, v in self.settings.items()
                  if k not in self.defaults or json_digest(v) != json_digest(self.defaults[k])}
        self.fingerprint = json_digest({"stage": self.stage, "settings": chosen,
                                        "inputs": {k: {n: v for n, v in e.items() if n not in ("path", "files")}
                                                   for k, e in self.inputs.items()}})

    def as_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "fingerprint": self.fingerprint, "library": self.library,
                "settings": self.settings, "inputs": self.inputs}


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("align")
    except PackageNotFoundError:
        return "unknown"


def build_manifest(stage: str, config: Any, *,
                   overrides: Mapping[str, tuple[str, str, str | None]] | None = None) -> Manifest:
    """The manifest this config would give its output: settings plus input fingerprints.

    Every path setting (``is_path_key``) that names an existing local path is an input (its
    content, not its name, is compared: moving a file does not make an output stale).
    ``charter`` is resolved as the judge resolves it (a bundled name or a path) and hashed.
    ``chat_date: null`` is recorded as the date it renders today (a job resumed after
    midnight would render another system prompt). ``resume_from_checkpoint`` outside the
    output directory is an input: the run continues from another run's weights.
    """
    from align.chat.apertus import date_text

    settings = redact(init_settings(config))
    flat = flatten(settings)
    neutral = NEUTRAL_KEYS | STAGE_NEUTRAL_KEYS.get(stage, frozenset())
    output_dir = config.get("output_dir") if isinstance(config, Mapping) else getattr(config, "output_dir", None)
    inputs: dict[str, dict[str, Any]] = {}
    kept: dict[str, Any] = {}
    for key, value in _paths_listed(flat).items():
        leaf = re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])
        if leaf == "resume_from_checkpoint" and isinstance(value, str) and value and output_dir and \
                not dir_key(value).startswith(dir_key(output_dir) + os.sep):
            inputs[key] = fingerprint_input(value, overrides)  # a checkpoint: weights, never a tokenizer
            continue
        if leaf in neutral and "." not in key:
            continue
        if leaf in NEUTRAL_KEYS:
            continue
        if leaf == "charter" and _uses_charter(flat, key):
            inputs[key] = charter_input(value)
        elif leaf == "charter":  # no judge reads it: recorded as given, its file's content never counts
            kept[key] = value
        elif looks_like_path(key, value):
            inputs[key] = fingerprint_input(value, overrides, key=key)
        elif overrides and isinstance(value, str) and value and is_path_key(key) and \
                {dir_key(value), dir_key(os.path.dirname(value) or ".")} & overrides.keys():
            inputs[key] = fingerprint_input(value, overrides)  # an earlier step's output: bound to that step
        elif leaf == "chat_date" and value is None:
            kept[key] = date_text(None)
        else:
            kept[key] = value
    defaults = {k: v for k, v in field_defaults(config).items() if k in kept}
    return Manifest(stage=stage, settings=kept, inputs=inputs, defaults=defaults)


def _paths_listed(flat: Mapping[str, Any]) -> dict[str, Any]:
    """A path setting given as a list of paths (several inputs read as one) as one entry per path."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value) and is_path_key(key):
            out.update({f"{key}[{i}]": v for i, v in enumerate(value)})
        else:
            out[key] = value
    return out


def _uses_charter(flat: Mapping[str, Any], key: str) -> bool:
    """The charter counts where a judge reads it (annotate/evaluate with the judge, judge-validate)."""
    prefix = re.sub(r"\[\d+\]$", "", key)[: -len("charter")]  # one charter of a list: charter[0]
    provider = flat.get(prefix + "provider")
    return provider in (None, "judge")
