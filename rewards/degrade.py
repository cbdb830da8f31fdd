"""Degradation ladders: a good answer made worse one flaw at a time (Apertus report, Appendix E.4.5).

A ladder starts from a good completion (step 0) and adds one new flaw per step, keeping
the flaws already there, so step j carries j flaws and the step number is the true rank
(lower is better). A judge is then measured by how well its scores reproduce that order
(`rewards.validation`).

The eleven flaw kinds are listed in `FLAW_KINDS`, each with the description an LLM
degrader is given. Two degraders build the steps:

- `RuleDegrader`: no model. Each flaw kind it can imitate is a small, deterministic text
  transform (seeded); see `RuleDegrader.TRANSFORMS` and the `_flaw_*` functions below.
  It cannot imitate factual errors, skipped instructions or faulty reasoning (they need
  to understand the content), and says so in `RuleDegrader.cannot`. Its inserted
  phrases are English.
- `LLMDegrader`: any `generate(conversations, seed=...) -> texts` callable (a
  `rewards.generation.Generator` on a sampler) rewrites the response with the prompt
  template `charter/degrade.txt`, each with its item's seed; it can be asked for any of
  the eleven kinds.

Both answer `degrade(items)` for a batch of (question, text, kind, seed) and return the
degraded text, or None where the flaw cannot be applied to that text (a transform that
needs numbers, a rewrite that came back empty or unchanged); the ladder builder then
tries another kind.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from align.errors import ConfigError, InputError
from rewards.base import Conversation
from rewards.generation import Generate
from rewards.text import transcript

FLAW_KINDS: dict[str, str] = {
    "factual_accuracy": "a statement of fact in the response becomes false (a wrong date, name, place or quantity stated as true)",
    "logical_coherence": "the response contradicts itself or draws a conclusion that does not follow from what it said",
    "incompleteness": "the response stops before it has fully answered; an important part of the answer is missing",
    "organisation": "the response's parts come in a confusing order, so it is hard to follow",
    "off_task": "the response includes content that has nothing to do with the question",
    "language_quality": "the response has spelling mistakes, typos or ungrammatical sentences",
    "inappropriate_certainty": "the response states things with more certainty than is warranted, removing caveats and hedges",
    "ignored_format": "the response ignores the format it should have (lists, steps, headings, code blocks, requested layout)",
    "skipped_instructions": "the response leaves out or disregards an explicit instruction or constraint in the question",
    "faulty_reasoning": "a step of the response's reasoning is wrong, though the text still reads smoothly",
    "wrong_answer": "the final answer or result the response gives is wrong",
}

DegradeItem = tuple[Conversation, str, str, int]  # (question, text, flaw kind, seed)


class Degrader:
    """Makes a text worse by one flaw of a given kind.

    `ORDER` says how `build_ladders` builds a ladder with it. None (the default): one flaw
    at a time, each step degrading the previous step's text with the next kind drawn (a
    model that rewrites keeps the flaws already there). A tuple of kinds: the degrader's
    flaws are text transforms a later one could undo (a truncation cutting away an inserted
    passage), so a ladder draws its kinds first and applies them in this order.
    """

    name = "degrader"
    kinds: tuple[str, ...] = ()
    cannot: Mapping[str, str] = {}
    ORDER: ClassVar[tuple[str, ...] | None] = None

    def degrade(self, items: Sequence[DegradeItem]) -> list[str | None]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"degrader": self.name, "kinds": list(self.kinds), "cannot": dict(self.cannot)}


# --------------------------------------------------------------------------- rule-based

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_NUMBER = re.compile(r"(?<![\w.])(\d+)(\.\d+)?(?![\w])")
_FORMAT_LINE = re.compile(r"^\s*(?:[-*+•]\s+|\d+[.)]\s+|#{1,6}\s+|>\s+)")
_AUXILIARY = re.compile(r"\b(is|are|was|were|can|will|should|does|do|has|have|must)\b(?! not\b)", re.IGNORECASE)
_LOWER_STARTS = {"The", "A", "An", "It", "This", "That", "There", "They", "We", "You", "These", "Those", "Its"}
_WORD = re.compile(r"[A-Za-zÀ-ÿ]{4,}")
_HEDGES = [
    (r"\bmight\b", "will"), (r"\bmay\b", "will"), (r"\bcould\b", "will"), (r"\bprobably\b", "certainly"),
    (r"\blikely\b", "certain"), (r"\bperhaps\b", "definitely"), (r"\bpossibly\b", "definitely"),
    (r"\bapproximately\b", "exactly"), (r"\broughly\b", "exactly"), (r"\babout\b(?= \d)", "exactly"),
    (r"\bI think\b", "It is a fact that"), (r"\bit seems\b", "it is certain"), (r"\busually\b", "always"),
    (r"\boften\b", "always"), (r"\bsome\b", "all"),
]
OFF_TASK_PASSAGES = [
    "Incidentally, octopuses have three hearts and blue blood.",
    "On a different note, the first postage stamp was issued in Britain in 1840.",
    "By the way, a good sourdough starter should be fed once a day.",
    "Unrelated, but the tallest mountain in Africa is Kilimanjaro.",
    "As an aside, honey stored in a sealed jar can keep for a very long time.",
    "Speaking of something else entirely, chess was played in Persia over a thousand years ago.",
]


def sentences(text: str) -> list[str]:
    """Sentences of a text (split after . ! ? followed by space)."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def _flaw_incompleteness(text: str, rng: random.Random) -> str | None:
    """Truncation: keep the first 55% of the words and stop mid-sentence (no closing punctuation)."""
    words = text.split()
    if len(words) < 8:
        return None
    kept = " ".join(words[: max(4, int(len(words) * 0.55))]).rstrip(".!?;:,")
    return kept if kept != text.strip() else None


