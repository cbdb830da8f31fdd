"""align's DPO (``loss_type="dpo"``, ``length_normalize=False``) against TRL's ``DPOTrainer``
(``loss_type=["sigmoid"]``) as an independent reference, on the tiny model in fp32 on CPU.

Both trainers see the same pairs and score the same token ids. TRL is given the standard
(non-conversational) format, rendered the way align renders a row, with two adjustments
that make the token ids identical rather than nearly so:

* the rendered prompt starts with the BOS text ``<s>``, and TRL tokenizes the prompt with
  ``add_special_tokens=True`` (the tiny tokenizer, like Llama's, prepends ``<s>``): TRL
  would score a doubled BOS, so its prompt is the rendering without the leading ``<s>``;
* align ends every completion with the chat format's end of turn (``<|assistant_end|>``),
  TRL appends ``tokenizer.eos_token`` (``</s>``) to any completion not already ending with
  it: TRL's completions carry the end of turn and TRL's tokenizer copy has it as EOS.

Without them the first-batch loss differs by 4e-4 (doubled BOS) and 9e-3 (``</s>``), far
above the tolerances here. ``test_trl_scores_the_same_token_ids`` checks the result, so a
change in either library's tokenization fails there first instead of as a loss mismatch.
align uses its default path: reference log-probs from the offline pass (``align.logprobs``), padding-free batches;
TRL runs its reference model live on padded batches.
"""

from __future__ import annotations

import copy
import math
import random

import datasets
import pytest
import torch

from align.chat import render
from align.chat.formats import APERTUS
from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.scoring import encode_record
from align.testing.tiny import build_causal_lm, corpus_text
from align.trainers import PreferenceConfig, PreferenceTrainer

BETA = 0.1
PAIRS = 8
MAX_LENGTH = 128
DATE = "2025-09-01"


def make_rows(count: int = PAIRS, seed: int = 0) -> list[dict]:
    """Pair rows of random corpus words (short: nothing is cut at MAX_LENGTH)."""
    rng = random.Random(seed)
    words = corpus_text().split()

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    return [{"id": f"p{i}",
             "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text(2, 8)}],
             "chosen": text(2, 12), "rejected": text(2, 12)} for i in range(count)]


def trl_rows(rows: list[dict], tokenizer) -> list[dict]:
    """The same pairs in TRL's standard format: rendered prompt (no BOS text) + completion + end of turn."""
    out = []
    for r in rows:
        prompt = render(r["messages"], add_generation_prompt=True, chat_date=DATE)
        assert prompt.startswith(tokenizer.bos_token)
        out.append({"prompt": prompt[len(tokenizer.bos_token):], "chosen": r["chosen"] + APERTUS.turn_end,
                    "rejected": r["rejected"] + APERTUS.turn_end})
    return out


def trl_tokenizer(tokenizer):
    """A copy whose EOS is the end of turn, so TRL's add-EOS step appends nothing."""
    tok = copy.deepcopy(tokenizer)
    tok.eos_token = APERTUS.turn_end
    return tok


def reference(tokenizer) -> torch.nn.Module:
    return build_causal_lm(tokenizer)


def policy(tokenizer, scale: float = 0.02) -> torch.nn.Module:
    """The reference with seeded noise: a fresh instance each call (TRL patches the forward of its models)."""
    model = build_causal_lm(tokenizer)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


def train_settings(tmp_path, name: str, **overrides) -> dict:
    settings = {"output_dir": str(tmp_path / name), "per_device_train_batch_size": PAIRS, "max_steps": 1,
                "learning_rate": 1.0, "optim": "sgd", "lr_scheduler_type": "constant", "weight_decay": 0.0,
                "max_grad_norm": 1e9, "report_to": "none", "logging_steps": 1, "use_cpu": True, "bf16": False,
                "save_strategy": "no", "disable_tqdm": True, "seed": 0, "max_length": MAX_LENGTH,
                "activation_checkpointing": False}
    settings.update(overrides)
    return settings


def align_trainer(tokenizer, rows, tmp_path) -> PreferenceTrainer:
    """align with the reference log-probs of the offline pass, plain SGD through ``optim``."""
    compute_ref_logprobs(rows, reference(tokenizer), tokenizer, chat_format="apertus", batch_size=PAIRS,
                         max_length=MAX_LENGTH, output_dir=tmp_path / "ref", chat_date=DATE)
    config = PreferenceConfig(**train_settings(tmp_path, "align"), loss_type="dpo", length_normalize=False,
                              beta=BETA, optimizer=None, chat_date=DATE)
    return PreferenceTrainer(policy(tokenizer), config, train_dataset=load_ref_logprobs(tmp_path / "ref", rows),
                             processing_class=tokenizer)


