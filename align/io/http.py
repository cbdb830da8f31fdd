"""One JSON request to an OpenAI-compatible server (the judge backend and the sampler), and
the one rule for the API key every such client sends.

The key comes from the environment, never from a recipe: ``$OPENAI_API_KEY``, or the
variable a recipe names with ``api_key_env`` (its name is recorded, the key never is).
A server that cannot be reached, or refuses the request (HTTP 401/403: no key, or a wrong
one), is a `ServerError`: one line naming the URL, reported by the CLI without a traceback.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from align.errors import ConfigError, ServiceError

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ServerError(ServiceError, OSError):
    """An OpenAI-compatible server that is down, refuses the request or answers other than
    JSON: a `ServiceError` (so a RuntimeError, as it was before) and still an OSError."""


class RequestRefused(ServerError):
    """The server answered HTTP 4xx to this request (``status``, ``detail``): it is refused as it is,
    and sending it again would not help (a prompt over the server's context length, say)."""

    def __init__(self, message: str, status: int, detail: str):
        super().__init__(message)
        self.status, self.detail = status, detail


# Words a vLLM (or other OpenAI-compatible) server uses when a prompt does not fit its context
_LENGTH_WORDS = re.compile(r"context length|max_model_len|maximum (context )?length|too long|prompt length|"
                           r"max_tokens|exceeds", re.IGNORECASE)


def refused_for_length(error: BaseException) -> str | None:
    """The server's reason when ``error`` is a refusal of one request for its length, else None."""
    if isinstance(error, RequestRefused) and error.status == 400 and _LENGTH_WORDS.search(error.detail):
        return error.detail[:300]
    return None


_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")
_URL_SECRET_QUERY = re.compile(
    r"(?P<name>[?&][^=&#]*(?:token|key|password|secret|auth|sig|signature|credential)[^=&#]*=)[^&#]*",
    re.IGNORECASE)


def safe_url(text: str) -> str:
    """``text`` with the credentials a URL can carry cut out (user:password@, signed or keyed query values):
    what may be printed in an error, a log line or a manifest."""
    text = _URL_USERINFO.sub(r"\g<scheme>", text)
    return _URL_SECRET_QUERY.sub(r"\g<name>", text)


def join_url(base: str, path: str) -> str:
    """``base`` + ``path``, the path inserted before a query string (``http://h/v1?x=1`` + ``/models``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def check_api_key_env(api_key_env: str | None) -> None:
    """``api_key_env`` must name an environment variable (checked when a recipe loads)."""
    if api_key_env is not None and not _ENV_NAME.match(api_key_env):
        # never echo the value: it may be the key itself, put where its variable's name belongs
        raise ConfigError("api_key_env: must be the name of an environment variable (letters, digits and _) "
                          "that holds the API key, not the key itself")


def api_key_from_env(api_key_env: str | None = None) -> str | None:
    """The API key to send: from the variable ``api_key_env`` names (which must then be
    set), else from ``$OPENAI_API_KEY`` when set, else None (no Authorization header)."""
    if not api_key_env:
        return os.environ.get(DEFAULT_API_KEY_ENV) or None
    check_api_key_env(api_key_env)
    key = os.environ.get(api_key_env)
    if not key:
        raise ConfigError(f"api_key_env={api_key_env!r}: the environment variable ${api_key_env} is not set "
                          "(the API key is read from it)")
    return key


def request_json(url: str, body: Mapping[str, Any] | None = None, *, method: str = "POST", api_key: str | None = None,
                 timeout_s: float = 600.0, max_retries: int = 3) -> dict[str, Any]:
    """One JSON request to an OpenAI-compatible server, retrying connection errors and 5xx
    answers with a short backoff; anything else is a `ServerError` naming the URL."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    shown = safe_url(url)  # never print credentials a URL carries
    for attempt in range(max_retries + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read().decode(errors="replace")
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, RecursionError):
                raise ServerError(f"{shown}: answer is not JSON: {raw[:200]!r}") from None
        except urllib.error.HTTPError as error:
            detail = " ".join(error.read().decode(errors="replace")[:300].split())
            if error.code in (401, 403):
                hint = ("the API key sent was refused" if api_key else "no API key was sent") + (
                    f": set ${DEFAULT_API_KEY_ENV}, or name the variable that holds the key with api_key_env")
                raise ServerError(f"{shown}: HTTP {error.code}: {detail}; {hint}") from None
            busy = error.code in (408, 429)  # a shared server that is busy: asked again, later
            if not busy and error.code < 500:
                raise RequestRefused(f"{shown}: HTTP {error.code}: {detail}", error.code, detail) from None
            if attempt == max_retries:
                raise ServerError(f"{shown}: HTTP {error.code} after {attempt + 1} tries: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            if attempt == max_retries:
                reason = getattr(error, "reason", error)
                raise ServerError(f"{shown}: request failed after {attempt + 1} tries (timeout {timeout_s:g} s "
                                  f"each): {reason}") from None
        time.sleep(min(60.0, 0.5 * 2**attempt))
    raise AssertionError("unreachable")
