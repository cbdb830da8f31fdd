"""A Hugging Face model card for a trained policy, written from what its manifests record.

``align card OUTPUT_DIR`` follows the policy's completion markers back through every stage
that made it (``align.manifests.lineage``) and writes ``OUTPUT_DIR/README.md``: the base
model, the SFT data and the prompts with their fingerprints, the reward provider (model,
charter), the pairs, the method and its settings, and the evaluation with its confidence
intervals (an ``align evaluate`` output that scored this very output, found beside it or
named with ``evaluation=DIR``). Every figure is copied from a marker or a report; nothing is
estimated, and an earlier output that is gone or was replaced since is said to be so.

Examples: ``align card runs/tiny/qrpo``, ``align card runs/tiny/qrpo evaluation=runs/tiny/evaluate``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.config import load_config
from align.errors import ConfigError, InputError
from align.manifests.lineage import Made, read_made, sources, trace, walk

USAGE = "align card OUTPUT_DIR [evaluation=DIR] [output=PATH] [overwrite=true]"
MARK = "<!-- written by `align card`"
METHOD_KEYS = {
    "train": ("loss_type", "beta", "length_normalize", "beta_clamp", "num_ref_rewards", "reference",
              "truncated", "over_max_length", "learning_rate", "lr_scheduler_type", "warmup_steps",
              "max_steps", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
              "global_batch_size", "max_length", "chat_format", "optimizer", "lora_r", "dtype", "seed"),
    "sft": ("learning_rate", "lr_scheduler_type", "warmup_steps", "max_steps", "num_train_epochs",
            "per_device_train_batch_size", "gradient_accumulation_steps", "global_batch_size", "max_length",
            "chat_format", "optimizer", "lora_r", "dtype", "seed"),
    "sample": ("sampler.backend", "sampler.chat_format", "mode", "n", "temperature", "top_p", "max_tokens", "seed"),
    "annotate": ("provider", "model", "backend", "scale", "temperature", "max_tokens", "where"),
    "pairs": ("num_pairs_per_prompt", "num_ref_rewards", "low_threshold", "truncated", "seed"),
}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Config:
    """What to describe and where to write it."""

    output_dir: str = field(default="", metadata={"help": "the trained policy (an `align train` or `align sft` "
                                                          "output); also the first bare argument"})
    evaluation: str | None = field(default=None, metadata={"help": "an `align evaluate` output that scored it; "
                                                                   "None: one beside the policy that did"})
    output: str | None = field(default=None, metadata={"help": "where the card goes; None: OUTPUT_DIR/README.md"})
    overwrite: bool = field(default=False, metadata={"help": "replace a README.md that `align card` did not write"})


def config_from_args(args: Sequence[str]) -> Config:
    """``align card OUTPUT_DIR [key=value ...]``: the first bare argument is the output directory."""
    bare = [a for a in args if "=" not in a]
    if len(bare) > 1:
        raise ConfigError(f"unexpected argument {bare[1]!r} ({USAGE})")
    overrides = [a for a in args if "=" in a] + [f"output_dir={bare[0]}" for _ in bare[:1]]
    config = load_config(Config, None, overrides)
    if not config.output_dir:
        raise ConfigError(f"name the trained output directory ({USAGE})")
    return config


def run(config: Config) -> Path:
    policy = trace(Path(config.output_dir))
    if policy.stage not in ("train", "sft"):
        raise InputError(f"{config.output_dir}: an `align {policy.stage}` output, not a trained policy "
                         "(an `align train` or `align sft` output)")
    evaluation = find_evaluation(policy, config.evaluation)
    target = Path(config.output) if config.output else policy.path / "README.md"
    if target.exists() and not config.overwrite and MARK not in target.read_text(encoding="utf-8", errors="replace"):
        raise InputError(f"{target}: a README.md that `align card` did not write; set overwrite=true to replace it "
                         "or output=PATH to write the card elsewhere")
    target.write_text(render(policy, evaluation), encoding="utf-8")
    print(f"[align card] wrote {target}")
    return target


# --------------------------------------------------------------------------- the evaluation


@dataclass
class Evaluation:
    """An evaluate output that scored the policy, its report, and the policy's name in it."""

    made: Made
    report: dict[str, Any]
    name: str


