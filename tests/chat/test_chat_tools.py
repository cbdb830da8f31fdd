"""Tool declarations (schemas and Python functions) and tool-call parsing."""

from __future__ import annotations

from typing import Literal

import pytest
from chat_cases import DATE, SEARCH, TIME, WEATHER, by_name

from align.chat import format_tool_calls, parse_tool_calls, render, tool_declarations


def get_forecast(
    city: str,
    unit: Literal["celsius", "fahrenheit"] = "celsius",
    days: int | None = None,
    hourly: bool = False,
    stations: list[str] | None = None,
) -> dict:
    """Get the weather forecast for a city.

    Args:
        city: Name of the city.
        unit: Temperature unit.
        days: Number of days
            to forecast.
        hourly: Whether to include hourly data.
        stations: Weather stations to use.
    """
    return {}


def test_declaration_from_a_python_function():
    assert tool_declarations([get_forecast]) == (
        "// Get the weather forecast for a city.\n"
        "type get_forecast = (_: {\n"
        "// Name of the city.\n"
        "city: string,\n"
        "// Temperature unit.\n"
        'unit?: "celsius" | "fahrenheit",\n'
        "// Number of days to forecast.\n"
        "days?: number,\n"  # the release drops nullable for numbers
        "// Whether to include hourly data.\n"
        "hourly?: boolean,\n"
        "// Weather stations to use.\n"
        "stations?: string[] | null\n"
        "}) => any;"
    )


def test_declarations_join_schemas_and_functions_by_newline():
    def ping() -> str:
        """Check the service is up."""
        return "pong"

    assert tool_declarations([WEATHER, ping, TIME]) == (
        "// Get the current weather for a city.\n"
        "type get_weather = (_: {\n// City name\ncity: string\n}) => any;\n"
        "// Check the service is up.\ntype ping = () => any;\n"
        "// Current time.\ntype get_time = () => any;"
    )


def test_parameter_type_mapping():
    assert tool_declarations([SEARCH]).splitlines()[3:] == [
        "// Search terms",
        "query: string,",
        "// Maximum number of results",
        "limit?: number,",
        "min_score?: number,",
        "// Also return old articles",
        "include_old?: boolean,",
        'sort: "date" | "relevance",',
        "tags?: string[],",
        "region?: string | null,",
        "filters?: object,",
        "ids?: number[] | null,",
        "modes?: string[]",
        "}) => any;",
    ]


@pytest.mark.parametrize("tools,pattern", [
    ([WEATHER, WEATHER], r"tools\[1\]: tool 'get_weather' is declared twice"),
    ([{"name": "bad name"}], r"tools\[0\]: tool name must be a non-empty string without spaces"),
    ([{"name": "f", "parameters": "x"}], r"tools\[0\] \('f'\): 'parameters' must be"),
    ([42], r"tools\[0\]: a tool must be a schema dict or a callable"),
])
def test_bad_tool_schemas_raise(tools, pattern):
    with pytest.raises(ValueError, match=pattern):
        tool_declarations(tools)


def test_function_without_argument_docs_raises():
    def undocumented(x: int) -> int:
        """Do something."""
        return x

    with pytest.raises(ValueError, match=r"tools\[0\]: cannot build a schema from function "
                       "'undocumented'"):
        tool_declarations([undocumented])


def test_rendered_calls_parse_back():
    case = by_name("apertus_parallel_calls")
    text = render(case.messages, tools=case.tools, chat_date=DATE)
    assert parse_tool_calls(text) == [
        {"name": "get_weather", "arguments": {"city": "Bern"}},
        {"name": "get_weather", "arguments": {"city": "Zurich"}},
        {"name": "get_time", "arguments": {}},
    ]


def test_format_and_parse_round_trip():
    calls = [
        {"name": "search_news", "arguments": {"query": "Zürich", "limit": 3, "tags": ["a", "b"],
                                              "include_old": False, "region": None}},
        {"name": "get_time", "arguments": {}},
    ]
    text = format_tool_calls(calls)
    assert text == (
        '<|tools_prefix|>[{"search_news": {"query": "Zürich", "limit": 3, "tags": ["a", "b"], '
        '"include_old": false, "region": null}}, {"get_time": {}}]<|tools_suffix|>'
    )
    assert parse_tool_calls("Let me look. " + text + " Then answer.") == calls


def test_text_without_calls_parses_to_nothing():
    assert parse_tool_calls("<|inner_prefix|>No tools needed.<|inner_suffix|>Hello.") == []


@pytest.mark.parametrize("text,pattern", [
    ('<|tools_prefix|>[{"f": {}}]', r"tool call block at char 0 is not closed"),
    ('x [{"f": {}}]<|tools_suffix|>', r"<\|tools_suffix\|> at char 13 has no <\|tools_prefix\|>"),
    ("<|tools_prefix|>[{f: 1}]<|tools_suffix|>", r"at char 0 is not valid JSON"),
    ('<|tools_prefix|>{"f": {}}<|tools_suffix|>', r"must be a non-empty JSON list"),
    ("<|tools_prefix|>[]<|tools_suffix|>", r"must be a non-empty JSON list"),
    ('<|tools_prefix|>[{"f": {}, "g": {}}]<|tools_suffix|>', (r"call 0 must be an object with "
     "exactly one key")),
    ('<|tools_prefix|>[{"f": [1]}]<|tools_suffix|>', (r"arguments of call 0 \('f'\) must be a "
     "JSON object")),
])
def test_malformed_calls_raise(text, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_tool_calls(text)


def test_formats_without_tools_refuse_tool_helpers():
    with pytest.raises(ValueError, match="format 'chatml' has no tool rendering"):
        parse_tool_calls("x", chat_format="chatml")
    with pytest.raises(ValueError, match="format 'llama3' has no tool rendering"):
        tool_declarations([WEATHER], chat_format="llama3")
