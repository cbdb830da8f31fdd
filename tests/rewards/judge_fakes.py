"""A judge backend whose label logprobs come from a Python function of the prompt text.

It renders prompts with a real chat tokenizer (so label checks and prefixes behave as in
the real backends) but answers from `answer(prompt_text, labels) -> {label: logprob}`:
a scripted judge for one-order cases, empty completions, and a judge that knows the
ladder order in the validation tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rewards.judge_backends.base import JudgeBackend, LabelLogprobs

Answer = Callable[[str, Sequence[str]], LabelLogprobs]


class ScriptedBackend(JudgeBackend):
    name = "scripted"

    def __init__(self, tokenizer, answer: Answer):
        super().__init__(tokenizer)
        self.answer = answer
        self.prompts: list[str] = []

    def label_logprobs(self, prompts, labels, *, shared_prefix=None):
        self.prompts += list(prompts)
        return [self.answer(p, labels) for p in prompts]


def response_of(prompt_text: str) -> str:
    """The RESPONSE of a pointwise judge prompt (the default template)."""
    return re.search(r"RESPONSE: (.*?)\n\nYour score", prompt_text, re.DOTALL).group(1)


def responses_ab(prompt_text: str) -> tuple[str, str]:
    """RESPONSE A and RESPONSE B of a pairwise judge prompt (the default template)."""
    match = re.search(r"RESPONSE A: (.*?)\n\nRESPONSE B: (.*?)\n\nWhich response", prompt_text, re.DOTALL)
    return match.group(1), match.group(2)
