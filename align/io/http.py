"""One JSON request to an OpenAI-compatible server (the judge backend and the sampler)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any


def request_json(url: str, body: Mapping[str, Any] | None = None, *, method: str = "POST", api_key: str | None = None,
                 timeout_s: float = 600.0, max_retries: int = 3) -> dict[str, Any]:
    """One JSON request to an OpenAI-compatible server, retrying connection errors and 5xx
    answers with a short backoff; anything else is a RuntimeError naming the URL."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    for attempt in range(max_retries + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read().decode(errors="replace")
            try:
                return json.loads(raw)
            except json.JSONDecodeError:
                raise RuntimeError(f"{url}: answer is not JSON: {raw[:200]!r}") from None
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            if error.code < 500 or attempt == max_retries:
                raise RuntimeError(f"{url}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            if attempt == max_retries:
                raise RuntimeError(f"{url}: request failed after {attempt + 1} tries: {error}") from None
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")
