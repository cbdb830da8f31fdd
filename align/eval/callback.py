"""Evaluation during training: reward and win rate of the current weights on fixed prompts.

At the start of training the callback generates completions for a fixed prompt set with
the initial weights (the reference completions) and scores them. Every ``eval_steps``
optimizer steps it generates again with the current weights, scores, and logs through the
trainer (so through ``report_to``: TensorBoard, W&B, ...):

    gen_eval/reward          mean reward of the current completions
    gen_eval/reward_start    mean reward of the reference completions (logged once, step 0)
    gen_eval/win_rate        wins + ties/2 against the reference completion of each prompt
    gen_eval/length          mean completion length in tokens
    gen_eval/also/NAME       mean score by each ``also`` provider (e.g. an exact answer check
                             beside the reward model trained on: over-optimisation shows
                             as ``reward`` rising while it does not)

Works under DDP and DeepSpeed ZeRO-2/3: TRL's ``unwrap_model_for_generation`` gathers
ZeRO-3's partitioned weights for the duration of generation, each rank generates for its
share of the prompts, and the scores are gathered so every rank logs the same numbers.

Usage::

    callback = GenerationEvalCallback(prompts, rewards.VerifiableReward(), tokenizer, eval_steps=50)
    align.train(config, rows, model, tokenizer=tokenizer, callbacks=[callback])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import TrainerCallback

from align.errors import ConfigError, InputError
from align.eval import stats
from align.sampling.base import derive_seed


class GenerationEvalCallback(TrainerCallback):
    """Generate, score and compare with the first completions every ``eval_steps`` steps.

    Args:
        prompts: records with ``id`` and ``messages`` (and the provider's reference field,
            e.g. ``answer``), the same at every evaluation.
        provider: any reward provider (``rewards.VerifiableReward``, ``RewardModel``, the
            judge pointwise).
        tokenizer: the policy's tokenizer (with its chat format).
        eval_steps: evaluate every this many optimizer steps (and at the end).
        chat_format / chat_date: how prompts are rendered (pin ``chat_date`` as the trainer does).
        temperature: 0 for greedy completions (default), else sampled, seeded per prompt.
        max_tokens / batch_size: generation budget and prompts per ``generate`` call.
        prefix: the metric names' prefix.
        also: more providers (name -> provider) that score the same completions, each logged
            as its mean (``also/NAME``), at the start too.
    """

    def __init__(
        self,
        prompts: Sequence[Mapping[str, Any]],
        provider: Any,
        tokenizer: Any,
        *,
        eval_steps: int,
        chat_format: str = "apertus",
        chat_date: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 64,
        batch_size: int = 16,
        seed: int = 0,
        prefix: str = "gen_eval",
        also: Mapping[str, Any] | None = None,
    ):
        if eval_steps < 1:
            raise ConfigError(f"eval_steps must be >= 1, got {eval_steps}")
        if not prompts:
            raise InputError("prompts: the evaluation needs at least one prompt")
        from align.eval.evaluate import check_prompts

        self.prompts = [dict(p) for p in prompts]
        self.also = dict(also or {})
        for scorer in (provider, *self.also.values()):
            check_prompts(self.prompts, "evaluation prompts", getattr(scorer, "reference_field", None))
        self.provider, self.tokenizer = provider, tokenizer
        self.eval_steps, self.chat_format, self.chat_date = eval_steps, chat_format, chat_date
        self.temperature, self.max_tokens, self.batch_size = temperature, max_tokens, batch_size
        self.seed, self.prefix = seed, prefix
        self.trainer: Any = None
        self.reference: dict[str, float | None] = {}
        self.history: list[dict[str, float]] = []
        self.also_scores: dict[str, dict[str, float | None]] = {}

    def bind_trainer(self, trainer: Any) -> None:
        """The trainer whose model is evaluated and whose ``log`` reports the metrics."""
        self.trainer = trainer

    # -- generation and scoring -------------------------------------------------------------
    def _evaluate(self) -> dict[str, tuple[float | None, int]]:
        """(score, length) per prompt id for the current weights, the same on every rank; the
        ``also`` providers' scores per prompt id go to ``self.also_scores``."""
        from accelerate.utils import gather_object
        from trl.models.utils import unwrap_model_for_generation

        from align.sampling.hf import TransformersSampler

        if self.trainer is None:
            raise RuntimeError("GenerationEvalCallback is not bound to a trainer: pass it through the trainer's "
                               "callbacks= (align's trainers bind it), or call bind_trainer(trainer)")
        accelerator = self.trainer.accelerator
        mine = self.prompts[accelerator.process_index :: accelerator.num_processes]
        results: list[tuple[str, float | None, int, dict[str, float | None]]] = []
        with unwrap_model_for_generation(self.trainer.model_wrapped, accelerator) as model:
            was_training = model.training
            sampler = TransformersSampler(model, self.tokenizer, chat_format=self.chat_format, chat_date=self.chat_date,
                                          batch_size=self.batch_size)
            try:
                for start in range(0, len(mine), self.batch_size):
                    batch = mine[start : start + self.batch_size]
                    drawn = sampler.sample([p["messages"] for p in batch], 1, temperature=self.temperature,
                                           max_tokens=self.max_tokens,
                                           seed=[derive_seed(self.seed, p["id"]) for p in batch],
                                           tools=[p.get("tools") for p in batch])
                    scores = self._scores(self.provider, batch, drawn)
                    also = {name: self._scores(scorer, batch, drawn) for name, scorer in self.also.items()}
                    results += [(p["id"], s, c[0].num_tokens, {name: values[i] for name, values in also.items()})
                                for i, (p, s, c) in enumerate(zip(batch, scores, drawn))]
            finally:
                model.train(was_training)
        gathered = gather_object(results) if accelerator.num_processes > 1 else results
        self.also_scores = {rid: also for rid, _, _, also in gathered}
        return {rid: (value, length) for rid, value, length, _ in gathered}

    @staticmethod
    def _scores(provider: Any, batch: Sequence[Mapping[str, Any]], drawn: Sequence[Sequence[Any]]) -> list:
        """``provider``'s value of each prompt's one completion (None where it skipped)."""
        field = getattr(provider, "reference_field", None)
        groups = provider.score_groups([p["messages"] for p in batch], [[c[0].text] for c in drawn],
                                       references=[p[field] for p in batch] if field else None)
        return [group[0].value for group in groups]

    def also_means(self) -> dict[str, float]:
        """Each ``also`` provider's mean over the prompts it scored (of the last evaluation)."""
        means = {}
        for name in self.also:
            values = [scores[name] for scores in self.also_scores.values() if scores[name] is not None]
            if values:
                means[f"also/{name}"] = sum(values) / len(values)
        return means

    def _log(self, metrics: dict[str, float], step: int) -> None:
        """Report through the trainer's callbacks (report_to), leaving the training logs alone.

        ``Trainer.log`` itself, past the subclasses' overrides, which would flush their
        running training metrics into this entry; and the step's pending "log now" flag is
        kept, which reporting clears, or that step's training loss would never be logged.
        """
        from transformers import Trainer

        self.history.append({"step": step, **metrics})
        pending = self.trainer.control.should_log
        Trainer.log(self.trainer, {f"{self.prefix}/{k}": v for k, v in metrics.items()})
        self.trainer.control.should_log = pending

    # -- trainer events -----------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.reference:  # resumed in the same process: keep the first completions
            return
        results = self._evaluate()
        self.reference = {rid: value for rid, (value, _) in results.items()}
        scored = [v for v in self.reference.values() if v is not None]
        metrics = {"reward_start": sum(scored) / len(scored)} if scored else {}
        metrics["length"] = sum(length for _, length in results.values()) / len(results)
        self._log({**metrics, **self.also_means()}, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0 or state.global_step >= state.max_steps:
            self._log({**self.compare(self._evaluate()), **self.also_means()}, state.global_step)

    def compare(self, results: Mapping[str, tuple[float | None, int]]) -> dict[str, float]:
        """Mean reward, win rate against the first completions, and mean length."""
        scored = [v for v, _ in results.values() if v is not None]
        outcomes = [[stats.outcome(value, self.reference.get(rid))] for rid, (value, _) in results.items()]
        win = stats.pooled_win_rate(outcomes)
        metrics = {"length": sum(length for _, length in results.values()) / len(results)}
        if scored:
            metrics["reward"] = sum(scored) / len(scored)
        if win is not None:
            metrics["win_rate"] = win
        return metrics
