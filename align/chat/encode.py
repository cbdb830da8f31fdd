"""Token ids, loss masks and message spans, read off the one rendered string.

The rendered text is tokenized once, with ``add_special_tokens=False`` (it already starts
with the format's BOS, so letting the tokenizer add one would double it), and with the
offsets mapping. A token is trained on when every character it covers came from a
trained segment; a token covering both trained and untrained characters makes the mask
ambiguous and is an error. Pieces are never tokenized separately, since BPE merges
across piece boundaries would shift them.
"""

from __future__ import annotations

import datetime as _dt
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from align.chat import template
from align.chat.formats import ChatFormat, get_format
from align.chat.render import render, render_segments
from align.chat.segments import Segment
from align.chat.template import TOKENIZER_FORMAT
from align.errors import InputError

# The label of a token off the loss mask: PyTorch's cross-entropy (and transformers' losses)
# skip it. The one definition; the SFT labels, the collators and the log-prob kernels import it.
IGNORE_INDEX = -100


@dataclass
class EncodedChat:
    """A tokenized conversation.

    ``loss_mask[k]`` is 1 where token ``k`` is trained on. ``spans[i]`` is the half-open
    token range ``[start, end)`` covering message ``i`` (its markers included); a token
    that straddles two messages belongs to both spans. ``text`` is the rendered string.
    """

    input_ids: list[int]
    loss_mask: list[int]
    spans: list[tuple[int, int]]
    text: str = ""


def check_tokenizer(tokenizer: Any, fmt: ChatFormat) -> None:
    """The tokenizer must give offsets and keep every format token as one token."""
    if not getattr(tokenizer, "is_fast", False):
        raise InputError("align.chat needs a fast tokenizer (offsets mapping); got "
                         f"{type(tokenizer).__name__}")
    added = tokenizer.get_added_vocab()
    missing = [t for t in fmt.special_tokens + ((fmt.bos,) if fmt.bos else ()) if t not in added]
    if missing:
        raise InputError(f"the tokenizer lacks the {fmt.name!r} tokens {missing}; they would be "
                         "split into pieces. Call align.chat.install_format(tokenizer, model, "
                         f"chat_format={fmt.name!r}) first")


