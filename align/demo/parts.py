"""What the demo's steps and rounds share: the reward, the preference settings, the pairs a trainer can take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from align.demo.config import DATE, MAX_LENGTH, DemoConfig


def demo_reward() -> Any:
    """The demo's reward: the sorted digits exactly (``0123`` is not ``00123``), as the task says."""
    from rewards.verifiable import VerifiableReward

    return VerifiableReward(match="exact")


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
