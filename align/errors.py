"""The errors a user can fix: a bad recipe, a bad input record, a missing or wrong input
path, an external service that fails, an optional backend not installed.

The CLI reports these (and only these) as one line, ``align STAGE: ErrorClass: message``,
with exit status 2: the message names the key, the file and line, or the record and the
field. Any other exception is a bug in align or in a library it calls, and keeps its
traceback (``ALIGN_TRACEBACK=1`` keeps it for these too).

Each class also derives from the built-in exception its callers caught before
(``ValueError``, ``FileNotFoundError``, ``ImportError``, ``RuntimeError``), so code that
catches the built-in keeps working. An internal invariant (a bug if it ever fails) stays a
plain exception. ``loading`` wraps the one call that loads a model, tokenizer or dataset a
setting names, so the library's own not-found error names the setting; ``optional_import``
imports an optional backend, or says what to install.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "AlignError",
    "ConfigError",
    "DiskFullError",
    "InputError",
    "MissingDependencyError",
    "MissingInputError",
    "NotWritableError",
    "RecordError",
    "ServiceError",
    "loading",
    "optional_import",
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


class DiskFullError(InputError, OSError):
    """A write that found no space left (ENOSPC, or EDQUOT: the quota used up); the message
    names the path, what to free, and that a rerun resumes (``align.io.disk``)."""


class NotWritableError(InputError, OSError):
    """A write refused by the file system (read-only: EROFS; EACCES or EPERM); the message
    names the path, and that a rerun resumes once it is writable (``align.io.disk``)."""


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


@contextlib.contextmanager
def loading(key: str, value: Any) -> Iterator[None]:
    """Around one call that loads what a setting names (a model, tokenizer or dataset path,
    or a hub name): the loading library's own error for it becomes one naming the setting.

    transformers, huggingface_hub and datasets raise ``OSError`` for a path or name they
    cannot load (not found, not a model directory, the hub unreachable) and ``ValueError``
    for one they do not recognise (no ``model_type``, an unknown architecture): here these
    become ``MissingInputError`` (not found) or ``InputError``, with the first line of the
    library's message. Wrap only the load itself, so that nothing else is caught.
    """
    try:
        yield
    except AlignError:
        raise
    except FileNotFoundError as exc:
        raise MissingInputError(f"{key}={str(value)!r}: not found ({_first_line(exc)})") from exc
    except (OSError, ValueError) as exc:
        raise InputError(f"{key}={str(value)!r}: cannot be loaded ({_first_line(exc)})") from exc


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def optional_import(module: str, *, needed_by: str, install: str) -> Any:
    """Import the optional backend ``module`` (``vllm``, ``deepspeed``, ``matplotlib``...).

    Not installed, or failing to import (a broken build), it is a ``MissingDependencyError``
    naming what needs it and what to install (``install``: the extra or the package), with
    the import's own message.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"{needed_by} needs {module}, which did not import ({_first_line(exc)}): "
                                     f"{install}") from exc
