"""What a stage's output was made from, and the rules for rerunning a stage over it.

Every stage output directory carries a manifest: the resolved settings (less the keys that
cannot change an output, ``NEUTRAL_KEYS``, and anything secret), a content fingerprint of
every input the settings name (a file's bytes; a model directory's files; for another
stage's output, that stage's manifest fingerprint, so a chain is checked without rehashing
it), the charter's hash, and the library version. It is written to ``_manifest.json``
when the stage starts (before any work, so a partial output is bound to its settings too)
and into ``_COMPLETE.json`` when it finishes.

Rerun rules (``begin``):

* complete, same manifest: skip, said in one line;
* complete or partial, different manifest: stop, naming each difference
  (``train.loss_type: 'qrpo' → 'dpo'``, ``prompts (prompts.jsonl): content changed (3 rows
  differ, 1 added)``) and the two ways forward: another ``output_dir``, or ``overwrite=true``;
* partial, same manifest: resume (job shards skip finished ids, trainers resume from their
  last checkpoint);
* ``overwrite=true`` over a different output: remove what that stage wrote (everything in
  the directory except what was there before the stage first started), then start afresh.

The library version is recorded, not compared: an upgrade does not redo finished work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.config import to_dict
from align.io import read_records, stage_completion_info, write_json
from align.io.fingerprint import (
    WEIGHT_SUFFIXES,
    file_digest,
    files_fingerprint,
    json_digest,
    weight_files,
)

MANIFEST_FILE = "_manifest.json"
ROWS_FILE = "_manifest_rows.json"
LOCK_FILE = ".align-stage.lock"

# Keys that cannot change what a stage writes: where it writes, how it reports progress or
# logs, how often it saves checkpoints, which shard of a job this process takes, and the
# rerun switch itself. Everything else counts. (Secrets never count and are never written.)
NEUTRAL_KEYS = frozenset({
    "output_dir", "overwrite", "shard_index", "num_shards", "resume_from_checkpoint",
    "disable_tqdm", "progress", "report_to", "run_name", "project", "trackio_space_id",
    "num_workers",  # decontamination's worker processes: the same result with any number (tested)
    "logging_dir", "logging_strategy", "logging_steps", "logging_first_step", "logging_nan_inf_filter",
    "log_level", "log_level_replica", "log_on_each_node",
    "save_strategy", "save_steps", "save_total_limit", "save_only_model", "save_safetensors",
    "save_on_each_node", "overwrite_output_dir",
    "push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision",
    "local_rank", "ddp_timeout", "skip_memory_metrics",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "api_key_env",  # names the variable holding a key; never the key, never a result
    "concurrency",  # requests in flight to an OpenAI-compatible server
})

# Per stage: keys that group work without changing any result. The job batch of sample,
# annotate, evaluate and judge-validate is how many records one append holds (each record
# is computed on its own; model batches have their own keys); the log-prob pass's batch
# size and layout are documented not to change its numbers (tests compare them).
STAGE_NEUTRAL_KEYS = {
    "sample": frozenset({"batch_size"}),
    "annotate": frozenset({"batch_size"}),
    "evaluate": frozenset({"batch_size"}),
    "judge-validate": frozenset({"batch_size"}),
    "logprobs": frozenset({"batch_size", "padding_free", "max_row_tokens"}),
}

# The settings whose value is a path to read (or a hub name): their content counts, not their
# spelling. A leaf key is one of these, or ends in ``_path``, ``_file`` or ``_dir``.
PATH_KEYS = frozenset({"input", "prompts", "model", "model_name_or_path", "tokenizer", "completions", "path",
                       "personas_file", "deepspeed", "charter", "kl_reference_model", "template"})
# A key is secret when one of its words (split at ``_``, ``-``, ``.`` and camelCase) is one
# of SECRET_WORDS, when two of its words in a row are one of SECRET_PAIRS, or when it is
# ``token`` / ``auth`` itself. ``eos_token``, ``pad_token`` or ``max_tokens`` are settings,
# not secrets; ``api_key_env`` names a variable (and is neutral).
SECRET_WORDS = frozenset({"password", "passwd", "secret", "credential", "credentials", "authorization",
                          "apikey", "passphrase"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
                          ("hub", "token"), ("access", "token"), ("auth", "token"), ("api", "token"),
                          ("bearer", "token"), ("refresh", "token"), ("id", "token"), ("session", "token")})
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")
_URL_SECRET_QUERY = re.compile(
    r"(?P<name>[?&][^=&#]*(?:token|key|password|secret|auth|sig|signature|credential)[^=&#]*=)[^&#]*",
    re.IGNORECASE)


class StaleOutputError(ValueError):
    """An output directory holds work made from other settings or inputs than this run's."""