def tokenize(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets of already rendered text (no added specials)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _trained_prefix(segments: Sequence[Segment]) -> list[int]:
    """``p[c]`` = number of trained characters before character ``c``."""
    flags = [int(s.trained) for s in segments for _ in s.text]
    return [0, *accumulate(flags)]


def _owner(segments: Sequence[Segment], char: int) -> str:
    pos = 0
    for s in segments:
        if pos <= char < pos + len(s.text):
            where = "no message" if s.index is None else f"message {s.index}"
            return f"{'trained' if s.trained else 'untrained'} text of {where}"
        pos += len(s.text)
    return "the end of the text"


def loss_mask(
    text: str, offsets: Sequence[tuple[int, int]], segments: Sequence[Segment]
) -> list[int]:
    """1 for tokens made only of trained characters, 0 for untrained; raise on a mix."""
    trained = _trained_prefix(segments)
    mask: list[int] = []
    for k, (start, end) in enumerate(offsets):
        if end <= start:  # zero-width (e.g. a normaliser-added piece): follow its left side
            mask.append(mask[-1] if mask else 0)
            continue
        count = trained[end] - trained[start]
        if 0 < count < end - start:
            first = next(c for c in range(start, end)
                         if (trained[c + 1] - trained[c]) != (trained[start + 1] - trained[start]))
            raise InputError(
                f"token {k} ({text[start:end]!r}, chars {start}-{end}) straddles the boundary "
                f"between {_owner(segments, start)} and {_owner(segments, first)}: the tokenizer "
                "merged text across it, so the loss mask is ambiguous. Change the text at that "
                "boundary (e.g. a space) or use a tokenizer that splits there."
            )
        mask.append(1 if count else 0)
    return mask


def message_spans(
    offsets: Sequence[tuple[int, int]], segments: Sequence[Segment], n_messages: int
) -> list[tuple[int, int]]:
    """Token range ``[start, end)`` of each message, from its segments' character range."""
    ranges: dict[int, tuple[int, int]] = {}
    pos = 0
    for s in segments:
        if s.index is not None:
            lo, hi = ranges.get(s.index, (pos, pos))
            ranges[s.index] = (min(lo, pos), pos + len(s.text))
        pos += len(s.text)
    starts = [o[0] for o in offsets]
    ends = [o[1] for o in offsets]
    spans = []
    for i in range(n_messages):
        lo, hi = ranges.get(i, (0, 0))
        first = bisect_right(ends, lo)
        spans.append((first, max(first, bisect_left(starts, hi))))
    return spans


# A conversation wanted only up to ``max_tokens`` (SFT keeps its first max_length tokens) is
# tokenized only as far as they need: its first PREFIX_CHARS_PER_TOKEN x max_tokens characters,
# then twice as many, until they hold max_tokens + PREFIX_MARGIN tokens. The margin keeps the
# tokens kept clear of the cut, where a prefix's last tokens may differ from the whole text's (a
# word cut in two). A 20 MB conversation then costs a few kB of tokenizing, not gigabytes.
PREFIX_CHARS_PER_TOKEN = 8
PREFIX_MARGIN = 64


def _cut_segments(segments: Sequence[Segment], chars: int) -> list[Segment]:
    """The segments of the text's first ``chars`` characters: the one across the cut is cut short, those
    past it are kept empty, so a message past the cut spans no token at the end (as it does when the
    whole text is tokenized and its ids are cut)."""
    out, pos = [], 0
    for s in segments:
        out.append(s if pos + len(s.text) <= chars else Segment(s.text[: max(chars - pos, 0)], s.index, s.trained))
        pos += len(s.text)
    return out


def first_tokens(tokenizer: Any, text: str, max_tokens: int) -> tuple[int, list[int], list[tuple[int, int]]]:
    """(characters tokenized, ids, offsets): the first ``max_tokens`` tokens of ``text``, from the
    shortest doubling prefix that holds ``PREFIX_MARGIN`` tokens more (the whole text when it is
    short or holds fewer tokens)."""
    chars = max_tokens * PREFIX_CHARS_PER_TOKEN
    while chars < len(text):
        ids, offsets = tokenize(tokenizer, text[:chars])
        if len(ids) >= max_tokens + PREFIX_MARGIN:
            return chars, ids[:max_tokens], offsets[:max_tokens]
        chars *= 2
    ids, offsets = tokenize(tokenizer, text)
    return len(text), ids[:max_tokens], offsets[:max_tokens]


def _encoded(tokenizer: Any, text: str, segs: Sequence[Segment], n_messages: int, bos: str | None,
             max_tokens: int | None) -> EncodedChat:
    """Token ids, mask and spans of rendered text: all of it, or its first ``max_tokens`` tokens."""
    if max_tokens is None:
        chars, (ids, offsets) = len(text), tokenize(tokenizer, text)
    else:
        chars, ids, offsets = first_tokens(tokenizer, text, max_tokens)
    if chars < len(text):
        segs = _cut_segments(segs, chars)
    _check_single_bos(ids, tokenizer, bos)
    return EncodedChat(input_ids=ids, loss_mask=loss_mask(text[:chars], offsets, segs),
                       spans=message_spans(offsets, segs, n_messages), text=text)


def _check_single_bos(ids: Sequence[int], tokenizer: Any, bos: str | None) -> None:
    if bos and len(ids) > 1 and ids[0] == ids[1] == tokenizer.convert_tokens_to_ids(bos):
        raise InputError("the token ids start with two BOS tokens")


def _encode_with_template(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Any] | None,
                          add_generation_prompt: bool, enable_thinking: bool,
                          max_tokens: int | None = None) -> EncodedChat:
    """``encode`` for ``chat_format='tokenizer'`` (align.chat.template): the template's text,
    trained on each assistant turn from its generation prompt to its end of turn. ``spans``
    covers the assistant messages; the others are (0, 0)."""
    template.check_fast(tokenizer)
    template.check_own_template(tokenizer, enable_thinking=enable_thinking)
    template.check_text(tokenizer, messages)
    text = template.apply_template(tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                   enable_thinking=enable_thinking)
    turns = template.assistant_char_spans(tokenizer, messages, text, tools=tools, enable_thinking=enable_thinking)
    segs, pos = [], 0
    for i, (start, stop) in turns.items():  # in message order, which is the order in the text
        segs += [Segment(text[pos:start], None), Segment(text[start:stop], i, trained=True)]
        pos = stop
    segs.append(Segment(text[pos:], None))
    segs = [s for s in segs if s.text]
    return _encoded(tokenizer, text, segs, len(messages), tokenizer.bos_token, max_tokens)


