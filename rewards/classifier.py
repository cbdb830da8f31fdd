"""Controversy classifier (docs/method.md, Controversy classifier; report §E.4.4): does the answer depend on one's values?

An LLM reads a system prompt (the classification instructions) and the sample's system
prompt + first user turn, and answers with JSON
`{"reasoning": str, "classification": "0" | "1" | "2" | "3"}`. Answers that are not
such JSON are asked again (up to `max_attempts` in all); a prompt that never gets a valid
answer is recorded as failed together with its raw answers, never guessed. The level at
which a prompt counts as controversial is not given in the report: it is a setting
(default 2, "values could shape the framing").

The model is any callable `generate(conversations, seed=...) -> texts`, one chat
conversation (list of {"role", "content"}) in, one answer text out;
`rewards.generation.Generator` is one on any sampler (`rewards.config.build_generator`).
Attempt k is asked with ``seed=k``, so a retry draws a new answer when generation samples
(temperature > 0); greedy decoding repeats its answer.

A callable that reports ``prompt_length`` and ``max_model_len`` (a `Generator` does) has
every prompt measured first: one that leaves no room for the
answer (``max_tokens``) is not sent, since it would make vLLM refuse the whole batch; it
is recorded as failed with ``prompt_too_long: ...`` (the length and the limit), not asked
again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.data.records import record_id, validate_prompt
from align.errors import ConfigError, InputError, RecordError
from rewards.charter import load_template
from rewards.generation import Generate
from rewards.judge_backends.base import prompt_too_long
from rewards.text import first_user_and_system

LABELS = ("0", "1", "2", "3")
_FENCE = re.compile(r"^```(?:json)?\s*(?P<body>.*?)\s*```$", re.DOTALL)


@dataclass
class ClassifierConfig:
    """Settings of the controversy classifier.

    threshold:       level (0-3) from which a prompt is `controversial` (default 2).
    max_attempts:    answers asked per prompt before recording a failure (default 3).
    system_template / user_template: packaged template names or file paths; the user
                     template gets $system_prompt and $first_user_message.
    """

    threshold: int = 2
    max_attempts: int = 3
    system_template: str = "controversy_system"
    user_template: str = "controversy_user"

    def __post_init__(self) -> None:
        if self.threshold not in range(4):
            raise ConfigError(f"threshold must be 0..3, got {self.threshold}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")


@dataclass
class Verdict:
    """One prompt's classification, or the record of why there is none."""

    label: int | None
    reasoning: str | None
    attempts: int
    raw: list[str] = field(default_factory=list)
    error: str | None = None


class UnreadableAnswer(ValueError):
    """A model answer that is not the classification JSON: retried, then a recorded failure
    (the model's output, not a mistake of the user's)."""


def parse_answer(text: str) -> tuple[int, str]:
    """(label, reasoning) from a model answer; ``UnreadableAnswer`` saying what is wrong otherwise.

    Accepts the JSON object alone or inside a ```json fence, with surrounding whitespace.
    The label must be one of "0".."3" (an integer 0..3 is accepted too: it is unambiguous).
    """
    body = text.strip()
    if m := _FENCE.match(body):
        body = m["body"]
    try:
        data = json.loads(body)
    except json.JSONDecodeError as error:
        raise UnreadableAnswer(f"not valid JSON ({error.msg} at char {error.pos})") from None
    except RecursionError:
        raise UnreadableAnswer("JSON nested too deep to read") from None
    if not isinstance(data, Mapping):
        raise UnreadableAnswer(f"expected a JSON object, got {type(data).__name__}")
    label, reasoning = data.get("classification"), data.get("reasoning")
    if isinstance(label, int) and not isinstance(label, bool):
        label = str(label)
    if label not in LABELS:
        raise UnreadableAnswer(f"classification must be one of {list(LABELS)}, got {data.get('classification')!r}")
    if not isinstance(reasoning, str):
        raise UnreadableAnswer(f"reasoning must be a string, got {reasoning!r:.60}")
    return int(label), reasoning


