"""Which settings count toward a manifest: the neutral keys (they cannot change an output),
the path keys (their content counts, not their spelling), and each setting's declared default."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.config import to_dict
from align.stage_table import neutral_keys

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
    # how an OpenAI-compatible server is reached (at any depth: sampler.base_url, reward.timeout_s): the served
    # model is named by ``model``, so a server back on another port, or a longer wait, changes no result
    "api_key_env",  # names the variable holding a key; never the key, never a result
    "concurrency",  # requests in flight to an OpenAI-compatible server
    "base_url", "timeout_s", "max_retries",
})

# Per stage: keys that group work without changing any result (the stage table says which and
# why: a job's batch of records per append, the log-prob pass's batch layout and sharding,
# evaluate's KL placement; tests compare them).
STAGE_NEUTRAL_KEYS = neutral_keys()

# The settings whose value is a path to read (or a hub name): their content counts, not their
# spelling. A leaf key is one of these, or ends in ``_path``, ``_file`` or ``_dir``.
PATH_KEYS = frozenset({"input", "prompts", "model", "model_name_or_path", "tokenizer", "completions", "path",
                       "personas_file", "deepspeed", "charter", "kl_reference_model", "template"})


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def init_settings(config: Any) -> dict[str, Any]:
    """A config's init fields as plain values (nested dataclasses as mappings)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}
    return to_dict(dict(config))


def is_path_key(key: str) -> bool:
    """A setting that names something to read (``PATH_KEYS``, or ``*_path``, ``*_file``, ``*_dir``)."""
    leaf = re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])
    if leaf in NEUTRAL_KEYS or leaf == "cache_dir":  # output_dir and logging_dir are neutral
        return False
    return leaf in PATH_KEYS or leaf.endswith(("_path", "_file", "_dir"))


def looks_like_path(key: str, value: Any) -> bool:
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
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            # a nested config made by its factory: its defaults are that instance's values
            # (a preset such as `field(default_factory=lambda: Sampler(backend="vllm"))`)
            out.update({f"{prefix}{f.name}.{k}": v for k, v in flatten(init_settings(default)).items()})
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(field_defaults(value, f"{prefix}{f.name}."))
            continue
        out[f"{prefix}{f.name}"] = to_dict(default)
    return out
