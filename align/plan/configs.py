"""Where a model's ``config.json`` comes from, without downloading anything.

In order: a local checkpoint directory (or a ``config.json`` file), the Hugging Face cache
(offline), then the architecture numbers shipped in ``align/plan/known_configs/`` for the
hub models the shipped recipes name (``KNOWN_CONFIGS``; sources in docs/memory-plan.md,
"Model configs"). A name that none of these knows is an error that says to pass
``model_config=PATH``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from align.errors import ConfigError

# hub name -> shipped config (architecture numbers only). The instruct checkpoints share
# the base models' architecture.
KNOWN_CONFIGS: dict[str, str] = {
    "swiss-ai/Apertus-8B-2509": "apertus-8b.json",
    "swiss-ai/Apertus-8B-Instruct-2509": "apertus-8b.json",
    "swiss-ai/Apertus-70B-2509": "apertus-70b.json",
    "swiss-ai/Apertus-70B-Instruct-2509": "apertus-70b.json",
    "Qwen/Qwen3-32B": "qwen3-32b.json",
    "Skywork/Skywork-Reward-V2-Llama-3.1-8B": "llama-3.1-8b-reward.json",
}


def known_config_path(name: str) -> Path | None:
    """The shipped config file for a hub name, or None."""
    file = KNOWN_CONFIGS.get(name)
    if file is None:
        return None
    return Path(str(resources.files("align.plan").joinpath("known_configs", file)))


def _from_file(path: Path) -> Any:
    """A transformers config from a config.json (the raw mapping when transformers does not
    know its model type: the formula still counts it)."""
    import json

    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception:  # noqa: BLE001 (an unknown model type, or values transformers' own checks refuse)
        try:
            return json.loads(path.read_text() if path.is_file() else (path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable model config.json ({exc})") from None


def _from_hub_cache(name: str) -> Any:
    """The config of a hub name already in the local Hugging Face cache, or None (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # an invalid repo id (HFValidationError): not a hub name
        return None
    return _from_file(Path(cached)) if isinstance(cached, str) else None


def load_model_config(name: str, *, explicit: str | None = None) -> tuple[Any, str]:
    """(config, where it came from) for a model path or hub name.

    ``explicit`` (the plan's ``model_config`` key) wins: a config.json or a directory holding one.
    """
    if explicit:
        path = Path(explicit)
        if not (path.is_file() or (path / "config.json").is_file()):
            raise ConfigError(f"model_config: {explicit} is neither a config.json nor a directory holding one")
        return _from_file(path), str(path)
    path = Path(name)
    if (path / "config.json").is_file() or (path.is_file() and path.suffix == ".json"):
        return _from_file(path), str(path)
    cached = _from_hub_cache(name)
    if cached is not None:
        return cached, f"{name} (Hugging Face cache)"
    known = known_config_path(name)
    if known is not None:
        return _from_file(known), f"{name} (align/plan/known_configs/{known.name})"
    return None, ""


def missing_config_error(key: str, name: str, tried: str = "") -> ConfigError:
    """The error for a model whose config cannot be found offline."""
    known = ", ".join(sorted(KNOWN_CONFIGS))
    return ConfigError(
        f"{key}: no config.json found for {name!r} (not a local checkpoint, not in the Hugging Face cache, "
        f"not a model the plan ships numbers for{tried}); pass model_config=PATH/config.json. Shipped: {known}")
