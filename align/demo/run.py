"""The demo's run: a short list of named steps, each a function over one shared state.

Each step uses the library's own components (SFT and preference trainers, samplers,
reward providers, pairs, the log-prob pass, ``align.sweep``, ``align.evaluate``) on the task
of ``align.demo.task``; the state carries what the steps hand on to each other.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.demo.config import DATE, GENERATE_BATCH, SFT_MAX_LENGTH, DemoConfig
from align.demo.eta import announce
from align.demo.output import check_demo_output_dir, claim_output_dir
from align.demo.parts import (
    annotate_into,
    demo_reward,
    pairs_into,
    preference_config,
    reference_rows,
    sample_into,
)
from align.errors import ConfigError


@dataclass
class DemoState:
    """What the steps hand on to each other."""

    config: DemoConfig
    out: Path
    seconds: dict[str, float] = field(default_factory=dict)
    splits: dict[str, list[dict]] = field(default_factory=dict)
    tokenizer: Any = None
    model: Any = None
    sft: Any = None                 # the SFT trainer (its model is the reference policy)
    sft_history: list[tuple[int, float]] = field(default_factory=list)
    sampler: Any = None             # the SFT policy's sampler
    annotated: list[dict] = field(default_factory=list)
    judge_summary: dict[str, Any] = field(default_factory=dict)
    pairs: list[dict] = field(default_factory=list)
    skips: list[dict] = field(default_factory=list)
    train_rows: list[dict] = field(default_factory=list)
    sweeps: dict[str, Any] = field(default_factory=dict)  # "qrpo" / "dpo" -> its align.sweep.SweepResult
    search: dict[str, dict] = field(default_factory=dict)  # "qrpo" / "dpo" -> the points its search added
    along: dict[str, list] = field(default_factory=dict)  # "qrpo" / "dpo" -> each point's checks along training
    # per measure ("exact", "graded"): the held-out figures of align.demo.measures.held_out_figures
    measures: dict[str, Any] = field(default_factory=dict)
    answer_digits: dict[str, Any] = field(default_factory=dict)  # per policy: held-out answers longer / shorter
    rounds: dict[str, list] = field(default_factory=dict)  # "qrpo" / "dpo" -> its later rounds (align.demo.rounds)


# --------------------------------------------------------------------------- checks during training


def greedy_accuracy(model: Any, tokenizer: Any, records: list[dict], *, max_tokens: int = 8,
                    batch_size: int = GENERATE_BATCH) -> float:
    """Fraction of prompts whose greedy answer is exactly right and ends the turn.

    Generated through the library's sampler (temperature 0 is argmax decoding), as the
    evaluation callback and ``align.evaluate`` generate.
    """
    from align.sampling.hf import TransformersSampler

    model.eval()
    sampler = TransformersSampler(model, tokenizer, chat_format="apertus", chat_date=DATE, batch_size=batch_size)
    drawn = sampler.sample([r["messages"] for r in records], 1, temperature=0.0, max_tokens=max_tokens)
    correct = sum(c[0].finish_reason == "stop" and c[0].text.strip() == r["answer"] for c, r in zip(drawn, records))
    return correct / len(records)


def _sft_stopper(tokenizer: Any, validation: list[dict], config: DemoConfig, history: list) -> Any:
    """A callback that stops SFT once greedy validation accuracy reaches the target."""
    from transformers import TrainerCallback

    class StopAtAccuracy(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % config.sft_eval_every:
                return
            accuracy = greedy_accuracy(model, tokenizer, validation, max_tokens=config.max_tokens)
            model.train()
            history.append((state.global_step, accuracy))
            print(f"[align demo] SFT step {state.global_step}: validation greedy accuracy {accuracy:.3f}", flush=True)
            if accuracy >= config.sft_stop_accuracy:
                control.should_training_stop = True

    return StopAtAccuracy()


# --------------------------------------------------------------------------- the steps


def make_data_and_model(state: DemoState) -> None:
    """The task's splits (settings checked first), then the output directory, tokenizer and model."""
    from align.chat import install_format, render
    from align.demo.task import build_demo_model, build_demo_tokenizer, make_splits
    from align.io import write_jsonl

    config, out = state.config, state.out
    state.splits = make_splits(  # checks the task's settings (enough distinct problems) first
        sft=config.num_sft_examples, prompts=config.num_prompts, held_out=config.num_held_out,
        validation=config.num_validation, tool_fraction=config.tool_fraction, seed=config.seed,
        length=config.length,
    )
    claim_output_dir(out, config)
    texts = [render(r["messages"], tools=r.get("tools"), chat_date=DATE) for r in state.splits["sft"][:4000]]
    state.tokenizer = build_demo_tokenizer(texts)
    state.model = build_demo_model(state.tokenizer, seed=config.seed)
    install_format(state.tokenizer, state.model, chat_format="apertus")
    for split in ("sft", "prompts", "validation", "held_out"):
        write_jsonl(out / "data" / f"{split}.jsonl", state.splits[split])


