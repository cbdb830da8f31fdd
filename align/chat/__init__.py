"""Chat formats: rendering, token masks, tool declarations and calls, jinja templates.

Public API::

    render(messages, *, chat_format="apertus", tools=None, add_generation_prompt=False,
           enable_thinking=False, chat_date=None) -> str
    encode(tokenizer, messages, ...) -> EncodedChat(input_ids, loss_mask, spans, text)
    encode_completion(tokenizer, prompt_messages, completion, ...) -> (prompt_ids, completion_ids)
    chat_template(chat_format) -> str          # jinja, renders exactly what render() renders
    install_format(tokenizer, model=None, chat_format="apertus") -> ChatFormat
    tool_declarations(tools, chat_format="apertus") -> str
    parse_tool_calls(text, chat_format="apertus") -> [{"name", "arguments"}]
    format_tool_calls(calls, chat_format="apertus") -> str   # the inverse of parse_tool_calls
    FORMATS: name -> ChatFormat (bos, eos, turn_end, special tokens, ...)

Formats: ``apertus`` (docs/method.md, The Apertus chat format; see ``align.chat.apertus`` for every rendering choice),
``llama3`` (Lucie-7B style) and ``chatml``; the last two have no tool or thought markup
and raise when given tools, tool messages or thoughts.
"""

from align.chat.encode import EncodedChat, encode, encode_completion
from align.chat.formats import FORMATS, STRUCTURE_TEXT, ChatFormat, get_format, structure_text_problem
from align.chat.install import install_format
from align.chat.render import render, render_segments
from align.chat.templates import chat_template
from align.chat.tools import format_tool_calls, parse_tool_calls, tool_declarations

__all__ = [
    "FORMATS",
    "STRUCTURE_TEXT",
    "ChatFormat",
    "EncodedChat",
    "chat_template",
    "encode",
    "encode_completion",
    "format_tool_calls",
    "get_format",
    "install_format",
    "parse_tool_calls",
    "render",
    "render_segments",
    "structure_text_problem",
    "tool_declarations",
]
