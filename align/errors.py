"""The errors a user can fix: a bad recipe, a bad input record, a missing or wrong input
path, an external service that fails, an optional backend not installed.

The CLI reports these (and only these) as one line, ``align STAGE: ErrorClass: message``,
with exit status 2: the message names the key, the file and line, or the record and the
field. Any other exception is a bug in align or in a library it calls, and keeps its
traceback (``ALIGN_TRACEBACK=1`` keeps it for these too).

Each class also derives from the built-in exception its callers caught before
(``ValueError``, ``FileNotFoundError``, ``ImportError``, ``RuntimeError``), so code that
catches the built-in keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlignError",
    "ConfigError",
    "InputError",
    "MissingInputError",
    "MissingDependencyError",
    "RecordError",
    "ServiceError",
]


class AlignError(Exception):
    """Base of the errors a user can fix; the CLI prints them as one line."""


class ConfigError(AlignError, ValueError):
    """A recipe or setting that cannot be used; the message names the key and what is allowed."""


class InputError(AlignError, ValueError):
    """An input or output path that cannot be used as given: the wrong kind of file, rows
    from another run, an output directory made from other settings."""


class MissingInputError(InputError, FileNotFoundError):
    """A path that a recipe names and that does not exist."""


class RecordError(AlignError, ValueError):
    """A record that a stage cannot use; the message names the record and the field."""

    def __init__(self, record_id: Any, field: str, problem: str):
        self.record_id, self.field, self.problem = record_id, field, problem
        super().__init__(f"record {record_id!r}: field {field!r}: {problem}")


class ServiceError(AlignError, RuntimeError):
    """An external service (an OpenAI-compatible server, a vLLM engine, a cluster scheduler)
    that is down, refuses the request or answers something unusable."""


class MissingDependencyError(AlignError, ImportError):
    """An optional backend that the recipe asks for is not installed; the message says
    which extra or package to install."""
