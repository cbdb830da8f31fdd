"""The preference trainer's losses, by value, against references computed without the trainer.

For one batch of pairs and a policy that is not its reference, the trainer's per-sample
losses (``batch_losses``) and the loss it backpropagates (``compute_loss``) must equal:

* QRPO: ``align.losses.qrpo_loss`` and the formula written out in float64, with the
  trainer's options passed through (``beta_clamp``, ``normalize_loss_by_length``,
  ``length_normalize``); an option the trainer dropped on its way to the loss shows here;
* length-normalised DPO: −log σ(β·(Δ_c/|y_c| − Δ_r/|y_r|)) in float64.

The references get nothing from the trainer: the policy log-probs are a plain unbatched
forward over each row's token ids (``encode_record``, the definition of what is scored), the
reference log-probs, quantile rewards and lengths come from the rows themselves.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from tolerances import assert_float_close, float_tolerance

from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.losses import qrpo_loss
from align.scoring import encode_record
from align.testing.tiny import build_causal_lm, corpus_text
from align.trainers import PreferenceConfig, PreferenceTrainer

MAX_LENGTH = 128
DATE = "2025-09-01"
PAIRS = 8


def make_rows(count: int, seed: int = 0) -> list[dict]:
    """Pairs of random corpus words, completions of 1 to 14 words (so |y| spans a range)."""
    rng = random.Random(seed)
    words = corpus_text().split()

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    return [{"id": f"p{i}", "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": text(2, 8)}],
             "chosen": text(1, 14), "rejected": text(1, 14), "chosen_reward": 1.0, "rejected_reward": 0.0,
             "chosen_quantile": rng.choice([0.7, 0.9, 1.0]), "rejected_quantile": rng.choice([0.0, 0.1, 0.3]),
             "num_ref_rewards": 10, "pair_fallback": None} for i in range(count)]


@pytest.fixture(scope="module")
def reference(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer)


@pytest.fixture(scope="module")
def policy(reference):
    """The reference with every weight moved a little: log-ratios are not zero."""
    out = copy.deepcopy(reference)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return out.eval()


@pytest.fixture(scope="module")
def data(reference, tiny_tokenizer, tmp_path_factory):
    rows = make_rows(PAIRS)
    out = tmp_path_factory.mktemp("ref")
    compute_ref_logprobs(rows, reference, tiny_tokenizer, chat_format="apertus", batch_size=4, max_length=MAX_LENGTH,
                         output_dir=out, chat_date=DATE)
    return load_ref_logprobs(out, rows)


def plain_logps(model, tokenizer, row: dict, name: str) -> tuple[float, int]:
    """Σ log π(y_t | x, y_<t) of one completion from one unbatched forward, in float64; and |y|."""
    encoded = encode_record(tokenizer, row, max_length=MAX_LENGTH, chat_date=DATE)
    prompt, completion = encoded["prompt_ids"], encoded[f"{name}_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].double()
    logps = torch.log_softmax(logits, dim=-1)
    return sum(logps[len(prompt) - 1 + t, token].item() for t, token in enumerate(completion)), len(completion)


def trainer_losses(policy, data, tokenizer, tmp_path, **options) -> tuple[PreferenceTrainer, torch.Tensor, float]:
    """The trainer's per-sample losses and its (mean) loss on the whole batch of PAIRS pairs."""
    config = PreferenceConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=PAIRS, max_steps=1,
                              report_to="none", use_cpu=True, max_length=MAX_LENGTH, chat_date=DATE,
                              save_strategy="no", disable_tqdm=True, seed=0, **options)
    trainer = PreferenceTrainer(policy, config, train_dataset=data, processing_class=tokenizer)
    assert [trainer.train_dataset[i]["id"] for i in range(PAIRS)] == [r["id"] for r in data]
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(PAIRS)]))
    trainer.model.eval()
    with torch.no_grad():
        losses, _ = trainer.batch_losses(trainer.model, batch)
        loss = trainer.compute_loss(trainer.model, batch)
    return trainer, losses.double(), float(loss)


def independent_inputs(policy, tokenizer, data) -> dict[str, torch.Tensor]:
    """QRPO's inputs for the 2·PAIRS samples (all chosen, then all rejected), from the rows alone."""
    columns = {"policy": [], "ref": [], "quantile": [], "length": []}
    for name in ("chosen", "rejected"):
        for row in data:
            logps, length = plain_logps(policy, tokenizer, row, name)
            assert row[f"{name}_length"] == length
            columns["policy"].append(logps)
            columns["ref"].append(row[f"ref_{name}_logps"])
            columns["quantile"].append(row[f"{name}_quantile"])
            columns["length"].append(float(length))
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in columns.items()}


def qrpo_formula(policy: float, ref: float, quantile: float, length: float, *, beta: float, length_normalize: bool,
                 beta_clamp: float | None, normalize_loss_by_length: bool) -> float:
    """(R_q − β_i·log Z_i − β_i·(log π − log π_ref))² [/ |y|], Z_i = β_i·(exp(1/β_i) − 1), plain floats."""
    beta_i = beta / length if length_normalize else beta
    if beta_clamp is not None:
        beta_i = min(beta_i, beta_clamp)
    log_z = math.log(beta_i * math.expm1(1.0 / beta_i))
    loss = (quantile - beta_i * log_z - beta_i * (policy - ref)) ** 2
    return loss / length if normalize_loss_by_length else loss


