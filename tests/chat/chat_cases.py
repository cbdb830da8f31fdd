"""One shared list of test conversations, each with its expected text and trained text.

Every expected string is written out by hand from docs/method.md, The Apertus chat format; ``trained`` lists the runs of
consecutive trained tokens, decoded, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATE = "2025-09-21"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
TIME = {"name": "get_time", "description": "Current time."}  # bare function form, no params
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_news",
        "description": "Search news articles.\nReturns at most `limit` results.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Search terms"},
                "limit": {"type": "integer", "description": "Maximum number of results"},
                "min_score": {"type": "number"},
                "include_old": {"type": "boolean", "description": "Also return old articles"},
                "sort": {"type": "string", "enum": ["date", "relevance"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "region": {"type": ["string", "null"]},
                "filters": {"type": "object"},
                "ids": {"type": "array", "items": {"type": "integer"}, "nullable": True},
                "modes": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            },
            "required": ["query", "sort"],
        },
    },
}

DEFAULT_SYSTEM = (
    "<s><|system_start|>You are a helpful, honest and harmless assistant.\n"
    "Current date: 2025-09-21<|system_end|>"
)
DEV_OFF = "<|developer_start|>Deliberation: disabled\nTool Capabilities: disabled<|developer_end|>"
DEV_WEATHER = (
    "<|developer_start|>Deliberation: disabled\nTool Capabilities:\n"
    "// Get the current weather for a city.\n"
    "type get_weather = (_: {\n// City name\ncity: string\n}) => any;<|developer_end|>"
)


@dataclass
class Case:
    name: str
    format: str
    messages: list[dict[str, Any]]
    expected: str
    trained: list[str]
    tools: list[Any] | None = None
    add_generation_prompt: bool = False
    enable_thinking: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case(
        "apertus_plain_with_system",
        "apertus",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
        ],
        "<s><|system_start|>You are terse.<|system_end|>"
        "<|developer_start|>Deliberation: disabled\nTool Capabilities: disabled<|developer_end|>"
        "<|user_start|>What is 2+2?<|user_end|><|assistant_start|>4.<|assistant_end|>",
        ["4.<|assistant_end|>"],
    ),
    Case(
        "apertus_plain_default_system",
        "apertus",
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
        ],
        "<s><|system_start|>You are a helpful, honest and harmless assistant.\n"
        "Current date: 2025-09-21<|system_end|>"
        "<|developer_start|>Deliberation: disabled\nTool Capabilities: disabled<|developer_end|>"
        "<|user_start|>Hi<|user_end|><|assistant_start|>Hello! How can I help?<|assistant_end|>",
        ["Hello! How can I help?<|assistant_end|>"],
    ),
    Case(
        "apertus_multi_turn_structured",
        "apertus",
        [
            {"role": "system", "content": {"text": "Be brief."}},
            {
                "role": "user",
                "content": {
                    "parts": [
                        {"type": "text", "text": "Name a "},
                        {"type": "text", "text": "colour."},
                    ]
                },
            },
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"},
            {"role": "assistant", "content": "Green."},
        ],
        "<s><|system_start|>Be brief.<|system_end|>" + DEV_OFF
        + "<|user_start|>Name a colour.<|user_end|><|assistant_start|>Blue.<|assistant_end|>"
        "<|user_start|>Another?<|user_end|><|assistant_start|>Green.<|assistant_end|>",
        ["Blue.<|assistant_end|>", "Green.<|assistant_end|>"],
    ),
    Case(
        "apertus_thinking",
        "apertus",
        [
            {"role": "user", "content": "Is 17 prime?"},
            {
                "role": "assistant",
                "content": {
                    "blocks": [
                        {"type": "thoughts", "text": "17 has no divisors between 2 and 4."},
                        {"type": "response", "text": "Yes, 17 is prime."},
                    ]
                },
            },
        ],
        DEFAULT_SYSTEM
        + "<|developer_start|>Deliberation: enabled\nTool Capabilities: disabled<|developer_end|>"
        "<|user_start|>Is 17 prime?<|user_end|><|assistant_start|><|inner_prefix|>17 has no "
        "divisors between 2 and 4.<|inner_suffix|>Yes, 17 is prime.<|assistant_end|>",
        [
            ("<|inner_prefix|>17 has no divisors between 2 and 4.<|inner_suffix|>"
            "Yes, 17 is prime.<|assistant_end|>")
        ],
        enable_thinking=True,
    ),
    Case(
        "apertus_tool_call_blocks",
        "apertus",
        [
            {"role": "user", "content": "Weather in Bern?"},
            {
                "role": "assistant",
                "content": {
                    "blocks": [
                        {"type": "thoughts", "text": "I should look it up."},
                        {
                            "type": "tool_calls",
                            "calls": [{"name": "get_weather", "arguments": '{"city": "Bern"}'}],
                        },
                        {"type": "tool_outputs", "outputs": [{"output": '{"temperature": 21}'}]},
                        {"type": "response", "text": "It is 21 degrees in Bern."},
                    ]
                },
            },
        ],
        DEFAULT_SYSTEM + DEV_WEATHER
        + "<|user_start|>Weather in Bern?<|user_end|><|assistant_start|><|inner_prefix|>I should "
        'look it up.<|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|>'
        '[{"temperature": 21}]<|inner_suffix|>It is 21 degrees in Bern.<|assistant_end|>',
        [
            ('<|inner_prefix|>I should look it up.<|tools_prefix|>[{"get_weather": '
            '{"city": "Bern"}}]<|tools_suffix|>'),
            "<|inner_suffix|>It is 21 degrees in Bern.<|assistant_end|>",
        ],
        tools=[WEATHER],
    ),
    Case(
        "apertus_parallel_calls",
        "apertus",
        [
            {"role": "user", "content": "Weather in Bern and Zurich, and the time?"},
            {
                "role": "assistant",
                "content": {
                    "blocks": [
                        {
                            "type": "tool_calls",
                            "calls": [
                                {"name": "get_weather", "arguments": '{"city": "Bern"}'},
                                {"name": "get_weather", "arguments": {"city": "Zurich"}},
                                {"name": "get_time", "arguments": {}},
                            ],
                        },
                        {
                            "type": "tool_outputs",
                            "outputs": [{"output": "18"}, {"output": "20"}, {"output": '"12:00"'}],
                        },
                        {"type": "response", "text": "Bern 18, Zurich 20, it is 12:00."},
                    ]
                },
            },
        ],
        DEFAULT_SYSTEM
        + "<|developer_start|>Deliberation: disabled\nTool Capabilities:\n"
        "// Get the current weather for a city.\n"
        "type get_weather = (_: {\n// City name\ncity: string\n}) => any;\n"
        "// Current time.\ntype get_time = () => any;<|developer_end|>"
        "<|user_start|>Weather in Bern and Zurich, and the time?<|user_end|><|assistant_start|>"
        '<|tools_prefix|>[{"get_weather": {"city": "Bern"}}, {"get_weather": {"city": "Zurich"}}, '
        '{"get_time": {}}]<|tools_suffix|>[18, 20, "12:00"]Bern 18, Zurich 20, it is 12:00.'
        "<|assistant_end|>",
        [
            ('<|tools_prefix|>[{"get_weather": {"city": "Bern"}}, {"get_weather": {"city": '
            '"Zurich"}}, {"get_time": {}}]<|tools_suffix|>'),
            "Bern 18, Zurich 20, it is 12:00.<|assistant_end|>",
        ],
        tools=[WEATHER, TIME],
    ),
    Case(
        "apertus_openai_tool_messages",
        "apertus",
        [
            {"role": "user", "content": "Compare Bern and Geneva."},
            {
                "role": "assistant",
                "content": "Let me check both.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Geneva"}},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18"},
            {"role": "tool", "tool_call_id": "call_2", "content": "22"},
            {"role": "assistant", "content": "Geneva is warmer (22 vs 18)."},
        ],
        DEFAULT_SYSTEM + DEV_WEATHER
        + "<|user_start|>Compare Bern and Geneva.<|user_end|><|assistant_start|>Let me check both."
        '<|tools_prefix|>[{"get_weather": {"city": "Bern"}}, {"get_weather": {"city": "Geneva"}}]'
        "<|tools_suffix|>[18, 22]Geneva is warmer (22 vs 18).<|assistant_end|>",
        [
            ('Let me check both.<|tools_prefix|>[{"get_weather": {"city": "Bern"}}, '
            '{"get_weather": {"city": "Geneva"}}]<|tools_suffix|>'),
            "Geneva is warmer (22 vs 18).<|assistant_end|>",
        ],
        tools=[WEATHER],
    ),
    Case(
        "apertus_tool_parameter_types",
        "apertus",
        [
            {"role": "user", "content": "News about Bern, newest first."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {
                            "name": "search_news",
                            "arguments": {"query": "Bern", "sort": "date", "tags": ["local"]},
                        },
                    }
                ],
            },
            {"role": "tool", "content": "[]"},
            {"role": "assistant", "content": "I found no recent news about Bern."},
        ],
        DEFAULT_SYSTEM
        + "<|developer_start|>Deliberation: disabled\nTool Capabilities:\n"
        "// Search news articles.\n"
        "Returns at most `limit` results.\n"  # the release marks the first line only
        "type search_news = (_: {\n"
        "// Search terms\n"
        "query: string,\n"
        "// Maximum number of results\n"
        "limit?: number,\n"
        "min_score?: number,\n"
        "// Also return old articles\n"
        "include_old?: boolean,\n"
        'sort: "date" | "relevance",\n'
        "tags?: string[],\n"
        "region?: string | null,\n"
        "filters?: object,\n"
        "ids?: number[] | null,\n"
        "modes?: string[]\n"  # an array of string enums, as the release writes it
        "}) => any;\n"
        "// Current time.\n"
        "type get_time = () => any;<|developer_end|>"
        "<|user_start|>News about Bern, newest first.<|user_end|><|assistant_start|>"
        '<|tools_prefix|>[{"search_news": {"query": "Bern", "sort": "date", "tags": ["local"]}}]'
        "<|tools_suffix|>[[]]I found no recent news about Bern.<|assistant_end|>",
        [
            ('<|tools_prefix|>[{"search_news": {"query": "Bern", "sort": "date", "tags": '
            '["local"]}}]<|tools_suffix|>'),
            "I found no recent news about Bern.<|assistant_end|>",
        ],
        tools=[SEARCH, TIME],
    ),
    Case(
        "apertus_generation_prompt",
        "apertus",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
        "<s><|system_start|>You are terse.<|system_end|>" + DEV_OFF
        + "<|user_start|>Hi<|user_end|><|assistant_start|>Hello.<|assistant_end|>"
        "<|user_start|>Bye<|user_end|><|assistant_start|>",
        ["Hello.<|assistant_end|>"],
        add_generation_prompt=True,
    ),
    Case(
        "apertus_continue_after_tool_output",
        "apertus",
        [
            {"role": "user", "content": "Weather in Bern?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}
                ],
            },
            {"role": "tool", "content": "21"},
        ],
        DEFAULT_SYSTEM + DEV_WEATHER
        + "<|user_start|>Weather in Bern?<|user_end|><|assistant_start|>"
        '<|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|>[21]',
        ['<|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|>'],
        tools=[WEATHER],
        add_generation_prompt=True,
    ),
    Case(
        "apertus_blocks_with_tool_messages",
        "apertus",
        [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": {"parts": [{"type": "text", "text": "Good morning"}]}},
            {
                "role": "assistant",
                "content": {
                    "blocks": [
                        {"type": "thoughts", "text": "Check the time first."},
                        {"type": "tool_calls", "calls": [{"name": "get_time", "arguments": "{}"}]},
                    ]
                },
            },
            {"role": "tool", "content": '"09:00"'},
            {"role": "assistant", "content": {"blocks": [{"type": "response", "text": "Morning!"}]}},
        ],
        "<s><|system_start|>You are helpful.<|system_end|>"
        "<|developer_start|>Deliberation: disabled\nTool Capabilities:\n"
        "// Current time.\ntype get_time = () => any;<|developer_end|>"
        "<|user_start|>Good morning<|user_end|><|assistant_start|><|inner_prefix|>Check the time "
        'first.<|tools_prefix|>[{"get_time": {}}]<|tools_suffix|>["09:00"]<|inner_suffix|>'
        "Morning!<|assistant_end|>",
        [
            ('<|inner_prefix|>Check the time first.<|tools_prefix|>[{"get_time": {}}]'
            "<|tools_suffix|>"),
            "<|inner_suffix|>Morning!<|assistant_end|>",
        ],
        tools=[TIME],
    ),
    Case(
        "llama3_plain_with_system",
        "llama3",
        [
            {"role": "system", "content": "Tu es utile."},
            {"role": "user", "content": "Donne un conseil."},
            {"role": "assistant", "content": "Dormez bien."},
        ],
        "<s><|start_header_id|>system<|end_header_id|>\n\nTu es utile.\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nDonne un conseil.\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nDormez bien.\n\n<|eot_id|>",
        ["Dormez bien.\n\n<|eot_id|>"],
    ),
    Case(
        "llama3_multi_turn",
        "llama3",
        [
            {"role": "user", "content": "One?"},
            {"role": "assistant", "content": "1"},
            {"role": "user", "content": "Two?"},
            {"role": "assistant", "content": {"blocks": [{"type": "response", "text": "2"}]}},
        ],
        "<s><|start_header_id|>user<|end_header_id|>\n\nOne?\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n1\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nTwo?\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n2\n\n<|eot_id|>",
        ["1\n\n<|eot_id|>", "2\n\n<|eot_id|>"],
    ),
    Case(
        "llama3_generation_prompt",
        "llama3",
        [
            {"role": "user", "content": "Bonjour"},
            {"role": "assistant", "content": "Salut !"},
            {"role": "user", "content": "Ça va ?"},
        ],
        "<s><|start_header_id|>user<|end_header_id|>\n\nBonjour\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nSalut !\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nÇa va ?\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ["Salut !\n\n<|eot_id|>"],
        add_generation_prompt=True,
    ),
    Case(
        "chatml_plain_with_system",
        "chatml",
        [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
        ],
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n",
        ["Hello.<|im_end|>"],
    ),
    Case(
        "chatml_multi_turn_generation_prompt",
        "chatml",
        [
            {"role": "user", "content": "A?"},
            {"role": "assistant", "content": {"blocks": [{"type": "response", "text": "B."}]}},
            {"role": "user", "content": "C?"},
        ],
        "<|im_start|>user\nA?<|im_end|>\n<|im_start|>assistant\nB.<|im_end|>\n"
        "<|im_start|>user\nC?<|im_end|>\n<|im_start|>assistant\n",
        ["B.<|im_end|>"],
        add_generation_prompt=True,
    ),
]

CASE_IDS = [c.name for c in CASES]


def by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def trained_runs(tokenizer: Any, ids: list[int], mask: list[int]) -> list[str]:
    """Decode each run of consecutive trained tokens separately."""
    runs: list[list[int]] = []
    previous = 0
    for token, m in zip(ids, mask):
        if m and not previous:
            runs.append([])
        if m:
            runs[-1].append(token)
        previous = m
    return [tokenizer.decode(r, skip_special_tokens=False) for r in runs]


def template_kwargs(case: Case) -> dict[str, Any]:
    """The apply_chat_template arguments that mirror render(case...) with chat_date=DATE."""
    return {
        "tools": case.tools,
        "add_generation_prompt": case.add_generation_prompt,
        "enable_thinking": case.enable_thinking,
        "date_string": DATE,
    }