# --------------------------------------------------------------------------- secrets


def _words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name))
    return [w for w in re.split(r"[_\-.\s]+", spaced.lower()) if w]


def is_secret_key(name: str) -> bool:
    """Named like a credential (``hub_token``, ``api_key``, ``password``, ``Authorization``,
    ``clientSecret``), not like a setting that merely mentions tokens (``eos_token``)."""
    words = _words(name)
    if words and words[-1] == "env":
        return False  # api_key_env: the name of a variable
    if words in (["token"], ["auth"], ["key"]):
        return True
    return any(w in SECRET_WORDS for w in words) or any(pair in SECRET_PAIRS for pair in itertools.pairwise(words))


def redact(value: Any) -> Any:
    """The value with secret-named keys removed and credentials cut out of URLs."""
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if not is_secret_key(k)}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        value = _URL_USERINFO.sub(r"\g<scheme>", value)
        return _URL_SECRET_QUERY.sub(r"\g<name>", value)
    return value


# --------------------------------------------------------------------------- fingerprints of inputs


def _data_files(directory: Path) -> list[Path]:
    """Every file under a directory, except hidden files and lock files (they hold no content)."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and p.suffix != ".lock" and not any(part.startswith(".") for part in p.relative_to(directory).parts))


def _relative_fingerprint(directory: Path, files: Sequence[Path]) -> str:
    return json_digest([[str(p.relative_to(directory)), p.stat().st_size, file_digest(p)] for p in files])


def dir_key(path: str | Path) -> str:
    """One spelling per directory (relative, absolute, through a symlink): how outputs are matched."""
    return os.path.realpath(os.path.expanduser(str(path)))


def fingerprint_input(value: str, overrides: Mapping[str, tuple[str, str, str | None]] | None = None,
                      *, key: str = "") -> dict[str, Any]:
    """The content fingerprint of one input path: a stage output, a model, a data file or directory.

    Another stage's output is bound by its manifest fingerprint and its output id (a new id
    each time the output is made: a re-made earlier output, even from the same settings, is
    other bytes). ``overrides`` maps a stage output directory (``dir_key``) to (stage, the
    manifest fingerprint, the output id) it will have: ``align status`` passes what an
    earlier stage of the same pipeline would produce (id None: it is to be made).
    """
    path = Path(value).expanduser()
    entry: dict[str, Any] = {"path": str(value)}
    for stage_dir in (path, path.parent):  # the output itself, or a file in it (pairs.jsonl)
        if overrides and dir_key(stage_dir) in overrides:
            stage, fingerprint, output_id = overrides[dir_key(stage_dir)]
            entry.update(kind="stage", stage=stage, fingerprint=fingerprint, output_id=output_id)
            if stage_dir != path:
                entry["file"] = path.name
            return entry
    stage_dir = path if path.is_dir() else path.parent
    info = stage_completion_info(stage_dir) if stage_dir.is_dir() else None
    if info and info.get("manifest_fingerprint"):
        entry.update(kind="stage", stage=info.get("stage"), fingerprint=info["manifest_fingerprint"],
                     output_id=info.get("output_id"))
        if stage_dir != path:
            entry["file"] = path.name
        return entry
    if key.rsplit(".", 1)[-1] == "tokenizer" and path.is_dir():  # its own files, not a model's weights
        files = [p for p in sorted(path.iterdir()) if p.is_file() and p.suffix not in WEIGHT_SUFFIXES
                 and not p.name.startswith(".")]
        entry.update(kind="tokenizer", fingerprint=files_fingerprint(files))
        return entry
    if path.is_file():
        entry.update(kind="file", fingerprint=file_digest(path))
    elif path.is_dir():
        weights = weight_files(path)
        if weights:  # a checkpoint: its weights, config and tokenizer files (top level)
            entry.update(kind="model", fingerprint=files_fingerprint(
                [p for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")
                 and p.suffix != ".lock"]))
        else:
            entry.update(kind="directory", fingerprint=_relative_fingerprint(path, _data_files(path)))
    else:
        entry.update(kind="name", fingerprint=json_digest(str(value)))  # a hub name: compared by name
    return entry


def _charter_input(value: str | None) -> dict[str, Any]:
    """The charter text the judge's prompts start with (layout-only edits to the file do not count)."""
    from rewards.charter import charter_fingerprint

    return {"path": str(value) if value else "default", "kind": "charter", "fingerprint": charter_fingerprint(value)}