def supervised_finetuning(state: DemoState) -> None:
    """SFT until greedy validation accuracy reaches ``sft_stop_accuracy`` (or ``sft_max_steps``)."""
    from align.demo.task import batch_by_kind
    from align.sampling.hf import TransformersSampler
    from align.trainers.sft_config import SFTConfig
    from align.trainers.sft_trainer import train_sft

    config = state.config
    sft_config = SFTConfig(
        output_dir=str(state.out / "sft"),
        learning_rate=config.sft_learning_rate, max_steps=config.sft_max_steps,
        lr_scheduler_type="constant", weight_decay=0.0, optimizer="adamw", max_length=SFT_MAX_LENGTH,
        logging_steps=10, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
        seed=config.seed, data_seed=config.seed, chat_date=DATE, disable_tqdm=True,
        dataloader_num_workers=0, per_device_train_batch_size=config.sft_batch_size,
        # Padded batches, not packing: measured on these rows (400 steps), padded batches took
        # 156 s, BFD packing 242 s (TRL joins packed rows into one long row, and CPU attention
        # then works over the whole grid).
        packing=False, padding_free=False,
        # Batches of one kind, in the order batch_by_kind gives (see there).
        train_sampling_strategy="sequential",
    )
    rows = batch_by_kind(state.splits["sft"], config.sft_batch_size, seed=config.seed)
    state.sft = train_sft(sft_config, rows, state.model, state.tokenizer,
                          callbacks=[_sft_stopper(state.tokenizer, state.splits["validation"], config,
                                                  state.sft_history)])
    state.sft.model.eval()
    state.sampler = TransformersSampler(state.sft.model, state.tokenizer, chat_format="apertus",
                                        batch_size=GENERATE_BATCH, chat_date=DATE, model_name="demo-sft")


def sample_references(state: DemoState) -> None:
    """n reference completions per prompt at T = 1 from the SFT policy."""
    sample_into(state.out, state.config, state.splits["prompts"], state.sampler)


def reward_answers(state: DemoState) -> None:
    """The run's reward of each sampled answer: checked against the prompt's answer, or graded."""
    state.annotated = annotate_into(state.out, state.config)


def score_with_judge(state: DemoState) -> None:
    """Score a few sampled completions with the constitutional judge on a tiny model (the path runs)."""
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm, build_tokenizer
    from rewards.judge import ConstitutionalJudge
    from rewards.judge_backends.hf import TransformersJudgeBackend

    config = state.config
    tokenizer = build_tokenizer()
    model = build_causal_lm(tokenizer, seed=config.seed, max_position_embeddings=8192)
    install_format(tokenizer, model, chat_format="apertus")
    judge = ConstitutionalJudge(TransformersJudgeBackend(model, tokenizer, show_progress=False), top_k_pairwise=3)
    sample = state.annotated[: config.num_judge_prompts]
    groups = judge.score_groups(
        [r["messages"] for r in sample], [[c["text"] for c in r["completions"][:4]] for r in sample]
    )
    scored = [s for group in groups for s in group]
    values = [s.value for s in scored if s.value is not None]
    state.judge_summary = {
        "note": "a random-weight tiny judge: the scores exercise the path, they do not judge",
        "scored": len(values),
        "skipped": len(scored) - len(values),
        "mean_score": sum(values) / len(values) if values else None,
        "scale": list(judge.config.scale),
    }


def select_pairs(state: DemoState) -> None:
    """Quantile rewards against the references, then chosen/rejected pairs."""
    state.pairs, state.skips = pairs_into(state.out, state.config, state.annotated, state.tokenizer)
    if not state.pairs:
        from align.demo.parts import count_reasons

        reasons = count_reasons(s["reason"] for s in state.skips)
        raise ConfigError(
            f"no prompt gave a pair ({reasons}): after {state.sft.state.global_step} SFT steps every prompt's "
            "samples are all right or all wrong. Raise sft_max_steps or lower sft_stop_accuracy."
        )


def reference_logprobs(state: DemoState) -> None:
    """The offline pass: the SFT policy's log-probs of every chosen and rejected completion."""
    state.train_rows = reference_rows(state.out, state.pairs, state.sft.model, state.tokenizer)


def tune(state: DemoState, loss_type: str) -> None:
    """QRPO or DPO over its grid (``align.sweep``): every point from the SFT model on the same
    pairs, for the same steps, scored on the validation prompts; the best by ``metric`` chosen.
    While the chosen point lacks a trained neighbour, that neighbour is trained (``align.demo.grids``)."""
    from align.demo.grids import missing_neighbours, search
    from align.demo.measures import along_training, along_training_callback
    from align.sweep.run import run_sweep

    config = state.config

    def sweep(grid: dict[str, list[float]]) -> Any:
        return run_sweep(preference_config(config, state.out / loss_type, loss_type), state.train_rows,
                         state.splits["validation"], demo_reward(config), config.sweep_settings(loss_type, grid),
                         model=state.sft.model, tokenizer=state.tokenizer, measures=config.sweep_measures(),
                         callbacks=lambda point: along_training_callback(config, state.splits["validation"],
                                                                         state.tokenizer))

    result, added = search(sweep, config.grid(loss_type), config.search_points)
    if result.chosen is None:
        raise RuntimeError(f"{loss_type}: no point of the grid could be scored on the validation prompts")
    state.sweeps[loss_type] = result
    state.search[loss_type] = {
        "start_grid": config.grid(loss_type), "added": added,
        "untrained_neighbours": missing_neighbours(result.grid, result.chosen.settings,
                                                   [p.settings for p in result.points])}
    state.along[loss_type] = along_training(result)


