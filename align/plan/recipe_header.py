"""What a recipe says about how it runs, outside its keys.

A shipped recipe opens with comment lines: the command that runs it (``accelerate launch
--config_file recipes/accelerate/zero3.yaml -m align train ...``, or ``align sample ...``)
and a ``hardware:`` line naming the machines it is meant for (``# hardware: nodes=8
gpus_per_node=8 gpu_memory_gib=80``). The plan reads the stage, the accelerate config and
the hardware from them, unless its keys say otherwise. ``model_lineage`` finds where a
model path such as ``runs/apertus-8b/sft`` comes from: the recipe whose ``output_dir`` it
is, among the sections or steps of the same pipeline recipe and the recipes its ``#
lineage:`` line names (``# lineage: sft.yaml``, beside it). No other file is read: a
directory of recipes may hold notes, or a FIFO, that are none of the plan's business.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from align.errors import ConfigError
from align.io.files import read_text

HARDWARE_KEYS = ("nodes", "gpus_per_node", "gpu_memory_gib")


def header_lines(path: str | Path) -> list[tuple[int, str]]:
    """(line number, text without '#') of the recipe's opening comment lines."""
    lines = []
    for number, line in enumerate(read_text(path, error=ConfigError).splitlines(), start=1):
        if not line.startswith("#"):
            break
        lines.append((number, line.lstrip("#").strip()))
    return lines


def _commands(lines: list[tuple[int, str]]) -> list[list[str]]:
    """The shell words of every line that runs ``align`` (``-m align`` or ``align STAGE``)."""
    out = []
    for _, text in lines:
        if re.search(r"(^|\s)(-m\s+)?align\s+[a-z-]+\b", text) is None:
            continue
        try:
            out.append(shlex.split(text.split(":", 1)[1] if text.startswith("As a SLURM") else text))
        except ValueError:
            continue
    return out


def stage_from_header(lines: list[tuple[int, str]], stages: Mapping[str, Any]) -> str | None:
    """The stage the header's command runs (``align STAGE`` / ``-m align STAGE``), or None."""
    for words in _commands(lines):
        for i, word in enumerate(words[:-1]):
            if word == "align" and words[i + 1] in stages:
                return words[i + 1]
    return None


def launch_from_header(lines: list[tuple[int, str]]) -> dict[str, Any]:
    """``accelerate_config`` and ``num_processes`` of the header's ``accelerate launch`` command."""
    found: dict[str, Any] = {}
    for words in _commands(lines):
        if "accelerate" not in words:
            continue
        for i, word in enumerate(words[:-1]):
            if word == "--config_file":
                found["accelerate_config"] = words[i + 1]
            elif word == "--num_processes":
                found["num_processes"] = int(words[i + 1])
    return found


def hardware_from_header(lines: list[tuple[int, str]], path: str | Path) -> dict[str, Any]:
    """The ``hardware: key=value ...`` line's settings (nodes, gpus_per_node, gpu_memory_gib)."""
    for number, text in lines:
        match = re.match(r"hardware:\s*(.*)$", text)
        if match is None:
            continue
        found: dict[str, Any] = {}
        for word in match.group(1).split():
            if "=" not in word:
                break  # the prose after the settings
            key, value = word.split("=", 1)
            if key not in HARDWARE_KEYS:
                raise ConfigError(f"{path}:{number}: hardware line: unknown key {key!r} (keys: {', '.join(HARDWARE_KEYS)})")
            try:
                found[key] = float(value) if key == "gpu_memory_gib" else int(value)
            except ValueError:
                raise ConfigError(f"{path}:{number}: hardware line: {key}={value!r} is not a number") from None
        return found
    return {}


def find_file(name: str, recipe: str | Path) -> Path | None:
    """A path the recipe names (an accelerate config), relative to the working directory or
    to a directory above the recipe (recipes name paths from the repository root)."""
    candidate = Path(name)
    if candidate.is_file():
        return candidate
    for parent in Path(recipe).resolve().parents:
        if (parent / name).is_file():
            return parent / name
    return None


def read_accelerate_config(path: str | Path) -> dict[str, Any]:
    """ZeRO stage, CPU offload and process count of an accelerate config file."""
    try:
        data = yaml.safe_load(read_text(path, error=ConfigError)) or {}
    except (ConfigError, yaml.YAMLError) as exc:
        raise ConfigError(f"accelerate_config: cannot read {path} ({exc})") from None
    deepspeed = data.get("deepspeed_config") or {}
    deepspeed_on = str(data.get("distributed_type", "")).upper() == "DEEPSPEED"
    return {
        "zero_stage": int(deepspeed.get("zero_stage", 0)) if deepspeed_on else 0,
        "offload_optimizer": str(deepspeed.get("offload_optimizer_device", "none")).lower() not in ("none", ""),
        "offload_params": str(deepspeed.get("offload_param_device", "none")).lower() not in ("none", ""),
        "num_processes": data.get("num_processes"),
    }


def _normal(path: str) -> str:
    return str(Path(path)).rstrip("/")


def lineage_files(recipe: str | Path, lines: list[tuple[int, str]]) -> list[Path]:
    """The recipes the header's ``# lineage: FILE ...`` line names (beside the recipe, or from
    the working directory or a directory above it); the prose after the files is skipped."""
    found: list[Path] = []
    for number, text in lines:
        match = re.match(r"lineage:\s*(.*)$", text)
        if match is None:
            continue
        for word in match.group(1).split():
            if not word.endswith((".yaml", ".yml")):
                break  # the prose after the files
            beside = Path(recipe).parent / word
            path = beside if beside.exists() else find_file(word, recipe)  # a FIFO there is refused when read
            if path is None:
                raise ConfigError(f"{recipe}:{number}: lineage: {word} not found (beside the recipe, or from the "
                                  "working directory)")
            found.append(path)
    return found


def model_lineage(recipe: str | Path, sections: Mapping[str, Mapping[str, Any]] | None = None,
                  lines: list[tuple[int, str]] | None = None) -> dict[str, str]:
    """output_dir -> the model it was trained from, for the sections of a pipeline recipe and
    the recipes its ``# lineage:`` line names (``lines``: its header, read here when not given)."""
    lineage: dict[str, str] = {}

    def add(mapping: Mapping[str, Any]) -> None:
        out, model = mapping.get("output_dir"), mapping.get("model_name_or_path")
        if isinstance(out, str) and isinstance(model, str) and _normal(out) != _normal(model):
            lineage.setdefault(_normal(out), model)

    for section in (sections or {}).values():
        if isinstance(section, Mapping):
            add(section)
    for path in lineage_files(recipe, header_lines(recipe) if lines is None else lines):
        try:
            data = yaml.safe_load(read_text(path, error=ConfigError, what="lineage"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{recipe}: lineage: {path} is not valid YAML ({exc})") from None
        if isinstance(data, Mapping):
            add(data)
    return lineage


def trace_model(name: str, lineage: Mapping[str, str]) -> list[str]:
    """The chain of models ``name`` comes from (itself first), following output_dirs."""
    chain, seen = [name], {_normal(name)}
    while _normal(chain[-1]) in lineage:
        parent = lineage[_normal(chain[-1])]
        if _normal(parent) in seen:
            break
        chain.append(parent)
        seen.add(_normal(parent))
    return chain