def find_evaluation(policy: Made, named: str | None) -> Evaluation | None:
    """The evaluation named, or the one beside the policy whose inputs hold this very output."""
    if named:
        found = _evaluation_of(policy, read_made(Path(named)))
        if found is None:
            raise InputError(f"evaluation={named}: an evaluation that did not score {policy.path} "
                             f"(output id {policy.output_id})")
        return found
    for sibling in sorted(policy.path.parent.iterdir()):  # as given, so the card names paths as the user does
        if (sibling / "_COMPLETE.json").is_file() and sibling.resolve() != policy.path.resolve():
            try:
                found = _evaluation_of(policy, read_made(sibling))  # its own record: its chain is not needed
            except InputError:
                continue
            if found is not None:
                return found
    return None


def _evaluation_of(policy: Made, made: Made) -> Evaluation | None:
    if made.stage != "evaluate":
        return None
    for key, entry in made.inputs.items():
        match = re.fullmatch(r"policies\[(\d+)\]\.model", key)
        if match and entry.get("output_id") == policy.output_id:
            report = json.loads((made.path / "report.json").read_text(encoding="utf-8"))
            return Evaluation(made, report, str(made.setting(f"policies[{match.group(1)}].name")))
    return None


# --------------------------------------------------------------------------- the card


def render(policy: Made, evaluation: Evaluation | None) -> str:
    """The whole card: front matter, then one section per question a reader asks."""
    parts = [_front_matter(policy), f"{MARK} from the completion markers and manifests of "
             f"{len(list(walk(policy)))} stage outputs; rerun it after the model changes -->",
             f"# {policy.path.resolve().name}", _summary(policy), _chain(policy), _sources(policy),
             _rewards(policy), _method(policy), _evaluation(evaluation)]
    return "\n\n".join(p for p in parts if p) + "\n"


def base_model(policy: Made) -> dict[str, Any] | None:
    """The model no stage made at the root of the policy's chain (what SFT or training started from)."""
    for node, key, entry in sources(policy):
        if node.stage in ("sft", "train") and key == "model_name_or_path":
            return entry
    return None


def _front_matter(policy: Made) -> str:
    base = base_model(policy)
    method = str(policy.setting("loss_type") or policy.stage)
    lines = ["---", "library_name: transformers", "tags:", "- align", f"- {method}"]
    if base and HUB_ID.match(str(base.get("path", ""))):
        lines.insert(2, f"base_model: {base['path']}")
    return "\n".join([*lines, "---"])


def _summary(policy: Made) -> str:
    stages = [n.stage for n in walk(policy)]
    base = base_model(policy)
    start = f"`{base['path']}`" if base else "a model no recorded stage made"
    method = policy.setting("loss_type") or policy.stage
    return (f"A policy trained with **{str(method).upper()}** by align, starting from {start}, through the "
            f"stages {' → '.join(stages)}. Each figure below is read from the completion markers and manifests "
            "align wrote beside each output (library version "
            f"{', '.join(sorted({n.library for n in walk(policy) if n.library})) or 'not recorded'}).")


def _chain(policy: Made) -> str:
    rows = ["| stage | output | read | fingerprint | output id |", "|---|---|---|---|---|"]
    for node in walk(policy):
        read = ", ".join(f"{k}: {_short_source(v, node.inputs[k])}" for k, v in _inputs_of(node))
        rows.append(f"| {node.stage} | `{node.path}` | {read} | `{node.fingerprint[:16]}` | `{node.output_id}` |")
    missing = [f"- {node.stage} `{node.path}`, {key}: {why}" for node in walk(policy)
               for key, why in node.earlier.items() if isinstance(why, str)]
    note = "\n\nNot described (the output is gone or was replaced):\n" + "\n".join(missing) if missing else ""
    return "## How it was made\n\n" + "\n".join(rows) + note


def _inputs_of(node: Made) -> Iterator[tuple[str, Any]]:
    for key, entry in node.inputs.items():
        yield key, node.earlier.get(key, entry)


def _short_source(value: Any, entry: dict[str, Any]) -> str:
    if isinstance(value, Made):
        return f"{value.stage} output"
    return f"`{entry.get('path')}`"


def _sources(policy: Made) -> str:
    rows = ["| read by | key | path | kind | fingerprint |", "|---|---|---|---|---|"]
    for node, key, entry in sources(policy):
        rows.append(f"| {node.stage} | {key} | `{entry.get('path')}` | {entry.get('kind')} | "
                    f"`{entry.get('fingerprint')}` |")
    counts = _counts(policy)
    return "## Data and models\n\nEvery file and model that no stage made, with its content fingerprint:\n\n" + \
        "\n".join(rows) + ("\n\n" + counts if counts else "")