def trl_trainer(tokenizer, rows, tmp_path):
    """TRL's DPOTrainer with a live reference model, sigmoid loss, the same β and plain SGD."""
    from trl import DPOConfig, DPOTrainer

    config = DPOConfig(**train_settings(tmp_path, "trl"), loss_type=["sigmoid"], beta=BETA,
                       train_sampling_strategy="sequential")
    return DPOTrainer(model=policy(tokenizer), ref_model=reference(tokenizer), args=config,
                      train_dataset=datasets.Dataset.from_list(trl_rows(rows, tokenizer)),
                      processing_class=trl_tokenizer(tokenizer))


def first_batch(trainer) -> dict:
    features = [trainer.train_dataset[i] for i in range(PAIRS)]
    return trainer._prepare_inputs(trainer.data_collator(features))


def loss_and_grads(trainer, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = trainer.model
    model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return loss.detach(), grads


@pytest.fixture(scope="module")
def rows():
    return make_rows()


@pytest.fixture(scope="module")
def trainers(rows, tiny_tokenizer, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("dpo_vs_trl")
    return align_trainer(tiny_tokenizer, rows, tmp_path), trl_trainer(tiny_tokenizer, rows, tmp_path)


# --------------------------------------------------------------------------- tests


def test_trl_scores_the_same_token_ids(trainers, rows, tiny_tokenizer):
    """Prompt and completion ids (end of turn included, one BOS) are align's: else nothing below means much."""
    _, trl = trainers
    end = tiny_tokenizer.convert_tokens_to_ids(APERTUS.turn_end)
    for i, row in enumerate(rows):
        ours = encode_record(tiny_tokenizer, row, max_length=MAX_LENGTH, chat_date=DATE)
        theirs = trl.train_dataset[i]
        assert theirs["prompt_ids"] == ours["prompt_ids"]
        assert theirs["chosen_ids"] == ours["chosen_ids"]
        assert theirs["rejected_ids"] == ours["rejected_ids"]
        assert ours["prompt_ids"].count(tiny_tokenizer.bos_token_id) == 1
        assert ours["chosen_ids"][-1] == ours["rejected_ids"][-1] == end


def test_reference_logps_of_the_pass_equal_trl_reference_model(trainers):
    """align's offline pass gives, per pair, the reference log-probs TRL computes with its live reference."""
    ours, trl = trainers
    batch = first_batch(trl)
    chosen, rejected = trl.compute_ref_log_probs(trl.ref_model, batch)
    data = ours.train_dataset
    torch.testing.assert_close(torch.tensor(data["ref_chosen_logps"][:PAIRS], dtype=torch.float64),
                               chosen.double(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(torch.tensor(data["ref_rejected_logps"][:PAIRS], dtype=torch.float64),
                               rejected.double(), rtol=1e-6, atol=1e-5)


def test_first_batch_loss_and_gradients_equal_trl(trainers):
    """The loss before any update, and every parameter's gradient, are TRL's (policy ≠ reference, so not log 2)."""
    ours, trl = trainers
    loss, grads = loss_and_grads(ours, first_batch(ours))
    trl_loss, trl_grads = loss_and_grads(trl, first_batch(trl))
    assert abs(loss.item() - math.log(2)) > 1e-3
    assert abs(loss.item() - trl_loss.item()) < 1e-5
    assert grads.keys() == trl_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], trl_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_one_sgd_step_gives_trl_weights(rows, tiny_tokenizer, tmp_path):
    """A full ``train()`` step (loss scaling, clipping off, SGD at lr 1) moves the weights exactly as TRL's does."""
    ours = align_trainer(tiny_tokenizer, rows, tmp_path)
    trl = trl_trainer(tiny_tokenizer, rows, tmp_path)
    start = policy(tiny_tokenizer)
    ours.train()
    trl.train()
    ours_loss = [h["loss"] for h in ours.state.log_history if "loss" in h]
    trl_loss = [h["loss"] for h in trl.state.log_history if "loss" in h]
    assert ours_loss == pytest.approx(trl_loss, abs=1e-5)
    moved = max((p - q).abs().max().item() for p, q in zip(ours.model.parameters(), start.parameters()))
    assert moved > 1e-4
    for (name, p), q in zip(ours.model.named_parameters(), trl.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
