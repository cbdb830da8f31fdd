"""Tool declarations written as the released Apertus chat template writes them.

A served Apertus model (vLLM renders its prompt with the released template) sees these
declarations, so ours must be the same bytes: parameter defaults as a trailing comment,
``string[]`` for an array of string enums, ``//`` on the first line of a multi-line
description only, and ``| null`` only where the release writes it (plain strings, arrays,
type lists). Each expected string below is written out by hand, and both the Python
renderer (``render``/``tool_declarations``) and the installed jinja template
(``tokenizer.apply_chat_template``) must produce it.
"""

from __future__ import annotations

import pytest

from align.chat import install_format, render, tool_declarations


def tool(props, required=(), description="Look it up."):
    return {"type": "function", "function": {"name": "lookup", "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)}}}


def body(*fields: str) -> str:
    return "// Look it up.\ntype lookup = (_: {\n" + "".join(fields) + "}) => any;"


CASES = {
    # --- defaults: a trailing comment after the type (JSON, an enum's as plain text); the
    # separating comma of a parameter that is not the last lands after the comment
    "default_number": (tool({"n": {"type": "integer", "default": 5}}),
                       body("n?: number, // default: 5\n")),
    "default_string": (tool({"s": {"type": "string", "default": 'say "hi"'}}),
                       body('s?: string, // default: "say \\"hi\\""\n')),
    "default_boolean": (tool({"b": {"type": "boolean", "default": False}}),
                        body("b?: boolean, // default: false\n")),
    "default_null": (tool({"a": {"type": "array", "items": {"type": "string"}, "nullable": True, "default": None}}),
                     body("a?: string[] | null, // default: null\n")),
    "default_list_and_object": (tool({"l": {"type": "array", "items": {"type": "number"}, "default": [1, 2.5]},
                                      "o": {"type": "object", "default": {"k": "ü"}}}),
                                body("l?: number[], // default: [1, 2.5],\n",
                                     'o?: object, // default: {"k": "ü"}\n')),
    "default_enum": (tool({"unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                           "city": {"type": "string"}}, required=["city"]),
                     body('unit?: "celsius" | "fahrenheit", // default: celsius,\n', "city: string\n")),
    "default_one_of": (tool({"mode": {"oneOf": [{"type": "string"}, {"type": "number"}], "default": "auto"}}),
                       body("mode?: string | \nnumber// default: auto\n")),
    # --- arrays
    "array_of_string_enums": (tool({"m": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}}),
                              body("m?: string[]\n")),
    "array_kinds": (tool({"i": {"type": "array", "items": {"type": "integer"}},
                          "b": {"type": "array", "items": {"type": "boolean"}},
                          "nested": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
                          "bare": {"type": "array"}}),
                    body("i?: number[],\n", "b?: boolean[],\n", "nested?: string[][],\n", "bare?: any[]\n")),
    # --- multi-line descriptions: only the first line is marked
    "multi_line_descriptions": (tool({"q": {"type": "string", "description": "Search terms.\nQuoted phrases work."}},
                                     required=["q"], description="Look it up.\nReturns JSON."),
                                ("// Look it up.\nReturns JSON.\ntype lookup = (_: {\n"
                                 "// Search terms.\nQuoted phrases work.\nq: string\n}) => any;")),
    # --- nullable parameters of every type
    "nullable_string": (tool({"s": {"type": "string", "nullable": True}}), body("s?: string | null\n")),
    "nullable_number": (tool({"x": {"type": "number", "nullable": True}}), body("x?: number\n")),
    "nullable_integer": (tool({"k": {"type": "integer", "nullable": True}}), body("k?: number\n")),
    "nullable_boolean": (tool({"f": {"type": "boolean", "nullable": True}}), body("f?: boolean\n")),
    "nullable_enum": (tool({"e": {"type": "string", "enum": ["a", "b"], "nullable": True}}),
                      body('e?: "a" | "b"\n')),
    "nullable_array": (tool({"a": {"type": "array", "items": {"type": "integer"}, "nullable": True},
                             "any_items": {"type": "array", "nullable": True}}),
                       body("a?: number[] | null,\n", "any_items?: any[] | null\n")),
    "type_lists": (tool({"k": {"type": ["integer", "null"]}, "s": {"type": ["string", "number", "null"]},
                         "one": {"type": ["boolean"]}}),
                   body("k?: integer | null,\n", "s?: string | number | null,\n", "one?: boolean\n")),
    # --- objects and unions
    "object_without_properties": (tool({"o": {"type": "object"}}), body("o?: object\n")),
    "nested_object": (tool({"o": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                                  "required": ["a"]}}),
                      body("o?: {\na: \n" + " " * 16 + "string, b?: \n" + " " * 16 + "number}\n")),
    "one_of_with_description_and_default": (
        tool({"u": {"oneOf": [{"type": "string", "description": "a name"}, {"type": "integer", "default": 3}]}}),
        body("u?: string// a name | \nnumber" + " " * 20 + "// default: 3\n")),
    "schema_without_type": (tool({"x": {}, "e": {"enum": ["p", "q"]}}), body("x?: any,\n", "e?: any\n")),
    "no_parameters": (tool({}), "// Look it up.\ntype lookup = () => any;"),
    "empty_description": (tool({}, description=""), "// \ntype lookup = () => any;"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_declaration_matches_the_release(name):
    schema, expected = CASES[name]
    assert tool_declarations([schema]) == expected


@pytest.mark.parametrize("name", list(CASES))
def test_jinja_template_writes_the_same_declaration(name, tokenizer):
    schema, expected = CASES[name]
    install_format(tokenizer, chat_format="apertus")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    served = tokenizer.apply_chat_template(messages, tools=[schema], tokenize=False, add_generation_prompt=True)
    assert served == render(messages, tools=[schema], add_generation_prompt=True)
    start = served.index("Tool Capabilities:\n") + len("Tool Capabilities:\n")
    assert served[start:served.index("<|developer_end|>")] == expected


def test_declarations_of_several_tools_are_joined_by_one_newline():
    first, _ = CASES["default_number"]
    second = {"name": "ping", "description": "Check the service."}
    assert tool_declarations([first, second]) == (
        "// Look it up.\ntype lookup = (_: {\nn?: number, // default: 5\n}) => any;\n"
        "// Check the service.\ntype ping = () => any;")


def test_a_tool_without_description_has_no_comment_line():
    # the release fails on it (it adds text to an undefined value); we leave the line out
    assert tool_declarations([{"name": "ping"}]) == "type ping = () => any;"
