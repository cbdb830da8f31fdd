"""Constitutional LLM judge (docs/method.md, "Constitutional judge, pointwise" and "pairwise"; Apertus report, Appendix E.4).

Pointwise: the prompt is the charter followed by an instruction to rate the
QUESTION/RESPONSE pair on the scale (default 1–9, 9 best) and to answer with the number
only, thinking disabled. The score is the probability-weighted mean over the scale
tokens at the first answer position,

    score = Σ_k k·p(k) / Σ_k p(k),    k = scale_min .. scale_max,

renormalised over the scale tokens the backend could see (all of them with full logits,
those in the top-20 with vLLM/OpenAI). No scale token visible → a recorded skip.

Every prompt is measured before it is sent: one longer than the backend's
``max_model_len`` (with the answer token) would make vLLM or a server refuse the whole
batch, so that rating is a recorded skip (``prompt_too_long: ...`` with the length and the
limit), and that pairwise comparison is undecided (first_wins 0.5, its note saying why).

Pairwise (optional, default top 5): the top-k completions of a prompt by pointwise score
are sorted by odd–even transposition with comparisons asked in both orders and averaged
(see `rewards.pairwise`). Empty completions never enter the top-k: they are ranked last,
below every non-empty completion (an empty completion compared directly still loses
without asking). When only one of the two orders gives a readable answer the comparison
records `orders_used: 1`; `single_order="score"` uses that order alone, `"skip"` treats
the pair as undecided (it keeps its pointwise order). The final ranking is the top-k in
pairwise order, then the rest by pointwise score. Rewards must
stay numbers for the quantile stage, so the top-k's own pointwise values are re-dealt in
pairwise order (the best pairwise completion gets the highest of their pointwise scores):
values stay on the judge's scale and sort into exactly the final ranking. The original
pointwise score and the pairwise rank are kept in `details`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from align.errors import ConfigError, InputError
from rewards.base import Conversation, RewardProvider, Score, checked, is_empty
from rewards.charter import Charter, load_charter, load_template, template_fields
from rewards.judge_backends.base import PROMPT_TOO_LONG, JudgeBackend, LabelLogprobs
from rewards.pairwise import (
    Comparison,
    GroupRanking,
    combine_orders,
    odd_even_rank,
    preference_from_logprobs,
)
from rewards.text import transcript

_SENTINEL = "\u0000QUESTION-STARTS-HERE\u0000"


@dataclass
class JudgeConfig:
    """Settings of the constitutional judge.

    scale:          inclusive integer range of the rating (default (1, 9), 9 best, as in the
                    report; the published judge code defaults to 1–8, an off-by-one). Every
                    label must be spelled by a single token of the judge's tokenizer (with
                    or without a leading space or marker; all such tokens are summed);
                    checked when the judge is built.
    top_k_pairwise: how many of a prompt's best pointwise completions to rank pairwise
                    (default 5; 0 or 1 turns pairwise ranking off).
    max_phases:     limit on odd–even phases (default None = top_k, enough for any order).
    pointwise_template / pairwise_template: packaged template names or file paths
                    ($charter, $question, $response / $response_a, $response_b,
                    $scale_min, $scale_max).
    pairwise_labels: the two answer tokens for "first shown is better" / "second is".
    single_order:   a pairwise comparison where only one order was readable: "score" (use
                    that order alone, recorded as orders_used 1) or "skip" (undecided).
    """

    scale: tuple[int, int] = (1, 9)
    top_k_pairwise: int = 5
    max_phases: int | None = None
    pointwise_template: str = "judge_pointwise"
    pairwise_template: str = "judge_pairwise"
    pairwise_labels: tuple[str, str] = ("A", "B")
    single_order: str = "score"

    def __post_init__(self) -> None:
        low, high = self.scale
        if not (isinstance(low, int) and isinstance(high, int)) or low < 0 or high <= low:
            raise ConfigError(f"scale must be two integers low < high, got {self.scale}")
        if self.top_k_pairwise < 0:
            raise ConfigError(f"top_k_pairwise must be >= 0, got {self.top_k_pairwise}")
        if self.max_phases is not None and self.max_phases < 1:
            raise ConfigError(f"max_phases must be >= 1 or None, got {self.max_phases}")
        if len(set(self.pairwise_labels)) != 2:
            raise ConfigError(f"pairwise_labels must be two different labels, got {self.pairwise_labels}")
        if self.single_order not in ("score", "skip"):
            raise ConfigError(f"single_order must be 'score' or 'skip', got {self.single_order!r}")

    @property
    def labels(self) -> list[str]:
        return [str(k) for k in range(self.scale[0], self.scale[1] + 1)]


def expected_score(logprobs: LabelLogprobs, labels: Sequence[str]) -> tuple[float, float] | None:
    """(Σ k·p(k) / Σ p(k), Σ p(k)) over the labels present; None when none is present."""
    present = [(int(label), logprobs[label]) for label in labels if label in logprobs and math.isfinite(logprobs[label])]
    if not present:
        return None
    top = max(lp for _, lp in present)
    weights = [(k, math.exp(lp - top)) for k, lp in present]
    total = sum(w for _, w in weights)
    return sum(k * w for k, w in weights) / total, total * math.exp(top)


class ConstitutionalJudge(RewardProvider):
    """Rate completions by their adherence to a charter, pointwise then pairwise."""

    name = "constitutional_judge"

    def __init__(
        self,
        backend: JudgeBackend,
        charter: Charter | str | Path | None = None,
        *,
        scale: tuple[int, int] = (1, 9),
        top_k_pairwise: int = 5,
        max_phases: int | None = None,
        pointwise_template: str = "judge_pointwise",
        pairwise_template: str = "judge_pairwise",
        pairwise_labels: tuple[str, str] = ("A", "B"),
        single_order: str = "score",
    ):
        """`charter`: a Charter, a charter file path, or None for the default charter."""
        self.config = JudgeConfig(tuple(scale), top_k_pairwise, max_phases, pointwise_template, pairwise_template,
                                  tuple(pairwise_labels), single_order)
        self.backend = backend
        backend.check_labels(self.config.labels)  # a label no single token spells fails here, not mid-run
        backend.check_labels(list(self.config.pairwise_labels))
        self.charter = charter if isinstance(charter, Charter) else load_charter(charter)
        self.pointwise_template = _checked_template(pointwise_template, {"charter", "question", "response"})
        self.pairwise_template = _checked_template(pairwise_template, {"charter", "question", "response_a", "response_b"})
        self._charter_text = self.charter.text()
        self._prefixes: dict[str, str] = {}

    # -- prompts ---------------------------------------------------------------------------
    def _fill(self, template: Template, **fields: str) -> str:
        low, high = self.config.scale
        return template.substitute(charter=self._charter_text, scale_min=str(low), scale_max=str(high), **fields)

    def pointwise_prompt(self, conversation: Conversation, completion: str) -> str:
        """The rendered prompt whose next token is the rating."""
        return self.backend.render(self._fill(self.pointwise_template, question=transcript(conversation), response=completion))

    def pairwise_prompt(self, conversation: Conversation, response_a: str, response_b: str) -> str:
        """The rendered prompt whose next token is "A" or "B"."""
        text = self._fill(self.pairwise_template, question=transcript(conversation), response_a=response_a, response_b=response_b)
        return self.backend.render(text)

    def shared_prefix(self, kind: str) -> str:
        """Rendered text every prompt of `kind` starts with: template start through the charter
        and the instruction, up to the question."""
        if kind not in self._prefixes:
            if kind == "pointwise":
                text = self._fill(self.pointwise_template, question=_SENTINEL, response="")
            else:
                text = self._fill(self.pairwise_template, question=_SENTINEL, response_a="", response_b="")
            rendered = self.backend.render(text)
            cut = rendered.find(_SENTINEL)
            self._prefixes[kind] = rendered[:cut] if cut > 0 else ""
        return self._prefixes[kind]

    # -- pointwise -------------------------------------------------------------------------
    def score(
        self,
        conversations: Sequence[Conversation],
        completions: Sequence[str],
        *,
        references: Sequence[Any] | None = None,
    ) -> list[Score]:
        """Pointwise scores (no pairwise ranking: that needs a prompt's whole group).

        An empty completion is not shown to the judge: it gets the scale minimum (the score
        of an answer that does nothing the charter asks), with the reason in its details, so
        a prompt is not lost because one of its references came back empty.
        """
        if len(conversations) != len(completions):
            raise InputError(f"{len(conversations)} conversations for {len(completions)} completions")
        low = float(self.config.scale[0])
        scores = [Score(low, None, {"empty_completion": f"empty completion: given the scale minimum {low:g}"})
                  for _ in completions]  # replaced below for every completion the judge is asked about
        asked, prompts = [], []
        for i, completion in enumerate(completions):
            if is_empty(completion):
                continue
            prompt = self.pointwise_prompt(conversations[i], completion)
            if problem := self.backend.too_long(prompt):  # this rating only; the batch goes on
                scores[i] = Score.skip(problem)
                continue
            asked.append(i)
            prompts.append(prompt)
        labels = self.config.labels
        answers = self.backend.label_logprobs(prompts, labels, shared_prefix=self.shared_prefix("pointwise")) \
            if prompts else []
        refused = dict(self.backend.refusals) if prompts else {}
        for n, (i, logprobs) in enumerate(zip(asked, answers, strict=True)):
            if n in refused:
                scores[i] = Score.skip(f"{PROMPT_TOO_LONG}: {refused[n]}")
                continue
            result = expected_score(logprobs, labels)
            if result is None:
                scores[i] = Score.skip(f"no scale token ({labels[0]}-{labels[-1]}) among the judge's top tokens")
                continue
            value, mass = result
            scores[i] = checked(value, pointwise=value, scale_mass=mass)
        return scores

    # -- pairwise --------------------------------------------------------------------------
    def score_groups(
        self,
        conversations: Sequence[Conversation],
        completion_groups: Sequence[Sequence[str]],
        *,
        references: Sequence[Any] | None = None,
    ) -> list[list[Score]]:
        """Pointwise scores for every completion, then pairwise ranking of each group's top-k."""
        pointwise = super().score_groups(conversations, completion_groups)
        if self.config.top_k_pairwise < 2:
            return pointwise
        candidates = [_top_k(group, self.config.top_k_pairwise, texts) for group, texts in zip(pointwise, completion_groups)]
        compare = lambda pairs: self.compare_pairs(
            [(conversations[g], completion_groups[g][a], completion_groups[g][b]) for g, a, b in pairs]
        )
        rankings = odd_even_rank(candidates, compare, max_phases=self.config.max_phases)
        ranked = [_apply_ranking(scores, ranking) for scores, ranking in zip(pointwise, rankings)]
        return [_empty_last(scores, texts, self.config.scale[0]) for scores, texts in zip(ranked, completion_groups)]

    def compare_pairs(self, pairs: Sequence[tuple[Conversation, str, str]]) -> list[Comparison]:
        """P(first better) for each (conversation, first, second), asked in both orders."""
        results: list[Comparison | None] = [None] * len(pairs)
        prompts, asked = [], []
        for i, (conversation, first, second) in enumerate(pairs):
            if is_empty(first) or is_empty(second):
                results[i] = _empty_comparison(first, second)
                continue
            both = [self.pairwise_prompt(conversation, first, second), self.pairwise_prompt(conversation, second, first)]
            if problem := next(filter(None, map(self.backend.too_long, both)), None):
                results[i] = Comparison(0.5, note=problem)  # undecided, this comparison only
                continue
            prompts += both
            asked.append(i)
        if prompts:
            label_a, label_b = self.config.pairwise_labels
            answers = self.backend.label_logprobs(prompts, [label_a, label_b], shared_prefix=self.shared_prefix("pairwise"))
            refused = dict(self.backend.refusals)
            for n, i in enumerate(asked):
                if 2 * n in refused or 2 * n + 1 in refused:
                    results[i] = Comparison(0.5, note=f"{PROMPT_TOO_LONG}: {refused.get(2 * n) or refused[2 * n + 1]}")
                    continue
                ab, ba = answers[2 * n], answers[2 * n + 1]
                p_as_a = preference_from_logprobs(ab.get(label_a), ab.get(label_b))
                p_b_first = preference_from_logprobs(ba.get(label_a), ba.get(label_b))
                p_as_b = None if p_b_first is None else 1.0 - p_b_first
                results[i] = combine_orders(p_as_a, p_as_b, single_order=self.config.single_order)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Let the backend drop its model or engine (``align evaluate`` closes the judge before
        the KL step loads the policies)."""
        self.backend.close()

    def fingerprint(self) -> dict[str, Any]:
        digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:16]
        return {
            "provider": self.name,
            **self.backend.describe(),
            "charter": digest(self._charter_text),
            "pointwise_template": digest(self.pointwise_template.template),
            "pairwise_template": digest(self.pairwise_template.template),
            "scale": list(self.config.scale),
            "top_k_pairwise": self.config.top_k_pairwise,
            "max_phases": self.config.max_phases,
            "single_order": self.config.single_order,
        }


def _checked_template(name: str, required: set[str]) -> Template:
    template = load_template(name)
    missing = required - template_fields(template)
    if missing:
        raise InputError(f"judge template {name!r} lacks the placeholders {sorted('$' + m for m in missing)}")
    if not template.template.lstrip().startswith("$charter"):
        raise InputError(f"judge template {name!r} must start with $charter, the prefix every call shares")
    return template


def _top_k(scores: Sequence[Score], k: int, texts: Sequence[str]) -> list[int]:
    """Indices of the k best scored non-empty completions, best first (ties: input order)."""
    scored = [i for i, s in enumerate(scores) if s.value is not None and not is_empty(texts[i])]
    return sorted(scored, key=lambda i: -scores[i].value)[:k]


def _empty_last(scores: list[Score], texts: Sequence[str], floor: float) -> list[Score]:
    """Rank empty completions below every non-empty one: a value above the lowest non-empty
    value (or above the scale minimum) is lowered to the lower of the two."""
    values = [s.value for s, t in zip(scores, texts) if s.value is not None and not is_empty(t)]
    lowest = min([floor, *values])
    out = list(scores)
    for i, (score, text) in enumerate(zip(scores, texts)):
        if is_empty(text) and score.value is not None and score.value > lowest:
            out[i] = Score(lowest, None, {**score.details, "empty_ranked_last": True})
    return out


def _empty_comparison(first: str, second: str) -> Comparison:
    """An empty completion loses without asking the judge; two empty ones tie."""
    if is_empty(first) and is_empty(second):
        return Comparison(0.5, note="both completions empty")
    return Comparison(0.0 if is_empty(first) else 1.0, note="empty completion loses")


def _apply_ranking(scores: list[Score], ranking: GroupRanking) -> list[Score]:
    """Re-deal the top-k's pointwise values in pairwise order and record the ranks."""
    if len(ranking.order) < 2:
        return scores
    values = sorted((scores[i].value for i in ranking.order), reverse=True)
    out = list(scores)
    for rank, (index, value) in enumerate(zip(ranking.order, values), start=1):
        mine = [c for (a, _), c in ranking.comparisons.items() if a == index]
        agreed = [c.orders_agree for c in mine if c.orders_agree is not None]
        details = {
            **scores[index].details,
            "pairwise_rank": rank,
            "pairwise_comparisons": len(mine),
            "pairwise_wins": sum(c.first_wins > 0.5 for c in mine),
            "pairwise_orders_agree": sum(agreed),
            "pairwise_orders_read": len(agreed),
            "pairwise_single_order": sum(c.orders_used == 1 for c in mine),
            "pairwise_phases": ranking.phases,
        }
        too_long = sum((c.note or "").startswith(PROMPT_TOO_LONG) for c in mine)
        if too_long:
            details["pairwise_prompt_too_long"] = too_long  # undecided comparisons, pointwise order kept
        out[index] = Score(value, None, details)
    return out
