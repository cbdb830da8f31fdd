"""render(): hand-written expected text per format, the jinja template's equality, errors."""

from __future__ import annotations

import datetime as dt

import jinja2
import pytest
from chat_cases import CASE_IDS, CASES, DATE, WEATHER, by_name, template_kwargs

from align.chat import FORMATS, chat_template, render


def _render(case):
    return render(case.messages, chat_format=case.format, tools=case.tools,
                  add_generation_prompt=case.add_generation_prompt,
                  enable_thinking=case.enable_thinking, chat_date=DATE)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_render_gives_the_hand_written_text(case):
    assert _render(case) == case.expected


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_jinja_template_renders_exactly_what_render_renders(case, tokenizer):
    text = tokenizer.apply_chat_template(case.messages, chat_template=chat_template(case.format),
                                         tokenize=False, **template_kwargs(case))
    assert text == _render(case)


def test_every_format_is_registered_with_its_eos():
    assert {name: f.eos for name, f in FORMATS.items()} == {
        "apertus": "<|assistant_end|>", "llama3": "<|eot_id|>", "chatml": "<|im_end|>"}


def test_generation_prompt_after_user_matches_released_apertus_form():
    text = render([{"role": "user", "content": "Give me a brief explanation of gravity."}],
                  add_generation_prompt=True, chat_date="2025-09-21")
    assert text == (
        "<s><|system_start|>You are a helpful, honest and harmless assistant.\n"
        "Current date: 2025-09-21<|system_end|>"
        "<|developer_start|>Deliberation: disabled\nTool Capabilities: disabled<|developer_end|>"
        "<|user_start|>Give me a brief explanation of gravity.<|user_end|><|assistant_start|>"
    )


def test_prompt_plus_completion_renders_as_the_full_conversation():
    for name in ("apertus_generation_prompt", "apertus_continue_after_tool_output"):
        case = by_name(name)
        prompt = render(case.messages, tools=case.tools, add_generation_prompt=True, chat_date=DATE)
        full = render(case.messages + [{"role": "assistant", "content": "Done."}],
                      tools=case.tools, chat_date=DATE)
        assert full == prompt + "Done.<|assistant_end|>"


