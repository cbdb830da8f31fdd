"""Judge backend on any OpenAI-compatible `completions` endpoint (e.g. `vllm serve`).

One POST to `{base_url}/completions` per batch of prompts, with `max_tokens=1`,
`temperature=0` and `logprobs=20`; each choice's `logprobs.top_logprobs[0]` maps token
strings to logprobs. A label's logprob sums every top token whose text is the label once
whitespace and SentencePiece markers are stripped ("9", " 9", "▁9"), as the local backends
sum every token id that decodes to it. Top tokens that spell no label are ignored.

Prompts are rendered locally with the judge's chat template (pass its tokenizer), and a
leading BOS is removed from the text: the server tokenizes with its special tokens and
adds the BOS itself, so the model sees one BOS, as with the other backends.
The API key is the one every OpenAI-compatible client sends (`align.io.http`): from
``$OPENAI_API_KEY``, or from the variable ``api_key_env`` names; a refused request is a
one-line `ServerError` naming the URL. Only the standard library is used (urllib, json).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import ServiceError, loading
from align.io.http import api_key_from_env, join_url, refused_for_length, request_json, safe_url
from rewards.judge_backends.base import JudgeBackend, LabelLogprobs, label_text, logsumexp


class OpenAIJudgeBackend(JudgeBackend):
    """Label logprobs from an OpenAI-compatible completions server."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        api_key: str | None = None,
        api_key_env: str | None = None,
        top_logprobs: int = 20,
        batch_size: int = 32,
        timeout_s: float = 1800.0,
        max_retries: int = 5,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_model_len: int | None = None,
    ):
        """`tokenizer`: the served model's tokenizer (object or path), for its chat template.
        `api_key`: sent as a bearer token; default from the environment (`api_key_env`, else
        ``$OPENAI_API_KEY``). `max_model_len`: the recipe's context length; the one used is the
        smaller of it and the server's (``/models``). `timeout_s` / `max_retries`: per request,
        sized for a server many array tasks share; a prompt refused for its length is a skip."""
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            with loading("tokenizer", tokenizer):
                tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        super().__init__(tokenizer, chat_template_kwargs, max_model_len)
        self.base_url = base_url.rstrip("/")
        self.url = join_url(self.base_url, "/completions")
        self.model, self.api_key = model, api_key if api_key is not None else api_key_from_env(api_key_env)
        self.refusals = {}
        self.top_logprobs, self.batch_size = top_logprobs, batch_size
        self.timeout_s, self.max_retries = timeout_s, max_retries
        served = self._served_length()
        if served is not None:  # the server's --max-model-len: a longer prompt would be refused
            self.max_model_len = served if self.max_model_len is None else min(self.max_model_len, served)

    def _served_length(self) -> int | None:
        """The server's ``max_model_len`` for this model, when its ``/models`` says it."""
        try:
            reply = request_json(join_url(self.base_url, "/models"), None, method="GET", api_key=self.api_key,
                                 timeout_s=min(self.timeout_s, 60.0), max_retries=0)
        except ServiceError:
            return None  # a server without /models: the recipe's length alone
        for entry in reply.get("data") or []:
            if isinstance(entry, dict) and entry.get("id") == self.model:
                length = entry.get("max_model_len")
                return length if isinstance(length, int) and not isinstance(length, bool) and length > 1 else None
        return None

    def describe(self) -> dict[str, Any]:
        # not the URL: a resumed job may reach the same model at another address
        return {"backend": self.name, "model": self.model, "top_logprobs": self.top_logprobs}

    def label_logprobs(
        self, prompts: Sequence[str], labels: Sequence[str], *, shared_prefix: str | None = None
    ) -> list[LabelLogprobs]:
        results: list[LabelLogprobs] = []
        self.refusals = {}
        for start in range(0, len(prompts), self.batch_size):
            batch = [self._strip_bos(p) for p in prompts[start : start + self.batch_size]]
            try:
                tops: list[dict[str, float] | None] = list(self._top_logprobs(batch))
            except ServiceError as error:
                if refused_for_length(error) is None:
                    raise
                tops = [self._one(prompt, start + i) for i, prompt in enumerate(batch)]  # find the refused ones
            results += [labels_from_top(top, labels) if top is not None else {} for top in tops]
        return results

    def _one(self, prompt: str, index: int) -> dict[str, float] | None:
        """One prompt asked alone; None (and the reason in ``refusals``) when refused for its length."""
        try:
            return self._top_logprobs([prompt])[0]
        except ServiceError as error:
            reason = refused_for_length(error)
            if reason is None:
                raise
            self.refusals[index] = f"the server refused the prompt as too long: {reason}"
            return None

    def _strip_bos(self, text: str) -> str:
        bos = getattr(self.tokenizer, "bos_token", None)
        return text[len(bos) :] if bos and text.startswith(bos) else text

    def _top_logprobs(self, prompts: list[str]) -> list[dict[str, float]]:
        """The first position's top-k {token: logprob} for each prompt, in prompt order."""
        body = {
            "model": self.model,
            "prompt": prompts,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": self.top_logprobs,
        }
        reply = self._post(body)
        choices = reply.get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts):
            got = len(choices) if isinstance(choices, list) else choices
            raise ServiceError(f"{safe_url(self.url)}: expected {len(prompts)} choices, got {got!r:.200}")
        ordered = sorted(choices, key=lambda c: c.get("index", 0))
        tops = []
        for choice in ordered:
            try:
                top = choice["logprobs"]["top_logprobs"][0]
            except (KeyError, IndexError, TypeError):
                raise ServiceError(
                    f"{safe_url(self.url)}: choice {choice.get('index')} has no logprobs.top_logprobs[0] "
                    "(does the server support `logprobs` on completions?)"
                ) from None
            if not isinstance(top, Mapping):
                raise ServiceError(f"{safe_url(self.url)}: top_logprobs[0] of choice {choice.get('index')} is not a mapping")
            tops.append(dict(top))
        return tops

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST JSON, retrying connection errors and 5xx answers with a short backoff."""
        return request_json(self.url, body, api_key=self.api_key, timeout_s=self.timeout_s,
                            max_retries=self.max_retries)


def labels_from_top(top: Mapping[str, float], labels: Sequence[str]) -> LabelLogprobs:
    """Sum a top-k {token text: logprob} mapping into label logprobs (variants added up)."""
    by_key = {label_text(label): label for label in labels}
    seen: dict[str, list[float]] = {}
    for token, logprob in top.items():
        label = by_key.get(label_text(token))
        if label is not None:
            seen.setdefault(label, []).append(float(logprob))
    return {label: logsumexp(values) for label, values in seen.items()}
