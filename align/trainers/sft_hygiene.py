"""SFT data hygiene from the Apertus and Lucie-7B reports (docs/method.md, Supervised fine-tuning): strip ``\\boxed{}`` and drop other models' identities.

* ``\\boxed{42}`` → ``42`` in assistant answers: the boxed style of math datasets is an
  evaluation artefact the chat model should not learn to emit.
* Identity filter: a conversation whose assistant text names another model or its maker
  ("I am ChatGPT, made by OpenAI") would teach the model a wrong identity. Following the
  Lucie-7B report (§5.2.1), any assistant text containing one of the keywords
  drops the row; the dropped rows are returned with the reason, never silently lost.

Only assistant text is touched: system/user/tool text is context, not a target.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from datasets import Dataset

from align.data.records import list_field, record_id
from align.errors import ConfigError, InputError, RecordError

__all__ = [
    "IDENTITY_KEYWORDS",
    "assistant_texts",
    "filter_identity",
    "identity_claim",
    "strip_boxed",
    "strip_boxed_dataset",
    "strip_boxed_messages",
]

BOXED = "\\boxed"

# Names of other assistants, model families and their makers (case-sensitive, whole words).
IDENTITY_KEYWORDS: tuple[str, ...] = (
    "ChatGPT",
    "Chat GPT",
    "GPT-3",
    "GPT3",
    "GPT 3",
    "GPT-3.5",
    "GPT3.5",
    "GPT 3.5",
    "GPT-4",
    "GPT4",
    "GPT 4",
    "OpenAI",
    "Open AI",
    "Bing Chat",
    "BingChat",
    "Bard",
    "BARD",
    "PaLM",
    "Gemini",
    "Gemma",
    "Google AI",
    "Claude",
    "Anthropic",
    "LLaMA",
    "Llama",
    "Meta AI",
    "Mistral",
    "Mixtral",
    "Open Assistant",
    "OpenAssistant",
    "LAION",
    "Qwen",
    "DeepSeek",
)


def _closing_brace(text: str, open_at: int) -> int:
    """Index of the ``}`` matching the ``{`` at ``open_at``, or -1 if it is never closed."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{" and text[i - 1] != "\\":
            depth += 1
        elif text[i] == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return i
    return -1


def strip_boxed(text: str) -> str:
    """Replace every ``\\boxed{X}`` (nested braces allowed) with ``X``.

    Raises ValueError on a ``\\boxed`` without a balanced ``{...}``: cutting it anyway would
    corrupt the answer.
    """
    out, pos = [], 0
    while (start := text.find(BOXED, pos)) != -1:
        brace = start + len(BOXED)
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace >= len(text) or text[brace] != "{":
            raise InputError(f"\\boxed at char {start} is not followed by '{{'")
        end = _closing_brace(text, brace)
        if end == -1:
            raise InputError(f"\\boxed{{ at char {start} is never closed")
        out.append(text[pos:start])
        out.append(strip_boxed(text[brace + 1 : end]))
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def _text_slots(message: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, text) of each assistant text a reader sees: string content, thoughts, responses."""
    content = message.get("content")
    if isinstance(content, str):
        yield "content", content
    elif isinstance(content, Mapping) and isinstance(content.get("blocks"), list):
        for k, block in enumerate(content["blocks"]):
            if (
                isinstance(block, Mapping)
                and block.get("type") in ("thoughts", "response")
                and isinstance(block.get("text"), str)
            ):
                yield f"content.blocks[{k}].text", block["text"]


def assistant_texts(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str]]:
    """(field path, text) of every assistant text in a conversation."""
    for i, message in enumerate(messages):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            for path, text in _text_slots(message):
                yield f"messages[{i}].{path}", text


def strip_boxed_messages(
    messages: Sequence[Mapping[str, Any]], rid: str = "<unknown>"
) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ``\\boxed{}`` stripped from assistant responses.

    Thoughts keep it: they are the model's working, not its answer.
    """
    out = []
    for i, message in enumerate(messages):
        message = dict(message)
        if message.get("role") == "assistant":
            message["content"] = _strip_content(
                message.get("content"), rid, f"messages[{i}].content"
            )
        out.append(message)
    return out


def _strip_content(content: Any, rid: str, where: str) -> Any:
    try:
        if isinstance(content, str):
            return strip_boxed(content)
        if isinstance(content, Mapping) and isinstance(content.get("blocks"), list):
            blocks = [
                dict(b, text=strip_boxed(b["text"]))
                if isinstance(b, Mapping)
                and b.get("type") == "response"
                and isinstance(b.get("text"), str)
                else b
                for b in content["blocks"]
            ]
            return {**content, "blocks": blocks}
    except InputError as err:
        raise RecordError(rid, where, str(err)) from None
    return content


def strip_boxed_dataset(dataset: Dataset) -> Dataset:
    """`strip_boxed_messages` over a dataset's ``messages`` column."""

    def _strip(row: dict[str, Any], index: int) -> dict[str, Any]:
        return {"messages": strip_boxed_messages(row["messages"], record_id(row, index))}

    return dataset.map(_strip, with_indices=True, desc="Stripping \\boxed{} from answers")


def _keyword_pattern(keywords: Iterable[str]) -> re.Pattern[str]:
    """Whole-word alternation, longest first so 'GPT-3.5' wins over 'GPT-3'."""
    words = sorted({k for k in keywords if k}, key=len, reverse=True)
    if not words:
        raise ConfigError("identity filter needs at least one keyword")
    return re.compile(r"(?<![\w-])(" + "|".join(re.escape(w) for w in words) + r")(?![\w-]|\.\d)")


def identity_claim(
    messages: Sequence[Mapping[str, Any]],
    keywords: Iterable[str] = IDENTITY_KEYWORDS,
    pattern: re.Pattern[str] | None = None,
) -> str | None:
    """Why the conversation must be dropped (first keyword found in assistant text), or None."""
    pattern = pattern or _keyword_pattern(keywords)
    for path, text in assistant_texts(messages):
        match = pattern.search(text)
        if match:
            return f"{path} names another model or its maker: {match.group(0)!r}"
    return None


def filter_identity(
    dataset: Dataset, keywords: Iterable[str] = IDENTITY_KEYWORDS
) -> tuple[Dataset, Dataset]:
    """Split into (kept, dropped); dropped rows carry ``drop_reason`` and ``row_index``.

    ``messages`` may be a list or its JSON text (as `align.trainers.sft_data` accepts).
    """
    pattern = _keyword_pattern(keywords)
    reasons = [identity_claim(list_field(row, "messages", record_id(row, index)) or [], pattern=pattern)
               for index, row in enumerate(dataset)]
    dropped_idx = [i for i, reason in enumerate(reasons) if reason]
    kept = dataset.select([i for i, reason in enumerate(reasons) if not reason])
    dropped = dataset.select(dropped_idx)
    dropped = dropped.add_column("drop_reason", [reasons[i] for i in dropped_idx])
    dropped = dropped.add_column("row_index", dropped_idx)
    return kept, dropped
