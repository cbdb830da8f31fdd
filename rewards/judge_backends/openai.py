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
``$OPENAI_API_KEY``, or from the variable ``api_key_env`` names (credentials in ``base_url``
are sent instead, as the Authorization header); a refused request is a one-line
`ServerError` naming the URL, its status and the server's message. Only the standard
library is used (http.client, json).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import loading
from align.io.http import (
    ServerError,
    api_key_from_env,
    check_choices,
    check_connection,
    endpoint,
    expand_url,
    join_url,
    refused_for_length,
    request_json,
    served_length,
    served_model,
)
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
        smaller of it and the server's (``/models``). `timeout_s` / `max_retries`: per request (the
        deadline of each try, whole), sized for a server many array tasks share; a prompt the
        server refuses with a length code is a skip, any other refusal a `ServerError`."""
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            with loading("tokenizer", tokenizer):
                tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        super().__init__(tokenizer, chat_template_kwargs, max_model_len)
        check_connection(timeout_s, max_retries)
        target = endpoint(expand_url(base_url))
        self.base_url = target.url.rstrip("/")  # never holds credentials: it is printed
        self.url = join_url(self.base_url, "/completions")
        self._authorization = target.authorization  # the URL's credentials, sent instead of a key
        self.model = model
        self.api_key = api_key if api_key is not None or target.authorization else api_key_from_env(api_key_env)
        self.refusals = {}
        self.top_logprobs, self.batch_size = top_logprobs, batch_size
        self.timeout_s, self.max_retries = timeout_s, max_retries

    @property
    def max_model_len(self) -> int | None:
        """The smaller of the recipe's context length and the server's (``/models``, asked once, when a
        prompt is first measured): a longer prompt would be refused, so it is skipped before it is sent."""
        if not self._asked:
            served = self._served_length()
            if served is not None:  # the server's --max-model-len
                self._max_model_len = served if self._max_model_len is None else min(self._max_model_len, served)
            self._asked = True
        return self._max_model_len

    @max_model_len.setter
    def max_model_len(self, value: int | None) -> None:
        self._max_model_len, self._asked = value, False

    def _served_length(self) -> int | None:
        """The server's ``max_model_len`` for this model, when its ``/models`` says it (a server without
        ``/models``, HTTP 404, 405 or 501: the recipe's length alone); a server that is down or refuses the
        key, or a ``/models`` answer of another shape, is a `ServerError` naming the URL."""
        url = join_url(self.base_url, "/models")
        try:
            reply = request_json(url, None, method="GET", api_key=self.api_key, authorization=self._authorization,
                                 timeout_s=self.timeout_s, max_retries=self.max_retries)
        except ServerError as error:
            if error.status not in (404, 405, 501):
                raise
            return None
        return served_length(served_model(reply, self.model, url))

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
            except ServerError as error:
                if refused_for_length(error) is None:
                    raise
                tops = [self._one(prompt, start + i) for i, prompt in enumerate(batch)]  # find the refused ones
            results += [labels_from_top(top, labels) if top is not None else {} for top in tops]
        return results

    def _one(self, prompt: str, index: int) -> dict[str, float] | None:
        """One prompt asked alone; None (and the reason in ``refusals``) when refused for its length."""
        try:
            return self._top_logprobs([prompt])[0]
        except ServerError as error:
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
        tops: list[list[dict[str, float]]] = []
        self._post(body, check=lambda reply: tops.append(self._tops(reply, len(prompts))))
        return tops[-1]

    def _tops(self, reply: dict[str, Any], count: int) -> list[dict[str, float]]:
        """Each choice's first-position {token: logprob}, in prompt order; another shape is a `ServerError`."""
        tops = []
        for index, choice in enumerate(check_choices(reply, count, self.url)):
            try:
                top = choice["logprobs"]["top_logprobs"][0]
            except (KeyError, IndexError, TypeError):
                raise ServerError(f"{self.url}: choice {index} has no logprobs.top_logprobs[0] (does the server "
                                  "support `logprobs` on completions?)") from None
            if not isinstance(top, Mapping) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                       for v in top.values()):
                raise ServerError(f"{self.url}: top_logprobs[0] of choice {index} is not a mapping of tokens to "
                                  "log-probabilities")
            tops.append(dict(top))
        return tops

    def _post(self, body: dict[str, Any], check: Any = None) -> dict[str, Any]:
        """POST JSON (`request_json`: a deadline per try, retries with backoff)."""
        return request_json(self.url, body, api_key=self.api_key, authorization=self._authorization,
                            timeout_s=self.timeout_s, max_retries=self.max_retries, check=check)


def labels_from_top(top: Mapping[str, float], labels: Sequence[str]) -> LabelLogprobs:
    """Sum a top-k {token text: logprob} mapping into label logprobs (variants added up)."""
    by_key = {label_text(label): label for label in labels}
    seen: dict[str, list[float]] = {}
    for token, logprob in top.items():
        label = by_key.get(label_text(token))
        if label is not None:
            seen.setdefault(label, []).append(float(logprob))
    return {label: logsumexp(values) for label, values in seen.items()}