def _flaw_organisation(text: str, rng: random.Random) -> str | None:
    """Shuffled order: the lines (when there are 3 or more) or else the sentences, reordered
    so that no unit keeps its place where possible (a shuffle that changes nothing is rotated)."""
    lines = [line for line in text.splitlines() if line.strip()]
    units, joiner = (lines, "\n") if len(lines) >= 3 else (sentences(text), " ")
    if len(units) < 2:
        return None
    order = list(range(len(units)))
    rng.shuffle(order)
    if order == sorted(order):
        order = order[1:] + order[:1]
    return joiner.join(units[i] for i in order)


def _flaw_off_task(text: str, rng: random.Random) -> str | None:
    """Inserted unrelated text: a passage from `OFF_TASK_PASSAGES` in the middle, on a line of
    its own between the middle lines of a multi-line text, else at a middle sentence boundary."""
    passage = rng.choice(OFF_TASK_PASSAGES)
    lines = text.strip().splitlines()
    units, joiner = (lines, "\n") if len(lines) >= 2 else (sentences(text), " ")
    cut = max(1, len(units) // 2)
    return joiner.join(units[:cut] + [passage] + units[cut:])


def _flaw_wrong_answer(text: str, rng: random.Random) -> str | None:
    """Changed numbers: every number gets 1-9 added to its integer part (decimals kept; list
    markers such as "1. " at the start of a line are left alone)."""
    def change(m: re.Match) -> str:
        line_start = text.rfind("\n", 0, m.start()) + 1
        if not text[line_start : m.start()].strip() and text[m.end() : m.end() + 2] in (". ", ") "):
            return m.group(0)  # a list marker ("1. "), not a number of the answer
        return f"{int(m.group(1)) + rng.randint(1, 9)}{m.group(2) or ''}"

    out = _NUMBER.sub(change, text)
    return out if out != text else None


def _flaw_ignored_format(text: str, rng: random.Random) -> str | None:
    """Removed formatting: list markers, headings, quotes, emphasis and code fences dropped and
    every line run into one paragraph. Needs a text that has formatting (else not applicable)."""
    lines = text.splitlines()
    formatted = (any(_FORMAT_LINE.match(line) for line in lines) or "```" in text or "**" in text
                 or sum(bool(line.strip()) for line in lines) >= 3)
    if not formatted:
        return None
    plain = [_FORMAT_LINE.sub("", line).strip() for line in lines if line.strip() and not line.strip().startswith("```")]
    out = " ".join(plain).replace("**", "").replace("__", "")
    return out if out != text else None


def _flaw_inappropriate_certainty(text: str, rng: random.Random) -> str | None:
    """Added overconfident phrases: hedges replaced by certainties ("might" -> "will", "probably"
    -> "certainly", ...), an opening "This is the only correct answer, without any doubt." and
    a closing claim that no expert would dispute it."""
    out = text.strip()
    for pattern, replacement in _HEDGES:
        out = re.sub(pattern, replacement, out)
    joiner = "\n" if "\n" in out else " "
    return joiner.join(["This is the only correct answer, without any doubt.", out,
                        "This is absolutely certain, and no expert would dispute it."])


def _flaw_language_quality(text: str, rng: random.Random) -> str | None:
    """Typos: in about a quarter of the words of 4+ letters (at least one) two inner letters
    are swapped; a few more lose a letter."""
    words = list(_WORD.finditer(text))
    if not words:
        return None
    count = max(1, len(words) // 4)
    chosen = sorted(rng.sample(range(len(words)), min(count, len(words))))
    out, last = [], 0
    for n, index in enumerate(chosen):
        match = words[index]
        word = match.group(0)
        i = rng.randrange(1, len(word) - 2) if len(word) > 3 else 1
        typo = word[:i] + word[i + 1] + word[i] + word[i + 2 :] if n % 3 != 2 else word[:i] + word[i + 1 :]
        if typo == word:  # doubled letters swap to themselves: drop one instead
            typo = word[:i] + word[i + 1 :]
        out += [text[last : match.start()], typo]
        last = match.end()
    return "".join(out) + text[last:]


def _flaw_logical_coherence(text: str, rng: random.Random) -> str | None:
    """A contradiction: the first sentence with an auxiliary verb ("is", "can", ...) is repeated
    at the end with "not" after the verb, introduced by "At the same time,"."""
    for sentence in sentences(text):
        match = _AUXILIARY.search(sentence)
        if match:
            negated = sentence[: match.end()] + " not" + sentence[match.end() :]
            if negated.split(" ", 1)[0] in _LOWER_STARTS:
                negated = negated[0].lower() + negated[1:]
            return text.rstrip() + " At the same time, " + negated
    return None


class RuleDegrader(Degrader):
    """Flaws as documented text transforms; no model needed.

    `TRANSFORMS` maps each kind it imitates to its transform (docstrings say exactly what
    each does). `ORDER` is the order in which a ladder's chosen kinds are applied, so a
    later step never undoes an earlier flaw (a truncation cannot cut away an inserted
    passage, typos land on inserted text too).
    """

    name = "rules"
    TRANSFORMS: ClassVar[dict[str, Callable[[str, random.Random], str | None]]] = {
        "ignored_format": _flaw_ignored_format,
        "incompleteness": _flaw_incompleteness,
        "organisation": _flaw_organisation,
        "wrong_answer": _flaw_wrong_answer,
        "logical_coherence": _flaw_logical_coherence,
        "inappropriate_certainty": _flaw_inappropriate_certainty,
        "off_task": _flaw_off_task,
        "language_quality": _flaw_language_quality,
    }
    ORDER: ClassVar[tuple[str, ...] | None] = tuple(TRANSFORMS)
    kinds = tuple(TRANSFORMS)
    cannot: ClassVar[dict[str, str]] = {
        "factual_accuracy": "needs knowledge of which statements are true; changing numbers is `wrong_answer`",
        "skipped_instructions": "needs to know which instructions the question gave",
        "faulty_reasoning": "needs to follow the argument to break one step of it while keeping it fluent",
    }

    def apply(self, text: str, kind: str, seed: int) -> str | None:
        """One flaw of `kind` added to `text` (None: not applicable to this text)."""
        if kind not in self.TRANSFORMS:
            raise ConfigError(f"the rule-based degrader cannot imitate {kind!r}: {self.cannot.get(kind, 'unknown kind')}")
        out = self.TRANSFORMS[kind](text, random.Random(seed))
        return out if out and out.strip() and out.strip() != text.strip() else None

    def degrade(self, items: Sequence[DegradeItem]) -> list[str | None]:
        return [self.apply(text, kind, seed) for _, text, kind, seed in items]


# --------------------------------------------------------------------------- LLM


class LLMDegrader(Degrader):
    """Flaws written by a model: `generate(conversations, seed=...) -> texts` rewrites the response.

    The prompt (template `degrade`, in the `charter/` folder: $question, $response, $flaw,
    $flaw_description) asks for the same response with one more flaw of the named kind,
    keeping every flaw it already has, and nothing but the rewritten response. A reply
    that is empty or unchanged counts as a failure (None).
    """

    name = "llm"
    kinds = tuple(FLAW_KINDS)
    cannot: Mapping[str, str] = {}

    def __init__(self, generate: Generate, *, template: str | Path = "degrade", model: str = ""):
        from rewards.charter import load_template, template_fields

        self.generate, self.model = generate, model
        self.template = load_template(template)
        missing = {"question", "response", "flaw", "flaw_description"} - template_fields(self.template)
        if missing:
            raise InputError(f"degrader template {template!r} lacks the placeholders {sorted('$' + m for m in missing)}")

    def prompt(self, question: Conversation, text: str, kind: str) -> str:
        return self.template.substitute(question=transcript(question), response=text, flaw=kind.replace("_", " "),
                                        flaw_description=FLAW_KINDS[kind])

    def degrade(self, items: Sequence[DegradeItem]) -> list[str | None]:
        if not items:
            return []
        conversations = [[{"role": "user", "content": self.prompt(q, text, kind)}] for q, text, kind, _ in items]
        replies = self.generate(conversations, seed=[seed for *_, seed in items])
        if len(replies) != len(items):
            raise RuntimeError(f"generate returned {len(replies)} texts for {len(items)} prompts")
        out: list[str | None] = []
        for (_, text, _, _), reply in zip(items, replies):
            reply = _clean_reply(reply)
            out.append(reply if reply and reply != text.strip() else None)
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": self.model}


def _clean_reply(reply: str) -> str:
    """Strip whitespace and a label line such as "Rewritten response:" a model may put first."""
    reply = (reply or "").strip()
    reply = re.sub(r"^(?:rewritten|degraded|new)?\s*response\s*:\s*", "", reply, flags=re.IGNORECASE)
    return reply.strip()


# --------------------------------------------------------------------------- ladders


@dataclass
class Ladder:
    """One prompt's ladder: texts[0] is the good completion, texts[j] carries flaws[:j]."""

    id: str
    conversation: Conversation
    texts: list[str]
    flaws: list[str] = field(default_factory=list)
    language: str | None = None

    @property
    def steps(self) -> int:
        return len(self.texts) - 1

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "language": self.language, "messages": list(self.conversation),
                "texts": self.texts, "flaws": self.flaws}


Start = tuple[str, Conversation, str, str | None]  # (id, conversation, good completion, language)


def build_ladders(
    items: Sequence[tuple[str, Conversation, str, str | None]],
    degrader: Degrader,
    *,
    steps: int = 4,
    kinds: Sequence[str] | None = None,
    seed: int = 0,
) -> tuple[list[Ladder], list[dict[str, Any]]]:
    """Ladders of `steps` flaws for (id, conversation, good completion, language) items.

    Each ladder draws its flaw kinds at random (seeded by `seed` and its id) from `kinds`
    (default: all the degrader can imitate), each kind at most once. A kind that does not
    apply to the current text is replaced by the next one drawn. Every degrader call is
    batched over all ladders. Returns (ladders, skipped): a prompt whose ladder cannot
    reach `steps` flaws is skipped with its reason. New `Ladder` objects; nothing passed in
    is changed.
    """
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    pool = list(kinds) if kinds is not None else list(degrader.kinds)
    unknown = [k for k in pool if k not in FLAW_KINDS]
    if unknown:
        raise ConfigError(f"unknown flaw kinds {unknown}; kinds: {list(FLAW_KINDS)}")
    unable = [k for k in pool if k not in degrader.kinds]
    if unable:
        raise ConfigError(f"the {degrader.name} degrader cannot imitate {unable}: "
                          + "; ".join(f"{k}: {degrader.cannot.get(k, '')}" for k in unable))
    if len(pool) < steps:
        raise ConfigError(f"{steps} steps need {steps} flaw kinds, only {len(pool)} given: {pool}")
    skipped: list[dict[str, Any]] = []
    starts: list[Start] = []
    queues: list[list[str]] = []
    for item_id, conversation, text, language in items:
        if not text or not text.strip():
            skipped.append({"id": item_id, "reason": "empty good completion"})
            continue
        rng = random.Random(f"{seed}:{item_id}")
        queue = pool[:]
        rng.shuffle(queue)
        starts.append((str(item_id), conversation, text, language))
        queues.append(queue)
    if degrader.ORDER:
        built = [_planned(start, queue, steps, degrader, seed, degrader.ORDER) for start, queue in zip(starts, queues)]
        failed = {n: "fewer applicable flaw kinds than steps" for n, (_, flaws) in enumerate(built) if len(flaws) != steps}
    else:
        built, failed = _step_by_step(starts, queues, steps, degrader, seed)
    for n, reason in failed.items():
        skipped.append({"id": starts[n][0], "reason": reason})
    ladders = [Ladder(item_id, conversation, texts, flaws, language)
               for n, ((item_id, conversation, _, language), (texts, flaws)) in enumerate(zip(starts, built))
               if n not in failed]
    return ladders, skipped


def _seed(seed: int, ladder_id: str, step: int) -> int:
    return random.Random(f"{seed}:{ladder_id}:{step}").randrange(2**31)


def _step_by_step(starts: Sequence[Start], queues: list[list[str]], steps: int, degrader: Degrader,
                  seed: int) -> tuple[list[tuple[list[str], list[str]]], dict[int, str]]:
    """Ladders without an application order: each step degrades the previous text with the
    next kind drawn, batched over every ladder still pending; a kind that fails is replaced
    by the next one. Returns (texts, flaws) per start, and the reason of each that failed."""
    built: list[tuple[list[str], list[str]]] = [([text], []) for _, _, text, _ in starts]
    failed: dict[int, str] = {}
    active = list(range(len(starts)))
    for _ in range(steps):
        pending = {n: 0 for n in active}
        while pending:
            batch = list(pending)
            requests = [(starts[n][1], built[n][0][-1], queues[n][0], _seed(seed, starts[n][0], len(built[n][1])))
                        for n in batch]
            for n, out in zip(batch, degrader.degrade(requests)):
                kind = queues[n].pop(0)
                if out is not None:
                    built[n][0].append(out)
                    built[n][1].append(kind)
                    del pending[n]
                elif not queues[n]:
                    failed[n] = f"no flaw kind left that the degrader could apply (last tried {kind})"
                    del pending[n]
        active = [n for n in active if n not in failed]
    return built, failed


def _planned(start: Start, queue: Sequence[str], steps: int, degrader: Degrader, seed: int,
             order: Sequence[str]) -> tuple[list[str], list[str]]:
    """A ladder in the degrader's application order: (texts, flaws).

    Kinds are tried in the ladder's random draw; the chosen set is applied in `order`,
    re-checking applicability as the text changes, and a kind that stops applying is
    swapped for the next one drawn. Fewer than `steps` flaws: no set of kinds applied.
    """
    ladder_id, conversation, text, _ = start
    texts, flaws = [text], []
    chosen: list[str] = []
    candidates = list(queue)
    while len(chosen) < steps and candidates:
        chosen.append(candidates.pop(0))
        sequence = sorted(chosen, key=order.index)
        attempt, ok = [text], True
        for kind in sequence:
            kind_seed = random.Random(f"{seed}:{ladder_id}:{kind}").randrange(2**31)
            out = degrader.degrade([(conversation, attempt[-1], kind, kind_seed)])[0]
            if out is None:
                ok = False
                break
            attempt.append(out)
        if not ok:
            chosen.pop()
            continue
        texts, flaws = attempt, sequence
    return texts, flaws