def _counts(policy: Made) -> str:
    """The rows each data stage kept and skipped, from its summary."""
    keys = {"sft": ("rows", "rows_dropped", "steps", "train_loss"), "sample": ("records", "completions",
            "skipped_prompts", "overlong"), "annotate": ("records", "scored", "skipped"),
            "pairs": ("prompts", "pairs", "skipped", "upstream_skipped"), "logprobs": ("rows",
            "over_max_length_skipped"), "train": ("steps", "train_loss", "world_size")}
    lines = []
    for node in walk(policy):
        shown = [f"{k} {_fmt(node.summary[k])}" for k in keys.get(node.stage, ()) if k in node.summary]
        if shown:
            lines.append(f"- {node.stage}: {', '.join(shown)}")
    return "\n".join(lines)


def _rewards(policy: Made) -> str:
    lines = []
    for node in walk(policy):
        if node.stage != "annotate":
            continue
        provider = node.setting("provider")
        model = node.setting("model") or "none"
        charter = node.inputs.get("charter")
        said = f"- provider **{provider}**, model `{model}`"
        if charter:
            said += f", charter `{charter.get('path')}` (fingerprint `{charter.get('fingerprint')}`)"
        if node.setting("where"):
            said += f", for the rows where {node.setting('where')}"
        lines.append(said + f" (`{node.path}`)")
    return "## Rewards\n\n" + ("\n".join(lines) if lines else "No annotation stage is in the chain.")


def _method(policy: Made) -> str:
    blocks = []
    for node in walk(policy):
        keys = [k for k in METHOD_KEYS.get(node.stage, ()) if k in node.settings]
        if keys:
            rows = [f"| {k} | `{json.dumps(node.settings[k])}` |" for k in keys]
            blocks.append(f"### {node.stage} (`{node.path}`)\n\n| setting | value |\n|---|---|\n" + "\n".join(rows))
    return "## Method and settings\n\n" + "\n\n".join(blocks)


def _evaluation(evaluation: Evaluation | None) -> str:
    if evaluation is None:
        return "## Evaluation\n\nNo `align evaluate` output beside this one scored it (name one with evaluation=DIR)."
    report, name = evaluation.report, evaluation.name
    level = report.get("settings", {}).get("confidence", 0.95)
    mine = report.get("overall", {}).get("policies", {}).get(name) or {}
    head = (f"## Evaluation\n\n`{evaluation.made.path}`: {report.get('prompts')} held-out prompts, reward "
            f"**{report.get('provider')}**, policy `{name}` against baseline `{report.get('baseline')}`; "
            f"intervals at {level:.0%}.\n\n| measure | estimate | interval | n |\n|---|---|---|---|")
    rows = [_interval_row(label, mine.get(key)) for key, label in
            (("reward_sampled", "mean reward (sampled)"), ("reward_greedy", "mean reward (greedy)"),
             ("length", "answer length (tokens)"), ("kl", "KL to the reference"))]
    against = report.get("overall", {}).get("comparisons", {}).get(name)
    if against:
        rows += [_interval_row(label, value) for label, value in (
            (f"reward − {against['baseline']} (sampled)", against.get("reward_difference_sampled")),
            (f"reward − {against['baseline']} (greedy)", against.get("reward_difference_greedy")),
            (f"win rate vs {against['baseline']} (sampled)", (against.get("win_rate_reward_sampled") or {}).get("rate")),
            (f"win rate vs {against['baseline']} (greedy)", (against.get("win_rate_reward_greedy") or {}).get("rate")))]
    verdicts = "".join(f"\n- {v}" for v in (against or {}).get("verdicts", []))
    return head + "\n" + "\n".join(r for r in rows if r) + ("\n" + verdicts if verdicts else "")


def _interval_row(label: str, value: dict[str, Any] | None) -> str:
    if not value:
        return ""
    return (f"| {label} | {_fmt(value['estimate'])} | {_fmt(value['low'])} to {_fmt(value['high'])} | "
            f"{value.get('n')} |")


def _fmt(value: Any) -> str:
    """Numbers as a reader reads them, to 4 significant figures; anything else as is."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)

