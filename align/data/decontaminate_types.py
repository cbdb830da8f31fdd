"""What decontamination and its report share: the match settings and the prompt types.

``MatchSettings`` (the recipe keys of ``align decontaminate`` besides its data paths),
``BenchmarkPrompts`` (a loaded benchmark) and ``TrainPrompt`` (one piece of training text
to check). ``align.data.decontaminate`` matches with them, ``align.data.decontaminate_report``
builds the removed rows and the summary from them; neither imports the other's module for
these definitions. Both import them from here (``align.data.decontaminate`` re-exports them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from align.errors import ConfigError, InputError, RecordError

__all__ = ["TURNS", "BenchmarkPrompts", "MatchSettings", "TrainPrompt"]

TURNS = ("all", "first")


# --------------------------------------------------------------------------- settings


@dataclass
class MatchSettings:
    """How training prompts are read and matched (the recipe keys of ``align decontaminate``
    besides its data paths).

    Matching (defaults from the Apertus report §E.1.2):
        ngram (int, default 8, ≥ 1): prefilter n-gram length, in tokens.
        min_block (int, default 5, ≥ 1): SequenceMatcher blocks shorter than this are
            dropped before summing.
        ratio (float, default 0.5, in (0, 1)): contaminated when the summed blocks exceed
            ``ratio`` × the benchmark prompt's length in tokens.
        tokenizer (str | callable, default "regex"): "regex" is a fast lowercased word and
            punctuation tokenizer (CJK split per character); another string is a HF
            tokenizer name or path (no special tokens); a callable maps text to ints or
            strings (must be picklable when ``num_workers`` > 1).

    Training prompts:
        text_field (str | None, default None): None reads the record schema
            (``id`` + ``messages``, user turns checked); a column name reads raw prompts
            from that string field instead (as each benchmark's ``text_field`` names its
            prompt column).
        turns ("all" | "first", default "all"): in messages mode, check every user turn
            or only the first one. A record is removed if any checked turn matches.

    Execution:
        num_workers (int | None, default None): processes for matching (None: os.cpu_count()).
        chunk_size (int, default 512): training prompts per task sent to a worker.
        progress (bool, default True): show a tqdm bar.
        examples_per_benchmark (int, default 5): removed examples kept in the summary.
    """

    text_field: str | None = None
    turns: str = "all"

    ngram: int = 8
    min_block: int = 5
    ratio: float = 0.5
    tokenizer: str | Callable[[str], Iterable[Hashable]] = "regex"

    num_workers: int | None = None
    chunk_size: int = 512
    progress: bool = True
    examples_per_benchmark: int = 5

    def __post_init__(self) -> None:
        if self.turns not in TURNS:
            raise ConfigError(f"turns: expected one of {TURNS}, got {self.turns!r}")
        for key in ("ngram", "min_block", "chunk_size"):
            _check_int(key, getattr(self, key), low=1)
        _check_int("examples_per_benchmark", self.examples_per_benchmark, low=0)
        if self.num_workers is not None:
            _check_int("num_workers", self.num_workers, low=1)
        if (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, (int, float))
            or not 0 < self.ratio < 1
        ):
            raise ConfigError(
                f"ratio: expected a number in (0, 1), got {self.ratio!r} (the paper uses 0.5)"
            )
        if self.text_field is not None and not (
            isinstance(self.text_field, str) and self.text_field
        ):
            raise ConfigError(
                f"text_field: expected a column name or null, got {self.text_field!r}"
            )
        if not (isinstance(self.tokenizer, str) and self.tokenizer) and not callable(
            self.tokenizer
        ):
            raise ConfigError(
                f"tokenizer: expected 'regex', a HF tokenizer name/path or a callable, got {self.tokenizer!r}"
            )

    def workers(self) -> int:
        """The resolved number of worker processes."""
        return self.num_workers or os.cpu_count() or 1


def _check_int(key: str, value: Any, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{key}: expected an integer ≥ {low}, got {value!r}")




# --------------------------------------------------------------------------- benchmarks


@dataclass
class BenchmarkPrompts:
    """A loaded benchmark: its prompt texts and, optionally, item ids."""

    name: str
    texts: list[str]
    ids: list[Any] | None = None
    source: str = "<memory>"
    text_field: str = "text"

    def __post_init__(self) -> None:
        if not self.texts:
            raise InputError(f"{self.source}: benchmark {self.name!r} has no prompts")
        for i, text in enumerate(self.texts):
            if not isinstance(text, str):
                raise RecordError(
                    f"{self.source} row {i}",
                    self.text_field,
                    f"expected a string, got {type(text).__name__} {text!r:.80}",
                )
        if self.ids is not None and len(self.ids) != len(self.texts):
            raise InputError(
                f"{self.source}: benchmark {self.name!r} has {len(self.ids)} ids for {len(self.texts)} prompts"
            )


@dataclass(frozen=True)
class TrainPrompt:
    """A piece of training text to check: which record, which message, what text."""

    record: int
    message: int | None
    text: str