# --------------------------------------------------------------------------- the manifest


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _init_settings(config: Any) -> dict[str, Any]:
    """A config's init fields as plain values (nested dataclasses as mappings)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}
    return to_dict(dict(config))


def is_path_key(key: str) -> bool:
    """A setting that names something to read (``PATH_KEYS``, or ``*_path``, ``*_file``, ``*_dir``)."""
    leaf = re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])
    if leaf in NEUTRAL_KEYS or leaf in ("cache_dir", "output_dir", "logging_dir"):
        return False
    return leaf in PATH_KEYS or leaf.endswith(("_path", "_file", "_dir"))


def _looks_like_path(key: str, value: Any) -> bool:
    if not isinstance(value, str) or not value or "\n" in value or len(value) > 4096 or not is_path_key(key):
        return False
    try:
        return Path(value).expanduser().exists()
    except OSError:
        return False


def field_defaults(config: Any, prefix: str = "") -> dict[str, Any]:
    """Each setting's declared default, by the dotted key ``build_manifest`` uses."""
    out: dict[str, Any] = {}
    if not (dataclasses.is_dataclass(config) and not isinstance(config, type)):
        return out
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            continue
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(field_defaults(value, f"{prefix}{f.name}."))
            continue
        out[f"{prefix}{f.name}"] = to_dict(default)
    return out


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
                                        "inputs": {k: {n: v for n, v in e.items() if n != "path"}
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

    settings = redact(_init_settings(config))
    flat = _flatten(settings)
    neutral = NEUTRAL_KEYS | STAGE_NEUTRAL_KEYS.get(stage, frozenset())
    output_dir = getattr(config, "output_dir", None)
    inputs: dict[str, dict[str, Any]] = {}
    kept: dict[str, Any] = {}
    for key, value in flat.items():
        leaf = re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])
        if leaf == "resume_from_checkpoint" and isinstance(value, str) and value and output_dir and \
                not dir_key(value).startswith(dir_key(output_dir) + os.sep):
            inputs[key] = fingerprint_input(value, overrides, key=key)
            continue
        if leaf in neutral and "." not in key:
            continue
        if leaf in NEUTRAL_KEYS:
            continue
        if leaf == "charter" and _uses_charter(flat, key):
            inputs[key] = _charter_input(value)
        elif _looks_like_path(key, value):
            inputs[key] = fingerprint_input(value, overrides, key=key)
        elif overrides and isinstance(value, str) and value and is_path_key(key) and \
                {dir_key(value), dir_key(os.path.dirname(value) or ".")} & overrides.keys():
            inputs[key] = fingerprint_input(value, overrides, key=key)  # an earlier stage's output, not written yet
        elif leaf == "chat_date" and value is None:
            kept[key] = date_text(None)
        else:
            kept[key] = value
    defaults = {k: v for k, v in field_defaults(config).items() if k in kept}
    return Manifest(stage=stage, settings=kept, inputs=inputs, defaults=defaults)


def _uses_charter(flat: Mapping[str, Any], key: str) -> bool:
    """The charter counts where a judge reads it (annotate/evaluate with the judge, judge-validate)."""
    prefix = key[: -len("charter")]
    provider = flat.get(prefix + "provider")
    return provider in (None, "judge")


