"""Random-weight tiny models to run the recipes in `recipes/tiny/` on CPU: a Llama policy
(hidden 64, two layers; ``architecture=apertus`` or ``qwen3`` for the recipes' 8B/70B
architectures, shrunk), a one-label reward model whose tokenizer carries a chat template (what
`align annotate provider=reward_model` renders with), and a Llama that brings its own chat
template (Qwen3's, for `chat_format: tokenizer`), each saved with its tokenizer.

They learn nothing worth keeping; they make every stage's wiring run in seconds. The
weights depend only on `seed`, so a second run writes the same files. An existing
`output_dir` is left alone (and said so) unless `overwrite=true`.

Example: ``align tiny-models output_dir=runs/tiny_models`` (what `recipes/tiny/*.yaml` read).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from align.config import load_config
from align.errors import ConfigError

MODELS = ("policy", "reward_model", "own_template")  # align.testing.tiny.MODELS, without importing torch
USAGE = "align tiny-models [output_dir=DIR] [seed=N] [architecture=llama|apertus|qwen3] [overwrite=true]"


@dataclass
class Config:
    output_dir: str = field(default="runs/tiny_models", metadata={"help": "where policy/, reward_model/ and own_template/ go"})
    seed: int = field(default=0, metadata={"help": "the policy's weights seed (the reward model takes seed + 1, "
                                                   "own_template seed + 2)", "max": 2**32 - 3})
    architecture: str = field(default="llama", metadata={"help": "the policy's: llama | apertus (xIELU, QK-norm, "
                                                                 "untied head) | qwen3"})
    overwrite: bool = field(default=False, metadata={"help": "rebuild models that are already there"})


def config_from_args(args: Sequence[str]) -> Config:
    """Only key=value arguments: there is no recipe to read."""
    stray = [a for a in args if "=" not in a]
    if stray:
        raise ConfigError(f"unexpected argument {stray[0]!r} ({USAGE})")
    return load_config(Config, None, list(args))


def run(config: Config) -> dict[str, str]:
    """Save the models, or say where they already are."""
    from align.testing.tiny import check_architecture, save_tiny_models

    check_architecture(config.architecture)  # before an existing folder is compared with it
    root = Path(config.output_dir)
    present = [name for name in MODELS if (root / name / "config.json").is_file()]
    if len(present) == len(MODELS) and not config.overwrite:
        found = json.loads((root / "policy" / "config.json").read_text()).get("model_type")
        if found != config.architecture:
            raise ConfigError(f"{root / 'policy'} holds a {found} model, not {config.architecture}: choose another "
                              "output_dir, or overwrite=true to rebuild it")
        print(f"[align tiny-models] {root}: already there (overwrite=true rebuilds)")
        return {name: str(root / name) for name in MODELS}
    paths = save_tiny_models(root, seed=config.seed, architecture=config.architecture)
    for name, path in paths.items():
        print(f"[align tiny-models] {name}: {path}")
    return {name: str(path) for name, path in paths.items()}
