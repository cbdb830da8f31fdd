"""Text helpers shared by the providers: plain message text, transcripts, BOS-safe encoding.

Records may hold structured message content (the Apertus shapes of docs/method.md, The Apertus chat format; system
`{"text"}`, user `{"parts": [...]}`, assistant `{"blocks": [...]}`). Reward models and
judges read plain text, so structured content is flattened here: the text parts of a
user turn, and the `response` blocks of an assistant turn (its thoughts and tool calls are
internal and not what is being rated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import InputError
from rewards.base import Conversation


def content_text(content: Any, where: str = "content") -> str:
    """Plain text of one message's content; raises ValueError naming `where` if unreadable."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        if isinstance(content.get("text"), str):
            return content["text"]
        if isinstance(content.get("parts"), list):
            return "".join(_part_text(p, f"{where}.parts[{i}]") for i, p in enumerate(content["parts"]))
        if isinstance(content.get("blocks"), list):
            blocks = content["blocks"]
            return "".join(b.get("text", "") for b in blocks if isinstance(b, Mapping) and b.get("type") == "response")
    raise InputError(f"{where}: expected a string or structured content (text / parts / blocks), got {content!r:.80}")


def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, Mapping) or "type" not in part:
        raise InputError(f"{where}: expected a mapping with 'type'")
    if part["type"] == "text":
        if not isinstance(part.get("text"), str):
            raise InputError(f"{where}.text: expected a string")
        return part["text"]
    return ""


def plain_messages(conversation: Conversation, *, drop_system: bool = True) -> list[dict[str, str]]:
    """Messages as {"role", "content": str}; system turns dropped unless asked to keep them.

    Providers drop the system prompt because offline completions were produced under
    different system prompts (docs/method.md, Reference completions), and the reward must rate the answer to the user,
    not whichever instruction the generator happened to receive.
    """
    out = []
    for i, message in enumerate(conversation):
        role = message.get("role")
        if not isinstance(role, str):
            raise InputError(f"messages[{i}].role: expected a string, got {role!r}")
        if drop_system and role == "system":
            continue
        out.append({"role": role, "content": content_text(message.get("content"), f"messages[{i}].content")})
    return out


def transcript(conversation: Conversation) -> str:
    """The prompt as the judge's QUESTION: the user text, or a labelled transcript.

    One user turn (the usual case) is quoted as is. A multi-turn prompt is written as
    `User: ...` / `Assistant: ...` lines so the judge sees the whole context the final
    response answers.
    """
    messages = plain_messages(conversation)
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def first_user_and_system(conversation: Conversation) -> tuple[str, str]:
    """(system prompt or "", first user message) — what the controversy classifier reads."""
    system, user = "", None
    for i, message in enumerate(conversation):
        if message.get("role") == "system" and not system:
            system = content_text(message.get("content"), f"messages[{i}].content")
        if message.get("role") == "user":
            user = content_text(message.get("content"), f"messages[{i}].content")
            break
    if user is None:
        raise InputError("messages: no user turn")
    return system, user


def encode_rendered(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a chat-template-rendered text, with exactly the BOS the tokenizer wants.

    Chat templates of Llama-family models write the BOS token into the text, and the
    tokenizer adds another one by default. Strip a leading BOS string, then encode with the
    tokenizer's own special-token handling: one BOS for tokenizers that use it, none for
    those (like Qwen's) that do not.
    """
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        text = text[len(bos) :]
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def sorted_batches(lengths: Sequence[int], batch_size: int, *, descending: bool = True) -> list[list[int]]:
    """Index batches of similar length (longest first, so memory errors show at once)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=descending)
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