def encode(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    chat_format: str = "apertus",
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = False,
    chat_date: _dt.date | str | None = None,
    max_tokens: int | None = None,
) -> EncodedChat:
    """Tokenize a conversation with its SFT loss mask and per-message token spans.

    The mask trains on assistant content and the end-of-turn token, never on system,
    developer, user text, tool outputs or the turn-opening marker (see the format
    modules for the exact rule). The tokenizer must be fast and have the format's
    tokens (``install_format``). ``max_tokens``: only the first ``max_tokens`` tokens are
    given (SFT truncates to ``max_length``), and a long conversation is tokenized only as
    far as they need (``first_tokens``), never whole.
    """
    if chat_format == TOKENIZER_FORMAT:
        return _encode_with_template(tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     enable_thinking=enable_thinking, max_tokens=max_tokens)
    fmt = get_format(chat_format)
    check_tokenizer(tokenizer, fmt)
    segs = render_segments(messages, chat_format=fmt.name, tools=tools,
                           add_generation_prompt=add_generation_prompt,
                           enable_thinking=enable_thinking, chat_date=chat_date)
    text = "".join(s.text for s in segs)
    return _encoded(tokenizer, text, segs, len(messages), fmt.bos, max_tokens)


def encode_completion(
    tokenizer: Any,
    prompt_messages: Sequence[Mapping[str, Any]],
    completion: str,
    *,
    chat_format: str = "apertus",
    tools: Sequence[Any] | None = None,
    enable_thinking: bool = False,
    chat_date: _dt.date | str | None = None,
    end_of_turn: bool = True,
) -> tuple[list[int], list[int]]:
    """Prompt ids and completion ids: the one tokenization of a (prompt, completion) pair.

    The prompt is rendered with the generation prompt; the completion is the raw text the
    model generated (it may hold tool-call or thought markers), followed by the format's
    end of turn unless ``end_of_turn`` is False (a completion cut at the token budget never
    ended its turn; training it with the end token would teach the model to stop mid-text). ``prompt + completion + end`` is tokenized as one string and split at the
    prompt's length, after checking that the prompt's own tokens are a prefix of it; if
    the tokenizer merges across the boundary the split would be wrong, so that raises.
    """
    if not isinstance(completion, str):
        raise InputError(f"completion must be a string, got {type(completion).__name__}")
    if chat_format == TOKENIZER_FORMAT:
        # the model's own template: its generation prompt, then what the model wrote and the
        # template's end of turn (the tokens the model produced when it sampled the completion)
        template.check_fast(tokenizer)
        template.check_own_template(tokenizer, enable_thinking=enable_thinking)
        end = eos = template.turn_end(tokenizer, enable_thinking=enable_thinking)
        bos, forbidden = tokenizer.bos_token, template.special_tokens(tokenizer)
    else:
        fmt = get_format(chat_format)
        check_tokenizer(tokenizer, fmt)
        end, bos, eos, forbidden = fmt.turn_end, fmt.bos, fmt.eos, fmt.forbidden_in_text
    if completion.endswith(eos):
        raise InputError(f"completion already ends with {eos!r}; pass the text without it "
                         "(the end of turn is appended here)")
    for token in forbidden:
        if token in completion:
            raise InputError(f"completion contains the special token {token!r}, which would "
                             "be tokenized as format structure")
    if chat_format == TOKENIZER_FORMAT:
        template.check_text(tokenizer, prompt_messages)
        prompt = template.apply_template(tokenizer, prompt_messages, tools=tools, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)
    else:
        prompt = render(prompt_messages, chat_format=chat_format, tools=tools, add_generation_prompt=True,
                        enable_thinking=enable_thinking, chat_date=chat_date)
    prompt_ids, _ = tokenize(tokenizer, prompt)
    full_ids, _ = tokenize(tokenizer, prompt + completion + (end if end_of_turn else ""))
    _check_single_bos(full_ids, tokenizer, bos)
    if full_ids[: len(prompt_ids)] != prompt_ids:
        k = next((k for k, (a, b) in enumerate(zip(prompt_ids, full_ids)) if a != b),
                 min(len(prompt_ids), len(full_ids)))
        raise InputError(
            "the tokenized prompt is not a prefix of the tokenized prompt + completion "
            f"(they differ at token {k} of {len(prompt_ids)}): the tokenizer merges text across "
            "the prompt/completion boundary, so the completion's tokens cannot be separated "
            f"from the prompt's. Prompt ends with {prompt[-20:]!r}, completion starts with "
            f"{completion[:20]!r}."
        )
    return prompt_ids, full_ids[len(prompt_ids):]
