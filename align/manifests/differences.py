"""The differences between a recorded manifest and this run's, one line each, as the rerun
refusal names them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.errors import AlignError
from align.io import read_records
from align.io.fingerprint import json_digest
from align.manifests.inputs import row_digests
from align.manifests.manifest import Manifest
from align.manifests.state import ROWS_FILE, read_json


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _row_counts(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """How the rows differ (``1 row differs, 1 added``), or "" for the same rows."""
    differ = sum(1 for k in old.keys() & new.keys() if old[k] != new[k])
    added, removed = len(new.keys() - old.keys()), len(old.keys() - new.keys())
    parts = ([f"{differ} row{'s differ' if differ != 1 else ' differs'}"] if differ else []) + \
        ([f"{added} added"] if added else []) + ([f"{removed} removed"] if removed else [])
    return ", ".join(parts)


def _rows_change(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    counts = _row_counts(old, new)
    return f"content changed ({counts})" if counts else "content changed (the same rows, in another order or layout)"


def _now_plain(name: str, before: Mapping[str, Any], after: Mapping[str, Any], counts: str | None) -> str:
    """An input that was a stage's output and is a plain file or directory now (a copy of it): no
    earlier stage's manifest is involved, so what changed is the input's own content."""
    rows = "" if counts is None else f"; {counts}" if counts else "; the same rows"
    kind, stage = after.get("kind"), before.get("stage") or "earlier"
    if kind == "name":
        return f"{name}: now a dataset name, no earlier stage's output (was the {stage} stage's output)"
    return (f"{name}: the input {kind}'s content changed: a plain {kind} now, no earlier stage's output (it was the "
            f"{stage} stage's output{rows})")


def _model_change(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """Which files of a checkpoint differ: its weights, or its config, tokenizer or chat template."""
    from align.io.fingerprint import WEIGHT_SUFFIXES

    names = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))
    weights = [n for n in names if n.endswith(WEIGHT_SUFFIXES)]
    others = [n for n in names if n not in weights]
    parts = ([f"other weights ({', '.join(weights[:3])})"] if weights else []) + \
        ([f"other {', '.join(others[:4])}" + (" (not the weights)" if not weights else "")] if others else [])
    return "; ".join(parts) or "other files"


def differences(stage: str, old: Mapping[str, Any], new: Manifest, old_rows: Mapping[str, Any] | None = None,
                new_rows: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """One line per difference between a recorded manifest and this run's."""
    lines: list[str] = []
    if old.get("stage") not in (None, stage):
        return [f"the directory holds the {old.get('stage')} stage's output, not {stage}'s"]
    old_settings = old.get("settings") or {}
    for key in sorted(old_settings.keys() | new.settings.keys()):
        if key not in old_settings and key in new.defaults and \
                json_digest(new.settings[key]) == json_digest(new.defaults[key]):
            continue  # a setting added since, at the default that keeps the old behaviour
        if key not in new.settings:
            continue  # a setting this version no longer has cannot change what it writes
        before, after = old_settings.get(key, "(unset)"), new.settings[key]
        if json_digest(before) != json_digest(after):
            lines.append(f"{stage}.{key}: {_show(before)} → {_show(after)}")
    old_inputs = old.get("inputs") or {}
    for key in sorted(old_inputs.keys() | new.inputs.keys()):
        before, after = old_inputs.get(key), new.inputs.get(key)
        if before is None or after is None:
            lines.append(f"{stage}.{key}: {'(not an input)' if before is None else before.get('path')} → "
                         f"{'(not an input)' if after is None else after.get('path')}")
            continue
        if {k: v for k, v in before.items() if k != "path"} == {k: v for k, v in after.items() if k != "path"}:
            continue
        name = f"{stage}.{key} ({after.get('path')})"
        if after.get("changed"):
            lines.append(f"{name}: the {after.get('stage') or 'earlier'} stage's output changed since it was made "
                         f"({'; '.join(after['changed'][:3])})")
        elif before.get("kind") == "stage" and after.get("kind") == "stage" and \
                before.get("stage") != after.get("stage"):
            lines.append(f"{name}: now the {after.get('stage')} stage's output (was the {before.get('stage')} "
                         "stage's)")
        elif before.get("kind") == "stage" and after.get("kind") in ("file", "directory", "name"):
            known = old_rows and new_rows and key in old_rows and key in new_rows
            lines.append(_now_plain(name, before, after, _row_counts(old_rows[key], new_rows[key]) if known else None))
        elif after.get("kind") == "stage" and before.get("kind") != "stage":
            lines.append(f"{name}: now the {after.get('stage')} stage's output (was a plain {before.get('kind')})")
        elif before.get("kind") == "stage":  # (after a stage's output too, or a kind the branches above leave)
            if before.get("fingerprint") == after.get("fingerprint") and after.get("output_id") is None \
                    and "output_id" in after:
                lines.append(f"{name}: the {after.get('stage') or 'earlier'} step that makes it is not current, so it "
                             "will be made again")
            elif before.get("fingerprint") == after.get("fingerprint"):
                lines.append(f"{name}: made again since (the {after.get('stage') or 'earlier'} stage's output is "
                             "new, though made from the same settings and inputs)")
            else:
                lines.append(f"{name}: made from other settings or inputs (the {after.get('stage') or 'earlier'} "
                             "stage's manifest changed)")
        elif old_rows and new_rows and key in old_rows and key in new_rows:
            lines.append(f"{name}: {_rows_change(old_rows[key], new_rows[key])}")
        elif after.get("kind") == "model" and before.get("files") and after.get("files"):
            lines.append(f"{name}: {_model_change(before['files'], after['files'])}")
        elif after.get("kind") in ("model", "charter"):
            lines.append(f"{name}: other {'weights' if after['kind'] == 'model' else 'charter text'}")
        else:
            lines.append(f"{name}: content changed")
    return lines


def _new_rows_for(old_rows: Mapping[str, Any], new: Manifest, old: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Row digests of the changed record inputs (read only when a changed input had its rows recorded)."""
    out = {}
    for key, entry in new.inputs.items():
        before = (old.get("inputs") or {}).get(key) or {}
        if key in old_rows and entry.get("kind") in ("file", "directory") and \
                before.get("fingerprint") != entry.get("fingerprint"):
            try:
                out[key] = row_digests(read_records(entry["path"]))
            except (AlignError, OSError):  # unreadable now: named as changed, without row counts
                continue
    return out


def explain(stage: str, output_dir: Path, recorded: Mapping[str, Any], new: Manifest) -> list[str]:
    """The differences, with row counts for changed record inputs."""
    old_rows = read_json(output_dir / ROWS_FILE) or {}
    return differences(stage, recorded, new, old_rows, _new_rows_for(old_rows, new, recorded)) or \
        ["the recorded manifest differs (no setting or input differs by name: written by another version?)"]
