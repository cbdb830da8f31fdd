"""Tool declarations for the developer block, and tool calls in and out of text.

Declarations are written as the released Apertus chat template writes them (Apertus
report, tool use): each tool becomes a TypeScript-like type, byte for byte what a served
Apertus model sees,

    // Get the weather for a city.
    type get_weather = (_: {
    // City name
    city: string,
    unit?: "celsius" | "fahrenheit", // default: celsius
    }) => any;

A tool is an OpenAI-style schema (``{"type": "function", "function": {...}}``), the bare
function dict, or a Python callable with type hints and a Google-style docstring. A
callable goes through ``transformers.utils.get_json_schema``, the same converter
``tokenizer.apply_chat_template`` uses, so ``render(tools=[fn])`` and the exported jinja
template see the same schema. A multi-line description gets ``//`` on its first line
only, as in the release.

Calls render as ``<|tools_prefix|>[{"name": {args}}, ...]<|tools_suffix|>`` and
``parse_tool_calls`` reads them back out of generated text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from align.chat.formats import get_format
from align.chat.messages import ToolCall, make_call
from align.errors import ConfigError, InputError

TOOLS_PREFIX = "<|tools_prefix|>"
TOOLS_SUFFIX = "<|tools_suffix|>"

Tool = Mapping[str, Any] | Callable[..., Any]


def function_schema(tool: Tool, position: int = 0) -> dict[str, Any]:
    """The bare function schema (name, description, parameters) of one tool."""
    where = f"tools[{position}]"
    if callable(tool) and not isinstance(tool, Mapping):
        from transformers.utils.chat_template_utils import (
            DocstringParsingException,
            TypeHintParsingException,
            get_json_schema,
        )

        try:
            tool = get_json_schema(tool)
        except (DocstringParsingException, TypeHintParsingException) as err:
            name = getattr(tool, "__name__", repr(tool))
            raise InputError(f"{where}: cannot build a schema from function {name!r}: {err}") \
                from None
    if not isinstance(tool, Mapping):
        raise InputError(f"{where}: a tool must be a schema dict or a callable, "
                         f"got {type(tool).__name__}")
    fn = tool.get("function") if "function" in tool else tool
    if not isinstance(fn, Mapping):
        raise InputError(f"{where}: 'function' must be a mapping")
    name = fn.get("name")
    if not isinstance(name, str) or not name or any(ch.isspace() for ch in name):
        raise InputError(f"{where}: tool name must be a non-empty string without spaces, "
                         f"got {name!r}")
    params = fn.get("parameters")
    if params is not None and not (
        isinstance(params, Mapping) and isinstance(params.get("properties", {}), Mapping)
    ):
        raise InputError(f"{where} ({name!r}): 'parameters' must be a JSON schema object "
                         "with a 'properties' mapping")
    return dict(fn)


def function_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """All tools as bare function schemas; duplicate names are an error."""
    if isinstance(tools, (str, Mapping)) or not isinstance(tools, Sequence):
        raise InputError(f"tools must be a list, got {type(tools).__name__}")
    schemas = [function_schema(t, k) for k, t in enumerate(tools)]
    seen: set[str] = set()
    for k, s in enumerate(schemas):
        if s["name"] in seen:
            raise InputError(f"tools[{k}]: tool {s['name']!r} is declared twice")
        seen.add(s["name"])
    return schemas


# Two spots where the released template's own indentation reaches its output, kept so
# that prompts match it byte for byte: before the type of a nested object's property, and
# before a ``oneOf`` variant's default.
_NESTED_TYPE_GAP = "\n" + " " * 16
_VARIANT_DEFAULT_GAP = " " * 20


def _to_json(value: Any) -> str:
    """``tojson`` as transformers' chat templates (and so vLLM) define it."""
    return json.dumps(value, ensure_ascii=False)


def _array_type(items: Any) -> str:
    if not items:
        return "any[]"
    kind = items.get("type") if isinstance(items, Mapping) else None
    if kind == "string":  # an enum of strings too: the release writes string[]
        return "string[]"
    if kind in ("number", "integer"):
        return "number[]"
    if kind == "boolean":
        return "boolean[]"
    inner = ts_type(items)
    return "any[]" if inner == "object | object" or len(inner) > 50 else inner + "[]"


def _one_of(variants: Sequence[Any]) -> str:
    parts = []
    for variant in variants:
        text = ts_type(variant)
        if isinstance(variant, Mapping):
            if variant.get("description"):
                text += "// " + str(variant["description"])
            if "default" in variant:
                text += _VARIANT_DEFAULT_GAP + "// default: " + _to_json(variant["default"])
        parts.append(text)
    return " | \n".join(parts)


def ts_type(schema: Any) -> str:
    """TypeScript-like type of one JSON-schema parameter, as the released Apertus template writes it.

    string, number/integer (``number``), boolean, string enums (``"a" | "b"``), arrays
    (``string[]`` for any array of strings, enums included), objects (nested properties
    inline, else ``object``), a list of types (joined as written: ``integer | null``), and
    ``oneOf`` variants; anything else is ``any``. ``nullable`` adds `` | null`` to plain
    strings and to arrays only: the release drops it for numbers, booleans and enums.
    """
    if not isinstance(schema, Mapping):
        return "any"
    kind = schema.get("type")
    null = " | null" if schema.get("nullable") else ""
    if kind == "array":
        return _array_type(schema.get("items")) + null
    if isinstance(kind, (list, tuple)) and kind:
        return " | ".join(str(k) for k in kind)
    if schema.get("oneOf"):
        return _one_of(schema["oneOf"])
    if kind == "string":
        enum = schema.get("enum")
        if enum:
            return " | ".join(f'"{v}"' for v in enum)
        return "string" + null
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "object":
        props = schema.get("properties")
        if not props:
            return "object"
        required = schema.get("required") or []
        fields = [f"{name}{'' if name in required else '?'}: {_NESTED_TYPE_GAP}{ts_type(spec)}"
                  for name, spec in props.items()]
        return "{\n" + ", ".join(fields) + "}"
    return "any"