def evaluate_policies(state: DemoState) -> None:
    """SFT, each method's chosen point (and its later rounds) on the held-out prompts with
    ``align.evaluate`` and the run's reward; then the same completions under both measures
    (exact accuracy and the graded reward): QRPO against DPO, and each round against the one
    before, on the same prompts and samples (paired comparisons)."""
    from align.demo.measures import MEASURES, answer_lengths, held_out_figures
    from align.demo.rounds import round_policies
    from align.eval.evaluate import EvalPolicy, EvalSettings, evaluate
    from align.eval.rescore import rescore_rows
    from align.io import read_records
    from align.sampling.hf import TransformersSampler

    config = state.config
    trained = [(name, result.chosen.model_dir) for name, result in state.sweeps.items()] + round_policies(state)
    trained += other_choices(state)
    policies = [EvalPolicy("sft", sampler=state.sampler)] + [
        EvalPolicy(name, sampler=lambda path=path, name=name: TransformersSampler(
            path, state.tokenizer, chat_format="apertus", batch_size=GENERATE_BATCH, chat_date=DATE,
            model_name=f"demo-{name}"))
        for name, path in trained]
    settings = EvalSettings(greedy=True, n=config.n, temperature=1.0, max_tokens=config.max_tokens,
                            seed=config.seed + 1, batch_size=GENERATE_BATCH, kl_batch_size=512)
    evaluate(state.splits["held_out"], policies, demo_reward(config), state.out / "evaluate", baseline="sft",
             settings=settings, source="held-out prompts")
    rows = read_records(state.out / "evaluate" / "eval.jsonl")
    for measure in MEASURES:
        scored = rows if measure == config.reward else rescore_rows(
            rows, state.splits["held_out"], config.reward_provider(measure), batch_size=GENERATE_BATCH)
        state.measures[measure] = held_out_figures(state, scored, settings)
    state.answer_digits = answer_lengths(rows, state.splits["held_out"])


def other_choices(state: DemoState) -> list[tuple[str, str]]:
    """Each method's point the other measure would have chosen, where it differs from the chosen one:
    ``<method>_by_reward`` when chosen on the goal, ``<method>_by_goal`` when chosen on the reward
    (the exact measure the sweep scored beside it). (name, model directory) for the evaluation."""
    from align.demo.grids import other_choice

    out = []
    for name, result in state.sweeps.items():
        other, by = other_choice(result)
        if other is not None and result.chosen is not None and other.name != result.chosen.name:
            out.append((f"{name}_by_{by}", other.model_dir))
    return out


# The steps, in order, with the names the demo prints and reports timings under.
STEPS: tuple[tuple[str, Callable[[DemoState], None]], ...] = (
    ("data and model", make_data_and_model),
    ("SFT", supervised_finetuning),
    ("sample references", sample_references),
    ("annotate (reward)", reward_answers),
    ("judge (tiny model, path check)", score_with_judge),
    ("pairs", select_pairs),
    ("reference log-probs", reference_logprobs),
    ("QRPO sweep", lambda state: tune(state, "qrpo")),
    ("DPO sweep", lambda state: tune(state, "dpo")),
    ("evaluate (align.evaluate)", evaluate_policies),
)


def demo_steps(config: DemoConfig) -> list[tuple[str, Callable[[DemoState], None]]]:
    """The steps of a run: round 1 (``STEPS`` up to the evaluation), each later round, then the evaluation."""
    from align.demo.rounds import run_round

    later = [(f"round {k}", lambda state, k=k: run_round(state, k)) for k in range(2, config.rounds + 1)]
    return list(STEPS[:-1]) + later + [STEPS[-1]]


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Check the output directory, run the steps in order, write the report and the figure."""
    import torch

    from align.demo.report import build_report, plot_training, print_summary, write_report

    # the same thread count everywhere: the same float sums (CPU kernels are deterministic
    # already; torch's deterministic mode changed no digit and made SFT 2.4x slower, measured)
    torch.set_num_threads(config.threads or os.cpu_count() or 1)
    state = DemoState(config=config, out=Path(config.output_dir))
    check_demo_output_dir(state.out)  # before anything is made or removed
    started = time.time()
    steps = demo_steps(config)
    for index, (name, step) in enumerate(steps):
        print(announce(config.preset, [n for n, _ in steps], index, state.seconds), flush=True)
        begun = time.time()
        step(state)
        state.seconds[name] = round(time.time() - begun, 1)
        print(f"[align demo] {name}: {state.seconds[name]} s", flush=True)
    plot_training(state)
    report = build_report(state, total_seconds=round(time.time() - started, 1))
    write_report(state.out, report)
    print_summary(state, report)
    return report
