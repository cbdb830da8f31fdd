"""Sampling through an OpenAI-compatible server (``vllm serve``): the cluster set-up where
inference nodes serve the policy and sampling jobs are clients.

Prompts are rendered and tokenized here, by the same `PromptEncoder` as the local
backends, and sent to ``{base_url}/completions`` as token ids, so the server neither
re-renders them nor adds a second BOS. Each conversation is one request (``n`` samples,
its own seed from `stream_seed`, the encoder's stop ids as ``stop_token_ids``); requests
go out concurrently so the server batches them. The generated ids come back with
``return_token_ids`` and become `Completion`s exactly as in the vLLM backend, so records
sampled through a server and in process are interchangeable (and, with the same seeds,
equal). ``stop_token_ids``, ``return_token_ids``, ``skip_special_tokens`` and token-id
prompts are vLLM's extensions of the OpenAI API. Only the standard library is used.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from align.errors import ServiceError, loading
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
from align.sampling.base import (
    Completion,
    Conversation,
    PromptEncoder,
    Sampler,
    engine_completion,
    stream_seed,
)


class OpenAISampler(Sampler):
    """Sample from a model served by an OpenAI-compatible (vLLM) server.

    Args:
        base_url: the server's API root, e.g. ``http://node17:8000/v1``.
        model: the served model name (``--served-model-name``, else the path it was
            started with).
        tokenizer: the served model's tokenizer (object or path), to render prompts.
        chat_format / chat_date / enable_thinking / stop_tokens: as for `VLLMSampler`.
        api_key: sent as a bearer token (``vllm serve --api-key``); default from the
            environment: the variable ``api_key_env`` names, else ``$OPENAI_API_KEY``.
            Credentials in ``base_url`` (``user:password@``, ``?api_key=``) are sent instead,
            as the Authorization header, and never shown (`align.io.http.endpoint`).
        max_model_len: the recipe's context length; the one used is the smaller of it and the
            server's (asked from ``/models``), so a prompt the server would refuse is skipped here.
        concurrency: requests in flight at once.
        timeout_s / max_retries: ``timeout_s`` bounds each request whole; connection errors,
            requests past it, answers cut short or aborted, 5xx, 408 and 429 answers are retried
            with backoff. A prompt the server refuses with a length code is recorded in
            ``refusals`` (no completions); any other refusal is a `ServerError`.
    """

    backend = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        chat_format: str = "apertus",
        chat_date: _dt.date | str | None = None,
        enable_thinking: bool = False,
        stop_tokens: Sequence[str] | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        max_model_len: int | None = None,
        concurrency: int = 16,
        timeout_s: float = 1800.0,
        max_retries: int = 5,
        model_name: str | None = None,
    ):
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            with loading("tokenizer", tokenizer):
                tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        check_connection(timeout_s, max_retries)
        target = endpoint(expand_url(base_url))
        self.base_url = target.url.rstrip("/")  # never holds credentials: it is printed
        self.refusals = {}
        self.model = model
        self._authorization = target.authorization  # the URL's credentials, sent instead of a key
        self.api_key = api_key if api_key is not None or target.authorization else api_key_from_env(api_key_env)
        self.model_name = model_name or model
        self.tokenizer = tokenizer
        self.encoder = PromptEncoder(tokenizer, chat_format, chat_date=chat_date, enable_thinking=enable_thinking,
                                     stop_tokens=stop_tokens)
        self.concurrency, self.timeout_s, self.max_retries = max(1, concurrency), timeout_s, max_retries
        self._max_model_len = max_model_len
        self._context: int | None = None
        self._served: int | None = None

    @property
    def max_model_len(self) -> int:
        """The smaller of the recipe's context length and the server's (a prompt over either is skipped)."""
        if self._context is None:
            served = self._served_length()
            limits = [n for n in (self._max_model_len, served) if n is not None]
            if not limits:
                raise ServiceError(f"{self.base_url}/models does not say the context length of "
                                   f"{self.model!r}: set max_model_len")
            self._context = min(limits)
            self._served = served
        return self._context

    @property
    def context_source(self) -> str:
        """Where the context length comes from, for a message about it."""
        context = self.max_model_len
        if self._served == context:
            return f"the server's max_model_len ({self.base_url}/models)"
        return "max_model_len in the recipe"

    def _served_length(self) -> int | None:
        """The server's ``max_model_len`` for this model (None when it does not say)."""
        reply = self._request("GET", "/models")
        served = served_model(reply, self.model, join_url(self.base_url, "/models"))
        if served is None:
            names = [m["id"] for m in reply["data"]]
            raise ServerError(f"{self.base_url}: model {self.model!r} is not served here (served: {names[:20]})")
        return served_length(served)

    def sample(
        self,
        conversations: Sequence[Conversation],
        n: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 4096,
        seed: int | Sequence[int] = 0,
        tools: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[list[Completion]]:
        prompts, budgets, seeds = self._prepare(conversations, n, temperature, top_p, max_tokens, seed, tools)
        bodies = [
            {"model": self.model, "prompt": ids, "n": n, "temperature": temperature, "top_p": top_p,
             "max_tokens": budget, "seed": stream_seed(s, ids), "stop_token_ids": self.encoder.stop_ids,
             "skip_special_tokens": False, "return_token_ids": True}
            for ids, s, budget in zip(prompts, seeds, budgets)
        ]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(bodies)))) as pool:
            replies = list(pool.map(self._complete, bodies))
        self.refusals = {i: reply for i, reply in enumerate(replies) if isinstance(reply, str)}
        results = []
        for reply, conv_seed in zip(replies, seeds):
            if isinstance(reply, str):  # refused for its length: no completions, recorded as a skip
                results.append([])
                continue
            record_params = self.params(temperature, top_p, max_tokens, conv_seed)
            results.append([self._completion(choice, record_params) for choice in reply])
        return results

    def _complete(self, body: dict[str, Any]) -> list[dict[str, Any]] | str:
        """The server's ``n`` choices in index order, or the reason it refused this prompt for its length."""
        url = join_url(self.base_url, "/completions")
        choices: list[list[dict[str, Any]]] = []
        try:
            self._request("POST", "/completions", body,
                          check=lambda reply: choices.append(check_choices(reply, body["n"], url)))
        except ServerError as error:
            reason = refused_for_length(error)
            if reason is None:
                raise
            return f"the server refused the prompt ({len(body['prompt'])} tokens) as too long: {reason}"
        return choices[-1]

    def _completion(self, choice: dict[str, Any], params: dict[str, Any]) -> Completion:
        url = f"{self.base_url}/completions"
        ids = choice.get("token_ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                 for i in ids):
            raise ServerError(f"{url}: a choice has no list of token_ids (a vLLM server with `return_token_ids` "
                              "support is needed)")
        try:
            return engine_completion(self.encoder, ids, choice.get("finish_reason"), self.model_name, params,
                                     engine="the server")
        except RuntimeError as error:  # the server's finish_reason and its ids disagree: its answer is unusable
            raise ServerError(f"{url}: {error}") from None

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                 check: Any = None) -> dict[str, Any]:
        """One JSON request (`request_json`: a deadline per try, retries with backoff)."""
        return request_json(join_url(self.base_url, path), body, method=method, api_key=self.api_key,
                            authorization=self._authorization, timeout_s=self.timeout_s, max_retries=self.max_retries, check=check)