def _default_comment(spec: Mapping[str, Any]) -> str:
    """A parameter's default as the release writes it after the type: ``, // default: 5``.

    The release writes an enum's default (and a ``oneOf``'s, without the comma) as plain
    text, any other default as JSON. (Where it would fail, a non-string default of an enum
    or ``oneOf``, it is written as JSON here.)
    """
    if "default" not in spec:
        return ""
    value = spec["default"]
    text = value if isinstance(value, str) else _to_json(value)
    if spec.get("enum"):
        return ", // default: " + text
    if spec.get("oneOf"):
        return "// default: " + text
    return ", // default: " + _to_json(value)


def _comment(text: Any) -> str:
    """``// text``: only the first line gets the marker, as in the release."""
    return "// " + str(text)


def declaration(fn: Mapping[str, Any]) -> str:
    """The declaration of one bare function schema."""
    lines = []
    if fn.get("description") is not None:  # (the release fails on a tool without one)
        lines.append(_comment(fn["description"]))
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    if not props:
        lines.append(f"type {fn['name']} = () => any;")
        return "\n".join(lines)
    required = params.get("required") or []
    fields = []
    for pname, pspec in props.items():
        pspec = pspec if isinstance(pspec, Mapping) else {}
        head = _comment(pspec["description"]) + "\n" if pspec.get("description") else ""
        optional = "" if pname in required else "?"
        fields.append(f"{head}{pname}{optional}: {ts_type(pspec)}{_default_comment(pspec)}")
    lines.append(f"type {fn['name']} = (_: {{\n" + ",\n".join(fields) + "\n}) => any;")
    return "\n".join(lines)


def tool_declarations(tools: Sequence[Tool], chat_format: str = "apertus") -> str:
    """Declarations of all tools, joined by newlines, as the developer block shows them."""
    _require_tools(chat_format)
    return "\n".join(declaration(s) for s in function_schemas(tools))


def format_call(call: ToolCall) -> str:
    """One call as ``{"name": {args}}``; the arguments text is kept verbatim."""
    return "{" + json.dumps(call.name, ensure_ascii=False) + ": " + call.arguments + "}"


def format_calls(calls: Iterable[ToolCall]) -> str:
    """A list of calls between the tools markers, as the model writes them."""
    return TOOLS_PREFIX + "[" + ", ".join(format_call(c) for c in calls) + "]" + TOOLS_SUFFIX


def format_tool_calls(calls: Sequence[Mapping[str, Any]], chat_format: str = "apertus") -> str:
    """Render ``[{"name", "arguments"}]`` as the model would generate them (inverse of parsing)."""
    _require_tools(chat_format)
    made = []
    for k, c in enumerate(calls):
        if not isinstance(c, Mapping):
            raise InputError(f"calls[{k}]: a call must be a mapping with 'name' and 'arguments'")
        made.append(make_call(c.get("name"), c.get("arguments"), f"calls[{k}]"))
    return format_calls(made)


def _require_tools(chat_format: str) -> None:
    fmt = get_format(chat_format)
    if not fmt.supports_tools:
        raise ConfigError(f"format {fmt.name!r} has no tool rendering; use chat_format='apertus' "
                          "for tool declarations and tool calls")


def _parse_block(body: str, at: int) -> list[dict[str, Any]]:
    try:
        items = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as err:
        raise InputError(f"tool call block at char {at} is not valid JSON ({err}): {body!r}") \
            from None
    if not isinstance(items, list) or not items:
        raise InputError(f"tool call block at char {at} must be a non-empty JSON list of "
                         f'{{"name": {{arguments}}}} objects: {body!r}')
    calls = []
    for k, item in enumerate(items):
        if not (isinstance(item, dict) and len(item) == 1):
            raise InputError(f"tool call block at char {at}: call {k} must be an object with "
                             f"exactly one key (the tool name), got {item!r}")
        (name, args), = item.items()
        if not isinstance(args, dict):
            raise InputError(f"tool call block at char {at}: arguments of call {k} ({name!r}) "
                             f"must be a JSON object, got {args!r}")
        calls.append({"name": name, "arguments": args})
    return calls


def parse_tool_calls(text: str, chat_format: str = "apertus") -> list[dict[str, Any]]:
    """Every tool call in generated assistant text, in order, as ``{"name", "arguments"}``.

    Text with no tool-call block gives ``[]``. A block without its closing marker, a
    closing marker without an opening one, or a body that is not a JSON list of
    ``{"name": {...}}`` objects raises ``InputError`` (a ``ValueError``) saying which and where.
    """
    _require_tools(chat_format)
    calls: list[dict[str, Any]] = []
    pos = 0
    while True:
        start = text.find(TOOLS_PREFIX, pos)
        stray = text.find(TOOLS_SUFFIX, pos)
        if stray != -1 and (start == -1 or stray < start):
            raise InputError(f"{TOOLS_SUFFIX} at char {stray} has no {TOOLS_PREFIX} before it")
        if start == -1:
            return calls
        body_start = start + len(TOOLS_PREFIX)
        end = text.find(TOOLS_SUFFIX, body_start)
        if end == -1:
            raise InputError(f"tool call block at char {start} is not closed by {TOOLS_SUFFIX}")
        calls.extend(_parse_block(text[body_start:end], start))
        pos = end + len(TOOLS_SUFFIX)
