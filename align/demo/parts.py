"""What the demo's steps and rounds share: the reward, the preference settings, the pairs a trainer can take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from align.demo.config import DATE, GENERATE_BATCH, MAX_LENGTH, DemoConfig


def demo_reward(config: DemoConfig) -> Any:
    """The reward the run trains on and chooses with (``reward``: exact or graded)."""
    return config.reward_provider()


def preference_config(config: DemoConfig, output_dir: Path, loss_type: str) -> Any:
    """What every point of both grids shares: all but the loss (and the grid's beta and learning rate)."""
    from align.trainers.preference_config import PreferenceConfig

    grid = config.grid(loss_type)
    return PreferenceConfig(
        output_dir=str(output_dir), loss_type=loss_type, length_normalize=True, num_ref_rewards=config.n,
        beta=grid["beta"][0], learning_rate=grid["learning_rate"][0], max_steps=config.steps,
        chat_format="apertus", chat_date=DATE, max_length=MAX_LENGTH,
        per_device_train_batch_size=config.batch_pairs, lr_scheduler_type="constant", optimizer="adamw",
        weight_decay=0.0, max_grad_norm=1.0, logging_steps=8, save_strategy="no", report_to=[], use_cpu=True,
        bf16=False, seed=config.seed, data_seed=config.seed, disable_tqdm=True, dataloader_num_workers=0,
    )


def encodable_pairs(pairs: list[dict], tokenizer: Any, skips: list[dict]) -> list[dict]:
    """Pairs whose completions the trainer can tokenize; the others become recorded skips.

    A tiny model early in SFT sometimes samples the text of a format token (e.g.
    ``<|system_end|>``), which cannot be trained on as a completion.
    """
    from align.data.records import RecordError
    from align.scoring import encode_record

    kept = []
    for pair in pairs:
        try:
            encode_record(tokenizer, pair, chat_format="apertus", max_length=MAX_LENGTH, chat_date=DATE)
        except RecordError as error:
            skips.append({"id": pair["id"], "reason": f"unencodable: {error}"})
            continue
        kept.append(pair)
    return kept


# The steps round 1 and every later round run the same way, each into its own directory
# (``out``: the demo's output_dir in round 1, ``round-k/<method>/`` after).


def sample_into(out: Path, config: DemoConfig, prompts: list[dict], sampler: Any) -> None:
    """n reference completions per prompt at T = 1 from ``sampler``'s policy, into ``out/sample``."""
    from align.sampling.stages import sample_references

    sample_references(prompts, sampler, output_dir=out / "sample", n=config.n, max_tokens=config.max_tokens,
                      seed=config.seed, batch_size=GENERATE_BATCH)


def annotate_into(out: Path, config: DemoConfig) -> list[dict]:
    """The run's reward of every sample in ``out/sample``, into ``out/annotate``; the annotated records."""
    from align.io import read_output
    from rewards.annotate import annotate

    annotate(read_output(out / "sample"), demo_reward(config), out / "annotate", batch_size=GENERATE_BATCH)
    return read_output(out / "annotate")


def pairs_into(out: Path, config: DemoConfig, annotated: list[dict], tokenizer: Any) -> tuple[list[dict], list[dict]]:
    """Quantile rewards and chosen/rejected pairs the trainer can take, written to ``out/pairs``; (pairs, skips)."""
    from align.data.pairs import make_pairs
    from align.io import write_jsonl

    pairs, skips = make_pairs(annotated, seed=config.seed, num_ref_rewards=config.n)
    pairs = encodable_pairs(pairs, tokenizer, skips)
    write_jsonl(out / "pairs" / "pairs.jsonl", pairs)
    write_jsonl(out / "pairs" / "skipped.jsonl", skips)
    return pairs, skips


def reference_rows(out: Path, pairs: list[dict], model: Any, tokenizer: Any) -> list[dict]:
    """The reference pass of ``model`` over the pairs into ``out/logprobs``; the pairs with their log-probs."""
    from align.logprobs import compute_ref_logprobs, load_ref_logprobs

    compute_ref_logprobs(pairs, model, tokenizer, chat_format="apertus", batch_size=128, max_length=MAX_LENGTH,
                         output_dir=out / "logprobs", chat_date=DATE)
    return load_ref_logprobs(out / "logprobs", pairs)


def count_reasons(items: Any) -> dict[str, int]:
    """How many skips of each reason (the text before its first colon)."""
    counts: dict[str, int] = {}
    for item in items:
        key = str(item).split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts
