"""Token n-gram index and Ratcliff–Obershelp overlap for benchmark decontamination.

The rule (Apertus report §E.1.2; docs/method.md, Decontamination): a training prompt is compared with a
benchmark prompt only if they share a token n-gram (n = 8); the two token sequences are
then aligned with ``difflib.SequenceMatcher`` (autojunk off), matching blocks shorter than
``min_block`` tokens are dropped, and the pair is contaminated when the summed length of
the remaining blocks exceeds ``ratio`` × the benchmark prompt's length.

Tokens are stable 64-bit integers (a regex word's blake2b hash, or a HF token id), so an
index built in one process gives the same n-gram keys in every worker process.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from align.errors import ConfigError, InputError, loading

TokenizeFn = Callable[[str], Sequence[int]]

# Scripts written without spaces are split per character, everything else into runs of
# letters/digits and single punctuation marks.
_NO_SPACE_SCRIPTS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD_RE = re.compile(rf"[{_NO_SPACE_SCRIPTS}]|[^\W_{_NO_SPACE_SCRIPTS}]+|[^\w\s]")
_CACHE_LIMIT = 1 << 20


def stable_token_id(token: str) -> int:
    """A token's id that is the same in every process and run (unlike ``hash(str)``)."""
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


class _IdCache(dict):
    """Word → stable id, filled on first sight (lookups stay in C for known words)."""

    def __missing__(self, word: str) -> int:
        tid = self[word] = stable_token_id(word)
        return tid


class RegexTokenizer:
    """The default tokenizer: lowercased words and punctuation marks as stable int ids.

    Language-agnostic and fast; a per-process cache maps each word to its id once.
    """

    def __init__(self) -> None:
        self._ids = _IdCache()

    def words(self, text: str) -> list[str]:
        """The lowercased word and punctuation tokens of ``text``."""
        return _WORD_RE.findall(text.lower())

    def __call__(self, text: str) -> list[int]:
        if len(self._ids) > _CACHE_LIMIT:
            self._ids.clear()
        return list(map(self._ids.__getitem__, self.words(text)))

    def __getstate__(self) -> dict[str, Any]:
        return {}  # the cache is rebuilt in each worker, not shipped to it

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._ids = _IdCache()