def row_digests(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """id (or ``<row i>``) -> a short digest of the row, for naming which rows changed."""
    out = {}
    for index, row in enumerate(rows):
        rid = row.get("id") if isinstance(row, Mapping) else None
        out[rid if isinstance(rid, str) and rid else f"<row {index}>"] = json_digest(row)[:16]
    return out


# --------------------------------------------------------------------------- differences


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _rows_change(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    differ = sum(1 for k in old.keys() & new.keys() if old[k] != new[k])
    added, removed = len(new.keys() - old.keys()), len(old.keys() - new.keys())
    parts = ([f"{differ} row{'s differ' if differ != 1 else ' differs'}"] if differ else []) + \
        ([f"{added} added"] if added else []) + ([f"{removed} removed"] if removed else [])
    if not parts:
        return "content changed (the same rows, in another order or layout)"
    return f"content changed ({', '.join(parts)})"


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
        before, after = old_settings.get(key, "(unset)"), new.settings.get(key, "(unset)")
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
        if after.get("kind") == "stage" or before.get("kind") == "stage":
            if before.get("fingerprint") == after.get("fingerprint"):
                lines.append(f"{name}: made again since (the {after.get('stage') or 'earlier'} stage's output is "
                             "new, though made from the same settings and inputs)")
            else:
                lines.append(f"{name}: made from other settings or inputs (the {after.get('stage') or 'earlier'} "
                             "stage's manifest changed)")
        elif old_rows and new_rows and key in old_rows and key in new_rows:
            lines.append(f"{name}: {_rows_change(old_rows[key], new_rows[key])}")
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
            except (ValueError, OSError):
                continue
    return out


def explain(stage: str, output_dir: Path, recorded: Mapping[str, Any], new: Manifest) -> list[str]:
    """The differences, with row counts for changed record inputs."""
    old_rows = _read_json(output_dir / ROWS_FILE) or {}
    return differences(stage, recorded, new, old_rows, _new_rows_for(old_rows, new, recorded)) or \
        ["the recorded manifest differs (no setting or input differs by name: written by another version?)"]


# --------------------------------------------------------------------------- state on disk


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def recorded_manifest(output_dir: str | Path) -> tuple[str, dict[str, Any] | None]:
    """(state, manifest): ``complete``, ``partial`` (started, not finished) or ``empty``."""
    output_dir = Path(output_dir)
    info = stage_completion_info(output_dir) if output_dir.is_dir() else None
    if info is not None:
        return "complete", info.get("manifest")
    started = _read_json(output_dir / MANIFEST_FILE)
    if started is not None:
        own = {MANIFEST_FILE, ROWS_FILE, LOCK_FILE, *(started.get("preexisting") or [])}
        if all(p.name in own for p in output_dir.iterdir()):
            return "empty", None  # started, but failed before writing anything: nothing to keep
        return "partial", started
    if output_dir.is_dir() and _stage_artifacts(output_dir):
        return "partial", None
    return "empty", None


def _stage_artifacts(output_dir: Path) -> list[Path]:
    """What a stage of an earlier version (no manifest) leaves: markers, shards, checkpoints, data files."""
    names = re.compile(r"^(_COMPLETE\.json|_job\.json|shard-\d{5}-of-\d{5}\..*|checkpoint-\d+|pairs\.jsonl|"
                       r"skipped\.jsonl|kept\.jsonl|removed\.jsonl)$")
    return [p for p in output_dir.iterdir() if names.match(p.name)]


@contextlib.contextmanager
def _locked(output_dir: Path) -> Iterator[None]:
    """One process at a time decides and cleans (SLURM array tasks, ranks of one launch)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(output_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _remove_stage_output(output_dir: Path, started: Mapping[str, Any] | None) -> list[str]:
    """Remove what the stage wrote: everything but what was there before it first started."""
    keep = set((started or {}).get("preexisting") or []) | {LOCK_FILE}
    victims = [p for p in output_dir.iterdir() if p.name not in keep] if started else _stage_artifacts(output_dir)
    for path in victims:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return sorted(p.name for p in victims)


def _forward(output_dir: Path) -> str:
    return (f"use another output_dir, or overwrite=true to remove what the stage wrote in {output_dir} "
            "and redo it")


@dataclass
class Begun:
    """What ``begin`` decided: ``skip`` (done, same manifest), else the manifest to finish with."""

    skip: bool
    manifest: Manifest
    output_dir: Path
    resumed: bool = False
    overwrite: bool = False  # remove an output of other settings in ``start``, once the inputs are checked


def begin(stage: str, config: Any, output_dir: str | Path, *, overwrite: bool = False) -> Begun:
    """Apply the rerun rules to ``output_dir`` before a stage reads its inputs (see the module doc).

    Skips, or stops with the differences; under ``overwrite`` it lets the stage go on, and
    ``start`` removes what the stage wrote once the inputs have been read and checked (a
    mistyped input path never costs a finished output), then records the manifest.
    """
    output_dir = Path(output_dir)
    manifest = build_manifest(stage, config)
    state, recorded = recorded_manifest(output_dir)
    same = recorded is not None and recorded.get("fingerprint") == manifest.fingerprint
    if state == "complete" and same:
        print(f"[align {stage}] {output_dir} is already complete; skipping (made from the same settings and inputs)")
        return Begun(True, manifest, output_dir)
    if state == "empty" or same:
        return Begun(False, manifest, output_dir, resumed=state == "partial")
    if recorded is not None and recorded.get("stage") not in (None, stage):
        raise StaleOutputError(f"{stage}: {output_dir} holds the {recorded.get('stage')} stage's output; choose "
                               "another output_dir (overwrite=true never removes another stage's output)")
    if not overwrite:
        if recorded is None:
            problem = ["it was written without a manifest (by an earlier version of align), so what it was "
                       + "made from is unknown"]
        else:
            problem = explain(stage, output_dir, recorded, manifest)
        what = "an output" if state == "complete" else "a partial output"
        raise StaleOutputError(f"{stage}: {output_dir} holds {what} made from other settings or inputs: "
                               + "; ".join(problem) + f". {_forward(output_dir)}")
    return Begun(False, manifest, output_dir, overwrite=True)


def start(begun: Begun, rows_by_key: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
    """Record the manifest (and a digest per input row) before the stage's first write.

    SLURM array tasks and the ranks of a launch share one directory: the first records it,
    the others find the same manifest; ranks other than 0 wait for rank 0's.
    """
    if begun.skip:
        return
    output_dir, manifest = begun.output_dir, begun.manifest
    if not is_writer():
        _wait_for_manifest(output_dir, manifest)
        return
    with _locked(output_dir):
        state, recorded = recorded_manifest(output_dir)  # again, under the lock: others may have started
        found = _read_json(output_dir / MANIFEST_FILE)
        if state != "empty" and (recorded or {}).get("fingerprint") != manifest.fingerprint:
            if not begun.overwrite:  # another run started here since `begin` looked
                raise StaleOutputError(f"{manifest.stage}: {output_dir} now holds work of another run with other "
                                       f"settings or inputs (started while this one was reading its inputs). "
                                       f"{_forward(output_dir)}")
            removed = _remove_stage_output(output_dir, found)
            print(f"[align {manifest.stage}] overwrite=true: removed {len(removed)} entries the stage wrote in "
                  f"{output_dir}")
            # without an earlier manifest, whatever is left was the stage's too (files of an older version)
            found = found if found is not None else {"preexisting": []}
            found = {**found, "fingerprint": None}
        if found is None or found.get("fingerprint") != manifest.fingerprint:
            preexisting = list(found.get("preexisting") or []) if found else \
                sorted(p.name for p in output_dir.iterdir() if p.name not in (LOCK_FILE, ROWS_FILE))
            write_json(output_dir / MANIFEST_FILE, {**manifest.as_json(), "preexisting": preexisting,
                                                    "started_at": time.time()})
        wanted = {key: row_digests(rows) for key, rows in (rows_by_key or {}).items() if key in manifest.inputs}
        if wanted and wanted != _read_json(output_dir / ROWS_FILE):
            write_json(output_dir / ROWS_FILE, wanted)


def is_writer() -> bool:
    """Rank 0 of a distributed launch (or a plain process, or a SLURM array task)."""
    return int(os.environ.get("RANK", "0")) == 0


def _wait_for_manifest(output_dir: Path, manifest: Manifest, timeout: float = 1800.0) -> None:
    """Ranks other than 0 start once rank 0 has cleaned (if asked) and recorded this manifest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _read_json(output_dir / MANIFEST_FILE)
        if found and found.get("fingerprint") == manifest.fingerprint:
            return
        time.sleep(0.2)
    raise TimeoutError(f"rank 0 did not record the manifest in {output_dir} within {timeout:.0f} s")


def completion_fields(begun: Begun | None) -> dict[str, Any]:
    """What ``_COMPLETE.json`` adds: the manifest, and a new output id (a re-made output is new bytes).

    Refuses to mark an output whose recorded manifest is no longer this run's (another run
    with other settings took the directory over while this one worked).
    """
    if begun is None:
        return {}
    found = _read_json(begun.output_dir / MANIFEST_FILE)
    if found is not None and found.get("fingerprint") != begun.manifest.fingerprint:
        raise StaleOutputError(f"{begun.manifest.stage}: {begun.output_dir} was taken over by a run with other "
                               "settings or inputs while this one worked; it is not marked complete. "
                               f"{_forward(begun.output_dir)}")
    return {"manifest": begun.manifest.as_json(), "manifest_fingerprint": begun.manifest.fingerprint,
            "output_id": uuid.uuid4().hex}


__all__ = [
    "MANIFEST_FILE",
    "NEUTRAL_KEYS",
    "Begun",
    "Manifest",
    "StaleOutputError",
    "begin",
    "build_manifest",
    "completion_fields",
    "differences",
    "fingerprint_input",
    "is_secret_key",
    "recorded_manifest",
    "redact",
    "start",
]
