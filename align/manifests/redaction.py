"""Secrets kept out of manifests and completion markers: credential-named keys, and the
credentials a URL can carry (user:password@, signed query parameters)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

from align.io.http import safe_url

# of SECRET_WORDS, when two of its words in a row are one of SECRET_PAIRS, or when it is
# ``token`` / ``auth`` itself. ``eos_token``, ``pad_token`` or ``max_tokens`` are settings,
# not secrets; ``api_key_env`` names a variable (and is neutral).
SECRET_WORDS = frozenset({"password", "passwd", "secret", "credential", "credentials", "authorization",
                          "apikey", "passphrase"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
                          ("hub", "token"), ("access", "token"), ("auth", "token"), ("api", "token"),
                          ("bearer", "token"), ("refresh", "token"), ("id", "token"), ("session", "token")})


# Words before "token" that name a kind of vocabulary token (a setting), not a credential.
TOKEN_KINDS = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "max", "min", "num", "stop",
                         "start", "end", "image", "video", "audio", "vision", "additional", "extra", "new", "first",
                         "last", "default", "decoder", "padding", "chat", "tool", "think", "thinking", "system",
                         "user", "assistant", "boi", "eoi", "placeholder", "generation"})


def _words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name))
    return [w for w in re.split(r"[_\-.\s]+", spaced.lower()) if w]


def is_secret_key(name: str) -> bool:
    """Named like a credential (``hub_token``, ``api_key``, ``password``, ``Authorization``,
    ``clientSecret``), not like a setting that merely mentions tokens (``eos_token``)."""
    words = _words(name)
    if words and words[-1] == "env":
        return False  # api_key_env: the name of a variable
    if words in (["token"], ["auth"], ["key"]):
        return True
    if len(words) >= 2 and words[-1] == "token" and words[-2] not in TOKEN_KINDS:
        return True  # hf_token, wandb_token, github_token: a credential, unlike eos_token or pad_token
    return any(w in SECRET_WORDS for w in words) or any(pair in SECRET_PAIRS for pair in itertools.pairwise(words))


def redact(value: Any) -> Any:
    """The value with secret-named keys removed and credentials cut out of URLs."""
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if not is_secret_key(k)}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return safe_url(value)
    return value