QRPO_OPTIONS = {
    "clamped_by_length_unnormalised": {"length_normalize": False, "beta": 0.5, "beta_clamp": 0.1,
                                       "normalize_loss_by_length": True},
    "length_normalised_partly_clamped": {"length_normalize": True, "beta": 5.0, "beta_clamp": 0.8,
                                         "normalize_loss_by_length": True},
    "beta_clamp_alone": {"length_normalize": False, "beta": 0.3, "beta_clamp": 0.2,
                         "normalize_loss_by_length": False},
    "apertus_defaults": {"length_normalize": True, "beta": 5.0, "beta_clamp": None,
                         "normalize_loss_by_length": False},
}


@pytest.mark.parametrize("case", sorted(QRPO_OPTIONS))
def test_trainer_qrpo_loss_equals_qrpo_loss_on_the_same_batch(case, policy, data, tiny_tokenizer, tmp_path):
    options = QRPO_OPTIONS[case]
    inputs = independent_inputs(policy, tiny_tokenizer, data)
    if options["beta_clamp"] is not None:  # the clamp binds for some samples at least, or it proves nothing
        unclamped = options["beta"] / inputs["length"] if options["length_normalize"] else \
            torch.full_like(inputs["length"], options["beta"])
        assert (unclamped > options["beta_clamp"]).any()
    _, losses, loss = trainer_losses(copy.deepcopy(policy), data, tiny_tokenizer, tmp_path, loss_type="qrpo",
                                     **options)

    expected = qrpo_loss(inputs["policy"], inputs["ref"], inputs["quantile"], inputs["length"], **options)
    by_formula = torch.tensor([qrpo_formula(*values, **options) for values in
                               zip(*(inputs[k].tolist() for k in ("policy", "ref", "quantile", "length")))],
                              dtype=torch.float64)
    torch.testing.assert_close(expected, by_formula, rtol=1e-9, atol=1e-12)  # the library function, checked too
    assert losses.shape == (2 * PAIRS,)
    # the trainer runs in float32: each log-prob is a float32 sum over the completion's tokens
    lengths = inputs["length"]
    per_sample = lambda p, r, q: qrpo_loss(p, r, q, lengths, **options)
    sources, terms = (inputs["policy"], inputs["ref"], inputs["quantile"]), (lengths, lengths, 1.0)
    assert_float_close(losses, expected, float_tolerance(per_sample, sources, terms))
    mean = lambda *xs: per_sample(*xs).mean().reshape(1)
    assert_float_close(torch.tensor([loss]), expected.mean().reshape(1),
                       float_tolerance(mean, sources, terms, output_terms=len(losses)))
    # the options matter on this batch: the loss without them is visibly different
    plain = qrpo_loss(inputs["policy"], inputs["ref"], inputs["quantile"], inputs["length"], beta=options["beta"],
                      length_normalize=options["length_normalize"])
    if options["beta_clamp"] is not None or options["normalize_loss_by_length"]:
        assert (plain - expected).abs().max() > 1e-3


def dpo_formula(policy_c: float, policy_r: float, ref_c: float, ref_r: float, len_c: int, len_r: int,
                beta: float) -> float:
    """−log σ(β·((log π_c − log π_ref,c)/|y_c| − (log π_r − log π_ref,r)/|y_r|)), plain floats."""
    margin = beta * ((policy_c - ref_c) / len_c - (policy_r - ref_r) / len_r)
    return math.log1p(math.exp(-margin)) if margin > 0 else -margin + math.log1p(math.exp(margin))


def test_trainer_length_normalised_dpo_equals_the_float64_formula(policy, data, tiny_tokenizer, tmp_path):
    beta = 5.0
    trainer, losses, loss = trainer_losses(copy.deepcopy(policy), data, tiny_tokenizer, tmp_path, loss_type="dpo",
                                           length_normalize=True, beta=beta)
    assert trainer.args.length_normalize and trainer.args.beta == beta
    expected, unnormalised, columns = [], [], []
    for row in data:
        (pc, lc), (pr, lr) = (plain_logps(policy, tiny_tokenizer, row, n) for n in ("chosen", "rejected"))
        rc, rr = row["ref_chosen_logps"], row["ref_rejected_logps"]
        expected.append(dpo_formula(pc, pr, rc, rr, lc, lr, beta))
        unnormalised.append(dpo_formula(pc, pr, rc, rr, 1, 1, beta))
        columns.append((pc, pr, rc, rr, lc, lr))
    expected = torch.tensor(expected, dtype=torch.float64)
    assert losses.shape == (PAIRS,)
    pc, pr, rc, rr, lc, lr = torch.tensor(columns, dtype=torch.float64).T
    per_pair = lambda pc, pr, rc, rr: torch.nn.functional.softplus(
        -beta * ((pc - rc) / lc - (pr - rr) / lr))
    terms = (lc, lr, lc, lr)  # float32 sums over each completion's tokens
    assert_float_close(losses, expected, float_tolerance(per_pair, (pc, pr, rc, rr), terms))
    mean = lambda *xs: per_pair(*xs).mean().reshape(1)
    assert_float_close(torch.tensor([loss]), expected.mean().reshape(1),
                       float_tolerance(mean, (pc, pr, rc, rr), terms, output_terms=len(losses)))
    # the lengths matter on this batch: without dividing by them the losses are visibly different
    assert (torch.tensor(unnormalised, dtype=torch.float64) - expected).abs().max() > 1e-2