class HFTokenizer:
    """Token ids from a Hugging Face tokenizer (name, path, or loaded object), no specials.

    Pickles as its name/path, so worker processes load it themselves.
    """

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        if isinstance(spec, str):
            from transformers import AutoTokenizer

            with loading("tokenizer", spec):
                self.tokenizer = AutoTokenizer.from_pretrained(spec)
        else:
            self.tokenizer = spec

    def __call__(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"])


class CallableTokenizer:
    """Wraps a user callable; string or other hashable tokens become stable int ids."""

    def __init__(self, fn: Callable[[str], Iterable[Hashable]]) -> None:
        self.fn = fn

    def __call__(self, text: str) -> list[int]:
        tokens = list(self.fn(text))
        if all(type(t) is int for t in tokens):
            return tokens
        if all(isinstance(t, str) for t in tokens):
            return [stable_token_id(t) for t in tokens]
        bad = next(t for t in tokens if not isinstance(t, (int, str)) or isinstance(t, bool))
        raise InputError(
            f"tokenizer {self.fn!r} returned a {type(bad).__name__} token; "
            "a tokenizer must return a sequence of ints or of strings"
        )


def build_tokenizer(spec: str | Callable[[str], Iterable[Hashable]] = "regex") -> TokenizeFn:
    """Resolve the config's ``tokenizer`` setting to a picklable text → int ids function.

    ``"regex"`` is the built-in word tokenizer; any other string is a HF tokenizer name or
    path; a HF tokenizer object or any callable is used as given.
    """
    if isinstance(spec, str):
        return RegexTokenizer() if spec == "regex" else HFTokenizer(spec)
    if hasattr(spec, "encode") and hasattr(spec, "convert_ids_to_tokens"):
        return HFTokenizer(spec)
    if callable(spec):
        return CallableTokenizer(spec)
    raise ConfigError(
        f"tokenizer: expected 'regex', a HF tokenizer name/path or a callable, got {spec!r}"
    )


def ngram_keys(ids: Sequence[int], n: int) -> set[int]:
    """Hashes of every contiguous n-token window (empty when the sequence is shorter)."""
    if len(ids) < n:
        return set()
    return set(map(hash, zip(*(ids[i:] for i in range(n)))))


def matched_tokens(train: Sequence[int], bench: Sequence[int], min_block: int) -> int:
    """Summed length of the SequenceMatcher blocks of at least ``min_block`` tokens."""
    matcher = SequenceMatcher(None, train, bench, autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks() if b.size >= min_block)


def is_contaminated(
    train: Sequence[int], bench: Sequence[int], min_block: int, ratio: float
) -> bool:
    """The paper's rule for one pair, without any prefilter (the all-pairs baseline)."""
    return bool(bench) and matched_tokens(train, bench, min_block) > ratio * len(bench)


def gram_length(num_tokens: int, ngram: int, min_block: int) -> int | None:
    """How a benchmark prompt of this length is indexed; None if it can never match.

    A prompt of at least ``ngram`` tokens is indexed by its n-grams (the paper's
    prefilter). A shorter one is indexed by its ``min_block``-grams: any pair the rule
    flags shares a block of that length, so this prefilter misses nothing. A prompt
    shorter than ``min_block`` has no block the rule counts, so it is never matched.
    """
    if num_tokens >= ngram:
        return ngram
    if num_tokens >= min_block:
        return min_block
    return None


@dataclass(frozen=True)
class Match:
    """One benchmark item a training prompt is contaminated with."""

    bench: int  # global benchmark-item number in the index
    matched: int  # summed length of the counted blocks, in tokens


class NgramIndex:
    """Inverted index: n-gram hash → benchmark items containing it, plus the matcher.

    Only items that share a gram with a training prompt are aligned, so N × M prompts are
    never compared pairwise. Grams of different lengths share one table; a hash collision
    only adds a candidate, which the SequenceMatcher check then rejects.
    """

    def __init__(
        self, bench_ids: Sequence[Sequence[int]], *, ngram: int, min_block: int, ratio: float
    ):
        self.ngram, self.min_block, self.ratio = ngram, min_block, ratio
        self.bench_ids = [list(ids) for ids in bench_ids]
        self.table: dict[int, int | list[int]] = {}
        lengths = set()
        for item, ids in enumerate(self.bench_ids):
            k = gram_length(len(ids), ngram, min_block)
            if k is None:
                continue
            lengths.add(k)
            for key in ngram_keys(ids, k):
                self._add(key, item)
        self.gram_lengths = tuple(sorted(lengths, reverse=True))
        self._matchers: dict[int, SequenceMatcher] = {}

    def _add(self, key: int, item: int) -> None:
        # Most grams occur in one item: store a bare int, a list only when shared.
        have = self.table.get(key)
        if have is None:
            self.table[key] = item
        elif isinstance(have, int):
            if have != item:
                self.table[key] = [have, item]
        elif have[-1] != item:
            have.append(item)

    def __len__(self) -> int:
        return len(self.table)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_matchers"] = {}  # per-process cache, rebuilt on demand in each worker
        return state

    def candidates(self, ids: Sequence[int]) -> set[int]:
        """Benchmark items sharing at least one indexed gram with ``ids``."""
        found: set[int] = set()
        table = self.table
        for k in self.gram_lengths:
            for key in table.keys() & ngram_keys(ids, k):  # set intersection, in C
                hit = table[key]
                if isinstance(hit, int):
                    found.add(hit)
                else:
                    found.update(hit)
        return found

    def _matcher(self, item: int) -> SequenceMatcher:
        # SequenceMatcher indexes its second sequence; keep one per benchmark item.
        matcher = self._matchers.get(item)
        if matcher is None:
            matcher = SequenceMatcher(None, autojunk=False)
            matcher.set_seq2(self.bench_ids[item])
            self._matchers[item] = matcher
        return matcher

    def check(self, item: int, ids: Sequence[int]) -> int | None:
        """Counted overlap with benchmark ``item`` if over the threshold, else None."""
        length = len(self.bench_ids[item])
        need = self.ratio * length
        if len(ids) <= need:  # the overlap cannot exceed the training prompt's length
            return None
        matcher = self._matcher(item)
        matcher.set_seq1(ids)
        # quick_ratio = 2·|multiset intersection| / (len a + len b); the intersection
        # bounds any alignment, so most candidates sharing only boilerplate stop here.
        if round(matcher.quick_ratio() * (len(ids) + length) / 2) <= need:
            return None
        matched = sum(b.size for b in matcher.get_matching_blocks() if b.size >= self.min_block)
        return matched if matched > need else None

    def match(self, ids: Sequence[int]) -> list[Match]:
        """All benchmark items ``ids`` is contaminated with, in item order."""
        out = []
        for item in sorted(self.candidates(ids)):
            matched = self.check(item, ids)
            if matched is not None:
                out.append(Match(item, matched))
        return out