def test_date_accepts_date_objects_and_defaults_to_today(tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    assert render(messages, chat_date=dt.date(2025, 9, 21)) == render(messages, chat_date="2025-09-21")
    assert render(messages, chat_date=dt.datetime(2025, 9, 21, 23, 59)) == render(messages, chat_date=DATE)
    today = render(messages)
    assert f"Current date: {dt.date.today().isoformat()}<|system_end|>" in today
    templated = tokenizer.apply_chat_template(messages, chat_template=chat_template("apertus"),
                                              tokenize=False)
    assert templated == today
    with pytest.raises(ValueError, match="date must be"):
        render(messages, chat_date=20250921)


def test_callable_tools_render_like_the_template(tokenizer):
    def get_weather(city: str) -> str:
        """Get the current weather for a city.

        Args:
            city: City name
        """
        return city

    messages = [{"role": "user", "content": "Weather?"}]
    text = render(messages, tools=[get_weather], chat_date=DATE)
    assert text == render(messages, tools=[WEATHER], chat_date=DATE)
    templated = tokenizer.apply_chat_template(messages, chat_template=chat_template("apertus"),
                                              tokenize=False, tools=[get_weather],
                                              date_string=DATE)
    assert templated == text


def _call(name, arguments):
    return {"type": "tool_calls", "calls": [{"name": name, "arguments": arguments}]}


USER = {"role": "user", "content": "Q"}

# (format, messages, tools, enable_thinking, error pattern, the jinja template raises too)
BAD_INPUTS = {
    "empty": ("apertus", [], None, False, "conversation is empty", False),
    "unknown_role": ("apertus", [USER, {"role": "robot", "content": "x"}], None, False,
                     r"message 1 \(robot\): unknown role 'robot'", True),
    "developer_role": ("apertus", [{"role": "developer", "content": "x"}, USER], None, False,
                       r"message 0 \(developer\): unknown role 'developer'.*developer block",
                       True),
    "system_not_first": ("apertus", [USER, {"role": "system", "content": "x"}], None, False,
                         r"message 1 \(system\): a system message is only allowed at index 0",
                         True),
    "tool_outside_turn": ("apertus", [USER, {"role": "tool", "content": "1"}], None, False,
                          r"message 1 \(tool\): tool message outside an assistant turn", True),
    "tool_first": ("apertus", [{"role": "tool", "content": "1"}], None, False,
                   r"message 0 \(tool\): tool message outside an assistant turn", True),
    "unknown_block": ("apertus", [USER, {"role": "assistant", "content": {
        "blocks": [{"type": "summary", "text": "x"}]}}], None, False,
        r"message 1 \(assistant\): block 0 has unknown block type 'summary'", True),
    "mixed_string_then_blocks": ("apertus", [USER, {"role": "assistant", "content": "a"},
                                             {"role": "assistant", "content": {"blocks": [
                                                 {"type": "response", "text": "b"}]}}],
                                 None, False,
                                 (r"message 2 \(assistant\): blocks content in an assistant turn "
                                 r"whose message 1 has string content"), True),
    "mixed_blocks_then_string": ("apertus", [USER, {"role": "assistant", "content": {"blocks": [
        _call("get_time", "{}")]}}, {"role": "tool", "content": "1"},
        {"role": "assistant", "content": "b"}], None, False,
        (r"message 3 \(assistant\): string content in an assistant turn whose message 1 has "
        r"blocks content"), True),
    "arguments_not_json": ("apertus", [USER, {"role": "assistant", "content": {"blocks": [
        _call("get_weather", "{city: Bern}")]}}], None, False,
        (r"message 1 \(assistant\): block 0: arguments of the call to 'get_weather' are not "
        r"valid JSON"), False),
    "arguments_not_object": ("apertus", [USER, {"role": "assistant", "content": None,
                                                "tool_calls": [{"function": {
                                                    "name": "f", "arguments": "[1]"}}]}],
                             None, False, (r"message 1 \(assistant\): tool_calls\[0\]: "
                             r"arguments of the call to 'f' must be a JSON object"), False),
    "undeclared_tool": ("apertus", [USER, {"role": "assistant", "content": {"blocks": [
        _call("get_stock", "{}")]}}], [WEATHER], False,
        (r"message 1 \(assistant\): call to tool 'get_stock', which is not among the declared "
        r"tools \(get_weather\)"), True),
    "outputs_twice": ("apertus", [USER, {"role": "assistant", "content": {"blocks": [
        _call("get_time", "{}")]}}, {"role": "tool", "content": "1"},
        {"role": "assistant", "content": {"blocks": [
            {"type": "tool_outputs", "outputs": [{"output": "1"}]}]}}], None, False,
        r"message 3 \(assistant\): block 0: tool outputs given both", True),
    "special_token_in_user_text": ("apertus", [
        {"role": "user", "content": "x<|assistant_start|>y"}], None, False,
        r"message 0 \(user\): content contains the special token '<\|assistant_start\|>'", False),
    "bos_in_assistant_text": ("apertus", [USER, {"role": "assistant", "content": "a<s>b"}],
                              None, False, r"message 1 \(assistant\).*'<s>'", False),
    "reasoning_field": ("apertus", [USER, {"role": "assistant", "content": "a",
                                           "reasoning_content": "hmm"}], None, False,
                        r"message 1 \(assistant\): field 'reasoning_content'", False),
    "no_content": ("apertus", [USER, {"role": "assistant"}], None, False,
                   r"message 1 \(assistant\): message has neither content nor tool_calls", True),
    "non_text_part": ("apertus", [{"role": "user", "content": {"parts": [
        {"type": "image", "url": "x"}]}}], None, False,
        r"message 0 \(user\): part 0 has type 'image'", True),
    "llama3_tools": ("llama3", [USER], [WEATHER], False,
                     "format 'llama3' has no tool declarations", True),
    "llama3_tool_message": ("llama3", [USER, {"role": "assistant", "content": "a"},
                                       {"role": "tool", "content": "1"}], None, False,
                            (r"message 2 \(tool\): tool messages cannot be rendered in format "
                            "'llama3'"), True),
    "chatml_thoughts": ("chatml", [USER, {"role": "assistant", "content": {"blocks": [
        {"type": "thoughts", "text": "x"}]}}], None, False,
        r"message 1 \(assistant\): block 0 \(thoughts\) cannot be rendered in format 'chatml'",
        True),
    "chatml_thinking": ("chatml", [USER], None, True, "format 'chatml' has no thinking mode",
                        True),
    "chatml_openai_calls": ("chatml", [USER, {"role": "assistant", "content": None,
                                              "tool_calls": [{"function": {
                                                  "name": "f", "arguments": "{}"}}]}],
                            None, False, (r"message 1 \(assistant\): tool calls cannot be "
                            "rendered in format 'chatml'"), True),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_naming_the_message(name):
    fmt, messages, tools, thinking, pattern, _ = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=pattern):
        render(messages, chat_format=fmt, tools=tools, enable_thinking=thinking, chat_date=DATE)


@pytest.mark.parametrize("name", [n for n, v in BAD_INPUTS.items() if v[5]])
def test_jinja_template_refuses_the_same_structural_errors(name, tokenizer):
    fmt, messages, tools, thinking, _, _ = BAD_INPUTS[name]
    with pytest.raises(jinja2.TemplateError):
        tokenizer.apply_chat_template(messages, chat_template=chat_template(fmt), tokenize=False,
                                      tools=tools, enable_thinking=thinking, date_string=DATE)


def test_calls_are_not_checked_without_tools():
    messages = [USER, {"role": "assistant", "content": {"blocks": [_call("get_stock", "{}")]}}]
    assert '<|tools_prefix|>[{"get_stock": {}}]<|tools_suffix|>' in render(messages, chat_date=DATE)


def test_unknown_format_lists_known_ones():
    with pytest.raises(ValueError, match="unknown chat format 'zephyr'.*apertus"):
        render([USER], chat_format="zephyr")


def test_json_tool_payloads_render_like_the_template(tokenizer):
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": {"temperature": 21, "sky": "clear"}},
        {"role": "assistant", "content": "21 and clear."},
    ]
    text = render(messages, chat_date=DATE)
    assert ('<|tools_prefix|>[{"get_weather": {"city": "Zürich"}}]<|tools_suffix|>'
            '[{"temperature": 21, "sky": "clear"}]21 and clear.<|assistant_end|>') in text
    templated = tokenizer.apply_chat_template(messages, chat_template=chat_template("apertus"),
                                              tokenize=False, date_string=DATE)
    assert templated == text


def test_dataset_rows_with_null_fields_render_like_sparse_ones(tokenizer):
    # Arrow-backed datasets give every message every field, with None where absent.
    sparse = by_name("apertus_tool_call_blocks").messages
    nulls = {"tool_calls": None, "reasoning_content": None, "tool_call_id": None}
    dense = [{**nulls, **m} for m in sparse]
    dense[1]["content"] = {"blocks": [
        {"type": b["type"], "text": b.get("text"), "calls": b.get("calls"),
         "outputs": b.get("outputs")} for b in sparse[1]["content"]["blocks"]]}
    tools = [WEATHER]
    assert render(dense, tools=tools, chat_date=DATE) == render(sparse, tools=tools, chat_date=DATE)
    templated = tokenizer.apply_chat_template(dense, chat_template=chat_template("apertus"),
                                              tokenize=False, tools=tools, date_string=DATE)
    assert templated == render(sparse, tools=tools, chat_date=DATE)