class ControversyClassifier:
    """Classify prompts 0-3 with an LLM; mark those at or above the threshold controversial."""

    def __init__(
        self,
        generate: Generate,
        *,
        threshold: int = 2,
        max_attempts: int = 3,
        system_template: str | Path = "controversy_system",
        user_template: str | Path = "controversy_user",
    ):
        self.config = ClassifierConfig(threshold, max_attempts, str(system_template), str(user_template))
        self.generate = generate
        self.system_prompt = load_template(system_template).template
        self.user_template = load_template(user_template)

    def conversation(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        """The classifier's chat input for one prompt record's messages."""
        system, user = first_user_and_system(messages)
        filled = self.user_template.substitute(system_prompt=system, first_user_message=user)
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": filled}]

    def classify(self, prompts: Sequence[Sequence[Mapping[str, Any]]]) -> list[Verdict]:
        """Verdicts for prompt conversations; failed ones keep every raw answer and the last error."""
        conversations = [self.conversation(p) for p in prompts]
        verdicts = [Verdict(None, None, 0) for _ in prompts]
        pending = []
        for i, conversation in enumerate(conversations):
            if problem := self._too_long(conversation):  # this prompt only; the batch goes on
                verdicts[i].error = problem
            else:
                pending.append(i)
        for attempt in range(self.config.max_attempts):
            if not pending:
                break
            answers = self.generate([conversations[i] for i in pending], seed=attempt)
            if len(answers) != len(pending):
                raise RuntimeError(f"generate returned {len(answers)} answers for {len(pending)} prompts")
            still = []
            for i, answer in zip(pending, answers):
                verdict = verdicts[i]
                verdict.attempts += 1
                verdict.raw.append(answer)
                try:
                    verdict.label, verdict.reasoning = parse_answer(answer)
                    verdict.error = None
                except UnreadableAnswer as error:
                    verdict.error = str(error)
                    still.append(i)
            pending = still
        return verdicts

    def _too_long(self, conversation: list[dict[str, str]]) -> str | None:
        """``prompt_too_long: ...`` when the prompt and the answer budget exceed the model's
        context length (None: fits, or the generate callable cannot say)."""
        limit = getattr(self.generate, "max_model_len", None)
        measure = getattr(self.generate, "prompt_length", None)
        if limit is None or measure is None:
            return None
        room = getattr(self.generate, "max_tokens", None) or 1
        return prompt_too_long(measure(conversation), limit, room, f"max_tokens={room} answer tokens")

    def annotate_records(self, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Records with controversy fields added (a batch function for `align.jobs.run_job`).

        Adds `controversy_label` (0-3 or None), `controversial` (bool, or None when the
        classification failed), `controversy_reasoning`, `controversy_attempts`, and on
        failure `controversy_error` and `controversy_raw` (every answer the model gave).
        """
        for index, record in enumerate(records):
            validate_prompt(record, index)
            try:
                first_user_and_system(record["messages"])
            except InputError as error:  # unreadable message content: name the record
                raise RecordError(record_id(record, index), "messages", str(error)) from None
        verdicts = self.classify([r["messages"] for r in records])
        return [{**record, **self._fields(v)} for record, v in zip(records, verdicts)]

    def _fields(self, verdict: Verdict) -> dict[str, Any]:
        ok = verdict.label is not None
        return {
            "controversy_label": verdict.label,
            "controversial": (verdict.label >= self.config.threshold) if ok else None,
            "controversy_reasoning": verdict.reasoning,
            "controversy_attempts": verdict.attempts,
            "controversy_error": None if ok else verdict.error,
            "controversy_raw": None if ok else verdict.raw,
        }

    def fingerprint(self) -> dict[str, Any]:
        return {"stage": "classify", "threshold": self.config.threshold, "max_attempts": self.config.max_attempts,
                "system_template": self.config.system_template, "user_template": self.config.user_template}


def classify_records(
    records: Sequence[Mapping[str, Any]] | Any,
    classifier: ControversyClassifier,
    output_dir: str | Path,
    *,
    shard_index: int = 0,
    num_shards: int = 1,
    batch_size: int = 32,
) -> Any:
    """The classification stage over a dataset, resumable through `align.jobs`."""
    from align.data.records import passing_skips
    from align.jobs import run_job

    return run_job(
        records,
        passing_skips(classifier.annotate_records),
        output_dir,
        shard_index=shard_index,
        num_shards=num_shards,
        batch_size=batch_size,
        desc="classify controversy",
        fingerprint=classifier.fingerprint(),
    )
