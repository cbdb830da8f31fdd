"""One JSON request to an OpenAI-compatible server (the judge backend and the sampler), and
the rules every such client follows: the API key, the URL's credentials, the connection
settings, and what an answer means.

- **The key** comes from the environment, never from a recipe: ``$OPENAI_API_KEY``, or the
  variable a recipe names with ``api_key_env`` (its name is recorded, the key never is).
  Credentials written into ``base_url`` (``user:password@``, ``?api_key=...``) are taken out
  of the URL and sent as the ``Authorization`` header (Basic, Bearer); no error, log line or
  manifest shows them (`safe_url`).
- **A deadline per request**: ``timeout_s`` bounds the whole request, connecting, sending
  and reading the whole answer, not each socket read, so a server that drips one byte a
  second cannot hold a job.
- **Retried** (``max_retries`` times, with backoff): a server that cannot be reached, a
  request past its deadline, an answer cut short (shorter than its Content-Length, or the
  connection closed mid-answer), HTTP 408, 429 and 5xx (not 501, Not Implemented), and an
  answer a check calls transient (`RetryableAnswer`: a completion the server aborted).
- **Classified by the HTTP status and the server's structured error body**, never by words
  in its message: 401/403 is a refused key; any other 4xx is a refusal of this request
  (`ServerError` with ``status`` and the error's ``code``). A prompt is refused for its
  length only when the error's ``code`` says so (``context_length_exceeded``, OpenAI's
  code); vLLM's 400 for a prompt over its ``max_model_len`` carries no such code, which is
  why the clients count each prompt's tokens against the server's ``max_model_len`` (from
  ``/models``) and skip a prompt that does not fit before sending it.
- **Answers are JSON objects**; anything else is a `ServerError` naming the URL.

Every error is a `ServerError`: one line naming the URL (without credentials), the HTTP
status and the server's message, reported by the CLI without a traceback.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from align.errors import ConfigError, ServiceError
from align.io.files import expand_variables

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Bounds of the connection settings, checked when a recipe loads: a week is longer than any
# request needs and far inside what sockets and timers accept (a larger timeout overflows them).
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_RETRIES = 100
MAX_CONCURRENCY = 1024

# The error code by which a server says a prompt does not fit its context (OpenAI's).
LENGTH_CODES = frozenset({"context_length_exceeded"})


class ServerError(ServiceError, OSError):
    """An OpenAI-compatible server that is down, refuses the request or answers something
    unusable: a `ServiceError` (so a RuntimeError, as it was before) and still an OSError.
    ``status``: the HTTP status of a refusal (None otherwise); ``code``: its error's code."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RetryableAnswer(Exception):
    """Raised by a ``check`` of `request_json`: the answer is one a retry may mend (a completion
    the server aborted); the message says what was wrong."""


# --------------------------------------------------------------------------- settings


def check_connection(timeout_s: Any, max_retries: Any, concurrency: Any = 1, *, prefix: str = "") -> None:
    """The connection settings of a client, checked when a recipe loads (``ConfigError`` naming the key)."""
    number = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
    if not number or not math.isfinite(timeout_s) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ConfigError(f"{prefix}timeout_s: must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] (a week), "
                          f"got {format(timeout_s, 'g') if number else repr(timeout_s)}")
    _check_count(f"{prefix}max_retries", max_retries, 0, MAX_RETRIES)
    _check_count(f"{prefix}concurrency", concurrency, 1, MAX_CONCURRENCY)


