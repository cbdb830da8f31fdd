"""The demo's later rounds (``rounds=K``): each method's chosen policy samples, is rewarded and trained again.

Round 1 is the demo itself: SFT samples the references, both methods are tuned on the
validation prompts. Round k >= 2 repeats, for QRPO and for DPO separately, what round 1
did after SFT, from that method's round k-1 policy π_{k-1}:

1. n reference completions per training prompt (all of them, the same prompts every
   round) from π_{k-1}, at T = 1, with the same per-prompt seeds as round 1;
2. the run's reward, quantile rewards and pairs against π_{k-1}'s own samples;
3. the reference log-prob pass with π_{k-1} (the reference is the previous round's policy:
   iterative DPO with the reference updated each round, as the Llama 3 report ran it);
4. training from π_{k-1} with the β and learning rate round 1 chose on the validation
   prompts (not tuned again: a round costs one training per method, not a grid), scored on
   the validation prompts beside π_{k-1}.

Everything goes under ``output_dir/round-k/<method>/``. The held-out evaluation then
compares each round with the one before on the same prompts and samples (a paired
interval), whichever way it falls: a plateau is a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

METHODS = ("qrpo", "dpo")


@dataclass
class RoundResult:
    """One method's round k: its pairs, and the sweep of one point that trained it (None: no pairs)."""

    method: str
    round: int
    start_dir: str  # π_{k-1}'s saved model
    pairs: int
    skipped_prompts: int
    skip_reasons: dict[str, int] = field(default_factory=dict)
    mean_chosen_quantile: float | None = None
    mean_rejected_quantile: float | None = None
    result: Any = None  # align.sweep.SweepResult of the one point; None when no prompt gave a pair

    @property
    def policy_dir(self) -> str:
        """π_k: the trained point, or π_{k-1} unchanged when the round had nothing to train on."""
        return self.result.chosen.model_dir if self.result is not None else self.start_dir

    @property
    def name(self) -> str:
        """The policy's name in the evaluation (round 1 keeps the method's name)."""
        return policy_name(self.method, self.round)

    def as_json(self) -> dict[str, Any]:
        chosen = None if self.result is None else self.result.chosen
        return {"round": self.round, "start": self.start_dir, "policy": self.policy_dir, "pairs": self.pairs,
                "skipped_prompts": self.skipped_prompts, "skip_reasons": self.skip_reasons,
                "mean_chosen_quantile": self.mean_chosen_quantile,
                "mean_rejected_quantile": self.mean_rejected_quantile,
                "trained": chosen is not None,
                "settings": None if chosen is None else chosen.settings,
                "steps": None if chosen is None else chosen.steps,
                "validation": None if chosen is None else {"score": chosen.score, "start": self.result.start.get(
                    self.result.metric)}}


def policy_name(method: str, round_: int) -> str:
    """``qrpo`` for round 1, ``qrpo-round-2`` after."""
    return method if round_ == 1 else f"{method}-round-{round_}"


def round_dirs(rounds: int) -> list[str]:
    """The directories the later rounds write under output_dir."""
    return [f"round-{k}" for k in range(2, rounds + 1)]


def previous_policy(state: Any, method: str, round_: int) -> str:
    """π_{k-1} of a method: round 1's chosen point, else the round before's policy."""
    if round_ == 2:
        return state.sweeps[method].chosen.model_dir
    return state.rounds[method][-1].policy_dir


def run_round(state: Any, round_: int) -> None:
    """Round ``round_`` (>= 2) for each method, from its round ``round_ - 1`` policy."""
    for method in METHODS:
        print(f"[align demo] round {round_}, {method.upper()} ...", flush=True)
        state.rounds.setdefault(method, []).append(method_round(state, method, round_))


def method_round(state: Any, method: str, round_: int) -> RoundResult:
    """Sample, reward, pair, the reference pass and one training, all from π_{k-1} of ``method``."""
    from transformers import AutoModelForCausalLM

    from align.demo.config import DATE, GENERATE_BATCH
    from align.demo.parts import (
        annotate_into,
        count_reasons,
        demo_reward,
        pairs_into,
        preference_config,
        reference_rows,
        sample_into,
    )
    from align.sampling.hf import TransformersSampler
    from align.sweep.run import run_sweep

    config, out = state.config, state.out / f"round-{round_}" / method
    start = previous_policy(state, method, round_)
    model = AutoModelForCausalLM.from_pretrained(start)
    model.eval()
    sample_into(out, config, state.splits["prompts"], TransformersSampler(
        model, state.tokenizer, chat_format="apertus", batch_size=GENERATE_BATCH, chat_date=DATE,
        model_name=f"demo-{policy_name(method, round_ - 1)}"))
    pairs, skips = pairs_into(out, config, annotate_into(out, config), state.tokenizer)
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    found = RoundResult(method=method, round=round_, start_dir=start, pairs=len(pairs), skipped_prompts=len(skips),
                        skip_reasons=count_reasons(s["reason"] for s in skips),
                        mean_chosen_quantile=mean([p["chosen_quantile"] for p in pairs]),
                        mean_rejected_quantile=mean([p["rejected_quantile"] for p in pairs]))
    if not pairs:  # every prompt's samples all right or all wrong: nothing left to learn from here
        print(f"[align demo] round {round_}, {method.upper()}: no prompt gave a pair "
              f"({found.skip_reasons}); the policy stays as it was", flush=True)
        return found
    rows = reference_rows(out, pairs, model, state.tokenizer)
    chosen = state.sweeps[method].chosen.settings
    settings = replace(config.sweep_settings(method), grid={key: [value] for key, value in chosen.items()})
    found.result = run_sweep(preference_config(config, out / "train", method), rows, state.splits["validation"],
                             demo_reward(config), settings, model=model, tokenizer=state.tokenizer,
                             measures=config.sweep_measures())
    if found.result.chosen is None:
        raise RuntimeError(f"round {round_}, {method}: the trained policy could not be scored on the validation "
                           "prompts")
    return found


def round_policies(state: Any) -> list[tuple[str, str]]:
    """(evaluation name, model directory) of every later round's policy, in order."""
    return [(r.name, r.policy_dir) for method in METHODS for r in state.rounds.get(method, [])]


def round_comparisons(state: Any, rows: list[dict], settings: Any) -> dict[str, list[dict]]:
    """Each later round against the round before it, paired over the held-out prompts and samples."""
    from align.eval.summary import comparison_summary

    compared: dict[str, list[dict]] = {}
    for method in METHODS:
        for r in state.rounds.get(method, []):
            summary = comparison_summary(rows, r.name, policy_name(method, r.round - 1), settings)
            compared.setdefault(method, []).append({
                "round": r.round, "against": policy_name(method, r.round - 1),
                "sampled": summary["reward_difference_sampled"], "greedy": summary["reward_difference_greedy"],
                "win_rate_sampled": summary["win_rate_reward_sampled"], "verdicts": summary["verdicts"]})
    return compared


__all__ = ["METHODS", "RoundResult", "policy_name", "round_comparisons", "round_dirs", "round_policies", "run_round"]
