"""What a sweep is made from and where it writes: the fingerprints its outputs are bound to,
the validation prompts that training also saw, and the output directory it may use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.errors import ConfigError, InputError


def start_fingerprint(model: Any, path: str | None) -> dict[str, Any]:
    """The start policy's fingerprint: its weights in memory, else what its path names (a stage
    output by its manifest and output id, a checkpoint by its files, a hub name by its name)."""
    from align.io.fingerprint import weights_fingerprint
    from align.manifests import fingerprint_input

    if model is not None:
        return {"kind": "weights", "fingerprint": weights_fingerprint(model)}
    if not path:
        raise ConfigError("model_name_or_path: give the start policy (a model, or its directory or name)")
    return {k: v for k, v in fingerprint_input(path, key="model_name_or_path").items() if k != "path"}


def identify_provider(provider: Any, given: str | None) -> str:
    """What identifies the reward provider's scores: its own fingerprint, or the one given with a builder."""
    from align.io.fingerprint import json_digest

    if given is not None:
        return given
    if hasattr(provider, "fingerprint"):
        return json_digest(provider.fingerprint())
    raise ConfigError("provider: a function that builds the reward provider needs provider_fingerprint (what "
                      "identifies its scores), so that a finished validation is not reused for another provider")


# What a sweep writes at the top of its output directory; anything else there is someone else's.
SWEEP_ENTRIES = frozenset({"points", "validation", "sweep.json", "sweep.md", "sweep.png", "_COMPLETE.json",
                           ".align-stage.lock"})


def check_sweep_dir(out: Path) -> None:
    """A sweep writes into a new or empty directory, or over an earlier sweep's, never over other files
    (another stage's output, whose completion marker it would replace)."""
    from align.io import stage_completion_info

    if not out.exists():
        return
    if not out.is_dir():
        raise InputError(f"output_dir={str(out)!r} is a file, not a directory")
    info = stage_completion_info(out)
    if info is not None and info.get("stage") != "sweep":
        raise InputError(f"output_dir={str(out)!r} holds the {info.get('stage')} stage's output; choose another "
                         "output_dir for the sweep")
    foreign = sorted(p.name for p in out.iterdir() if p.name not in SWEEP_ENTRIES and not p.name.startswith("."))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError(f"output_dir={str(out)!r} holds files that no sweep wrote ({shown}); choose a new or "
                         "empty output_dir, or an earlier sweep's")


def validation_overlap(rows: Sequence[Mapping[str, Any]], prompts: Sequence[Mapping[str, Any]]) -> int:
    """How many validation prompts are also prompts of the training pairs (their score is then optimistic)."""
    import json

    key = lambda record: json.dumps([record.get("messages"), record.get("tools") or None], sort_keys=True)
    trained = {key(row) for row in rows}
    return sum(1 for prompt in prompts if key(prompt) in trained)


__all__ = ["SWEEP_ENTRIES", "check_sweep_dir", "identify_provider", "start_fingerprint", "validation_overlap"]