def _check_count(key: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: must be an integer in [{low}, {high}], got {value!r}")


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


# --------------------------------------------------------------------------- URLs

_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")
_URL_SECRET_QUERY = re.compile(
    r"(?P<name>[?&][^=&#]*(?:token|key|password|secret|auth|sig|signature|credential)[^=&#]*=)[^&#]*",
    re.IGNORECASE)
# Query parameters that hold an API key: sent as a bearer token instead, never in the URL.
_KEY_PARAMS = frozenset({"api_key", "api-key", "apikey", "key", "access_token", "token"})


def safe_url(text: str) -> str:
    """``text`` with the credentials a URL can carry cut out (user:password@, signed or keyed query values):
    what may be printed in an error, a log line or a manifest."""
    text = _URL_USERINFO.sub(r"\g<scheme>", text)
    return _URL_SECRET_QUERY.sub(r"\g<name>", text)


def has_credentials(url: str) -> bool:
    """Whether ``url`` carries credentials (what `safe_url` would cut out)."""
    return safe_url(url) != url


def expand_url(url: str, key: str = "base_url") -> str:
    """``$VAR`` / ``${VAR}`` in a URL replaced by the environment's value, as in paths; an unset one is a
    ``ConfigError`` naming the key (never a request to a host literally named ``$VLLM_URL``)."""
    return expand_variables(url, named=f"{key}={safe_url(url)!r}", what="URL")


@dataclass(frozen=True)
class Endpoint:
    """A server's URL as requests use it: ``url`` without credentials, and the ``Authorization``
    header the URL's credentials make (None: the URL carries none)."""

    url: str
    authorization: str | None = None


def endpoint(url: str, key: str = "base_url") -> Endpoint:
    """``url`` with its credentials taken out: ``user:password@`` becomes Basic authorization, a key in the
    query (``?api_key=...``) a bearer token; both at once is a ``ConfigError`` (one key per server)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:  # a port out of range or not a number, a bracket left open
        raise ConfigError(f"{key}={safe_url(url)!r}: not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}={safe_url(url)!r}: not an http(s) URL with a host (http://host:8000/v1)")
    query = parse_qsl(parts.query, keep_blank_values=True)
    keys = [value for name, value in query if name.lower() in _KEY_PARAMS]
    basic = None
    if parts.username is not None or parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        basic = "Basic " + base64.b64encode(pair.encode()).decode()
    if len(keys) + (basic is not None) > 1:
        raise ConfigError(f"{key}={safe_url(url)!r}: carries more than one credential (user:password@ and a key "
                          "in the query, or two keys): keep one")
    netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc += f":{port}" if port is not None else ""
    rest = urlencode([(name, value) for name, value in query if name.lower() not in _KEY_PARAMS])
    clean = urlunsplit((parts.scheme, netloc, parts.path, rest, parts.fragment))
    return Endpoint(clean, basic or (f"Bearer {keys[0]}" if keys else None))


def check_base_url(base_url: str, api_key_env: str | None, prefix: str = "") -> str:
    """A recipe's ``base_url`` with ``$VAR`` expanded, checked when the recipe loads: an http(s) URL with a
    host, at most one credential in it, and not both a credential in it and ``api_key_env`` (two keys)."""
    url = expand_url(base_url, f"{prefix}base_url")
    target = endpoint(url, f"{prefix}base_url")
    if target.authorization and api_key_env:
        raise ConfigError(f"{prefix}base_url={safe_url(url)!r} carries credentials and {prefix}api_key_env names "
                          f"${api_key_env}: keep one (api_key_env, so that no key is in the recipe)")
    return url


def join_url(base: str, path: str) -> str:
    """``base`` + ``path``, the path inserted before a query string (``http://h/v1?x=1`` + ``/models``)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


# --------------------------------------------------------------------------- one request


class _Transient(Exception):
    """A failure a retry may mend; ``what`` and ``how`` make the final message."""

    def __init__(self, what: str, how: str):
        super().__init__(what)
        self.what, self.how = what, how


class _Deadline:
    """Shuts a request's socket when ``seconds`` have passed, so that no read or write of the request
    outlives its deadline: a blocked read then returns at once and the request fails as timed out."""

    def __init__(self, seconds: float):
        self.passed, self._sock = False, None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket | None) -> None:
        """The connected socket (the answer is read through it after its connection lets it go)."""
        with self._lock:
            self._sock = sock
            if self.passed:
                self._shut()

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self._timer.cancel()


def _exchange(url: str, method: str, data: bytes | None, headers: Mapping[str, str],
              timeout_s: float) -> tuple[int, bytes]:
    """One HTTP exchange within ``timeout_s`` in all: (status, the whole body). A failure a retry may mend
    (unreachable, past the deadline, cut short) is a `_Transient`."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout_s, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = _Deadline(timeout_s)
    try:
        connection.connect()
        deadline.watch(connection.sock)
        connection.request(method, target, body=data, headers=dict(headers))
        response = connection.getresponse()
        return response.status, response.read()
    except http.client.IncompleteRead as error:
        if deadline.passed:
            raise _timed_out(timeout_s) from None
        raise _Transient("the answer was cut short", f" ({len(error.partial)} bytes of "
                         f"{len(error.partial) + (error.expected or 0)})") from None
    except (OSError, http.client.HTTPException) as error:
        if deadline.passed:
            raise _timed_out(timeout_s) from None
        reason = getattr(error, "reason", None) or str(error) or type(error).__name__
        raise _Transient("request failed", f" (timeout {timeout_s:g} s each): {reason}") from None
    finally:
        deadline.cancel()
        connection.close()


def _timed_out(timeout_s: float) -> _Transient:
    return _Transient("request failed", f" (timeout {timeout_s:g} s each): no whole answer within {timeout_s:g} s")


@dataclass(frozen=True)
class ErrorBody:
    """What a server's error answer says: ``{"error": {"message", "type", "code", "param"}}`` (OpenAI, vLLM),
    ``{"object": "error", "message", "type", "code"}`` (older vLLM), ``{"detail": ...}``, or plain text."""

    message: str
    type: str | None = None
    code: str | None = None


def error_body(raw: bytes) -> ErrorBody:
    """The server's error, from the structured body when there is one, else its text (one line, 300 characters)."""
    text = raw.decode(errors="replace")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return ErrorBody(_one_line(text))
    error = data.get("error") if isinstance(data, dict) else None
    fields = error if isinstance(error, dict) else data if isinstance(data, dict) else {}
    message = fields.get("message", error if isinstance(error, str) else fields.get("detail", text))
    code = fields.get("code")
    kind = fields.get("type")
    return ErrorBody(_one_line(message if isinstance(message, str) else json.dumps(message)),
                     kind if isinstance(kind, str) else None, code if isinstance(code, str) else None)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


def _reply(shown: str, status: int, raw: bytes, sent: str) -> dict[str, Any]:
    """The JSON object of a 2xx answer; a refusal or an unusable answer is a `ServerError`, a busy or failing
    server a `_Transient`. ``sent``: what authorization was sent, for the hint of a 401/403."""
    if 200 <= status < 300:
        return _json_object(shown, raw)
    error = error_body(raw)
    said = f"HTTP {status}{f' {error.type}' if error.type else ''}: {error.message}"
    if status in (401, 403):
        hint = f"{sent}: set ${DEFAULT_API_KEY_ENV}, or name the variable that holds the key with api_key_env"
        raise ServerError(f"{shown}: {said}; {hint}", status=status, code=error.code)
    if status in (408, 429) or (status >= 500 and status != 501):  # busy or failing: asked again, later
        raise _Transient(f"HTTP {status}", f": {error.message}")
    raise ServerError(f"{shown}: {said}", status=status, code=error.code)


def _json_object(shown: str, raw: bytes) -> dict[str, Any]:
    text = raw.decode(errors="replace")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ServerError(f"{shown}: answer is not JSON: {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise ServerError(f"{shown}: answer is a JSON {type(data).__name__}, not an object: {text[:200]!r}")
    return data


def request_json(url: str, body: Mapping[str, Any] | None = None, *, method: str = "POST", api_key: str | None = None,
                 authorization: str | None = None, timeout_s: float = 600.0, max_retries: int = 3,
                 check: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One JSON request to an OpenAI-compatible server: the answer's JSON object.

    Credentials in ``url``, or ``authorization`` (the header a client's base_url made,
    `endpoint`), are sent as the Authorization header; else ``api_key`` as a bearer token.
    ``timeout_s`` bounds each try whole. Failures a retry may mend are retried ``max_retries``
    times with backoff; ``check`` (given the answer) may raise `RetryableAnswer` to have it
    asked again, or a `ServerError`. Everything else is a `ServerError` naming the URL.
    """
    target = endpoint(url, "url")
    shown = safe_url(target.url)
    from_url = target.authorization or authorization
    header = from_url or (f"Bearer {api_key}" if api_key else None)
    sent = ("the credentials in base_url were refused" if from_url else
            "the API key sent was refused" if api_key else "no API key was sent")
    headers = {"Content-Type": "application/json", **({"Authorization": header} if header else {})}
    data = json.dumps(body).encode() if body is not None else None
    failure = _Transient("request failed", "")
    for attempt in range(max_retries + 1):
        try:
            reply = _reply(shown, *_exchange(target.url, method, data, headers, timeout_s), sent)
            if check is not None:
                check(reply)
            return reply
        except _Transient as error:
            failure = error
        except RetryableAnswer as error:
            failure = _Transient(str(error), "")
        if attempt < max_retries:
            time.sleep(min(60.0, 0.5 * 2**attempt))
    raise ServerError(f"{shown}: {failure.what} after {max_retries + 1} tries{failure.how}")


def refused_for_length(error: BaseException) -> str | None:
    """The server's reason when ``error`` is its refusal of one request for the prompt's length, else None:
    HTTP 400 whose structured error has a length code (``context_length_exceeded``). Words in the message
    never count: a 400 saying ``n=4 exceeds max_num_seqs`` is a refusal of the settings, not of a prompt."""
    if isinstance(error, ServerError) and error.status == 400 and error.code in LENGTH_CODES:
        return str(error).split(": ", 1)[-1][:300]
    return None


# --------------------------------------------------------------------------- answers


def served_model(reply: Mapping[str, Any], model: str, url: str) -> dict[str, Any] | None:
    """The ``/models`` entry of ``model`` (None when it is not listed); a reply of another shape is a
    ``ServerError`` naming the URL and what was wrong."""
    data = reply.get("data")
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise ServerError(f"{safe_url(url)}: the answer has no list of models (expected {{\"data\": [{{\"id\": "
                          f"...}}, ...]}}, got {json.dumps(reply)[:200]})")
    return next((m for m in data if m["id"] == model), None)


def served_length(entry: Mapping[str, Any] | None) -> int | None:
    """A ``/models`` entry's ``max_model_len`` (None when it does not say one)."""
    length = (entry or {}).get("max_model_len")
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 1 else None


def check_choices(reply: Mapping[str, Any], count: int, url: str) -> list[dict[str, Any]]:
    """A completions answer's ``count`` choices in index order; one the server aborted is asked again
    (`RetryableAnswer`), another shape is a ``ServerError`` naming the URL and what was wrong."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ServerError(f"{safe_url(url)}: the answer has no list of choices: {json.dumps(reply)[:200]}")
    indices = [c.get("index", i) for i, c in enumerate(choices)]
    if not all(isinstance(i, int) for i in indices) or sorted(indices) != list(range(count)):
        raise ServerError(f"{safe_url(url)}: expected {count} choices indexed 0..{count - 1}, got indices "
                          f"{indices[:20]}")
    aborted = [c for c in choices if c.get("finish_reason") == "abort"]
    if aborted:
        raise RetryableAnswer(f"the server aborted {len(aborted)} of {count} choices (finish_reason 'abort')")
    return [choice for _, choice in sorted(zip(indices, choices), key=lambda pair: pair[0])]
