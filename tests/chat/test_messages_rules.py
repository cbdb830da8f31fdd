"""The edges of message normalisation and Apertus rendering that the other chat tests leave open.

A mutation check (mutmut) on align/chat/messages.py and align/chat/apertus.py showed rules no test
held: which malformed messages, blocks and tool calls are refused, with the error naming the message
(rather than read some other way or failing on a bare KeyError), how non-string tool payloads are
written, what the plain formats make of empty or split assistant text, which message each rendered
piece of an Apertus turn is labelled with (the labels give ``encode`` its message spans), the
default system text and developer block, declared tools, one kind of content per turn, turn order
and special tokens in text. Each test states one such rule as a user sees it.
"""

from __future__ import annotations

import pytest

from align.chat import apertus, render, render_segments
from align.chat.segments import Segment
from align.errors import InputError

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Weather in Bern?"}
CALL = {"type": "tool_calls", "calls": [{"name": "get_weather", "arguments": '{"city": "Bern"}'}]}
OPENAI_CALL = {"role": "assistant", "content": None,
               "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}]}
OPENING = [  # what every Apertus rendering below starts with
    Segment("<s>", None),
    Segment("<|system_start|>Be brief.<|system_end|>", 0),
    Segment("<|developer_start|>Deliberation: disabled\nTool Capabilities: disabled<|developer_end|>", None),
    Segment("<|user_start|>Weather in Bern?<|user_end|>", 1),
]


def blocks(*items):
    return {"role": "assistant", "content": {"blocks": list(items)}}


def refused(match, *items):
    """The assistant message (index 1) holding these blocks is refused with the message given."""
    with pytest.raises(InputError, match=match):
        render([USER, blocks(*items)])


# --- blocks: what is refused, and how ----------------------------------------------------


@pytest.mark.parametrize("calls", [[], None, CALL["calls"][0], "get_weather"],
                         ids=["empty", "none", "mapping", "text"])
def test_a_tool_calls_block_needs_a_non_empty_list_of_calls(calls):
    """A single call not wrapped in a list, or text, is refused for what it is, not read call by call."""
    refused(r"message 1 \(assistant\): block 0 \(tool_calls\) needs a non-empty list 'calls'",
            {"type": "tool_calls", "calls": calls})


@pytest.mark.parametrize("outputs", [[], None, "21", {"output": "21"}], ids=["empty", "none", "text", "mapping"])
def test_a_tool_outputs_block_needs_a_non_empty_list_of_outputs(outputs):
    """Text is refused rather than rendered one character per output ("[2, 1]")."""
    refused(r"message 1 \(assistant\): block 1 \(tool_outputs\) needs a non-empty list 'outputs'",
            CALL, {"type": "tool_outputs", "outputs": outputs})


@pytest.mark.parametrize("output", [{"output": None}, {"result": "21"}, 21, None],
                         ids=["null", "no_key", "int", "none"])
def test_each_tool_output_is_a_string_or_holds_a_non_null_output(output):
    with pytest.raises(InputError, match=r"message 1 \(assistant\): block 1 \(tool_outputs\): "
                                         "each output must be a string or"):
        render([USER, blocks(CALL, {"type": "tool_outputs", "outputs": [output]})])


def test_tool_outputs_render_as_given_and_as_json():
    """A string output is written as it is, an ``{"output": ...}`` value as JSON."""
    text = render([SYSTEM, USER, blocks(CALL, {"type": "tool_outputs", "outputs": [
        "21", {"output": "sunny"}, {"output": {"temp": 21}}, {"output": 0}]})])
    assert text.endswith('<|tools_suffix|>[21, sunny, {"temp": 21}, 0]<|assistant_end|>')


# --- non-string tool payloads are JSON with the characters kept as they are --------------


def test_a_tool_message_payload_keeps_non_ascii_characters():
    text = render([SYSTEM, USER, OPENAI_CALL, {"role": "tool", "content": {"temp": "21°", "city": "Zürich"}},
                   {"role": "assistant", "content": "21°."}])
    assert '[{"temp": "21°", "city": "Zürich"}]21°.' in text


def test_a_tool_outputs_block_payload_keeps_non_ascii_characters():
    payload = {"type": "tool_outputs", "outputs": [{"output": ["Zürich", "°C"]}]}
    text = render([SYSTEM, USER, blocks(CALL, payload)])
    assert text.endswith('[["Zürich", "°C"]]<|assistant_end|>')


# --- plain formats: assistant text ------------------------------------------------------


@pytest.mark.parametrize("fmt, expected", [
    ("llama3", ("<s><|start_header_id|>user<|end_header_id|>\n\nWeather in Bern?\n\n<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n\n\n<|eot_id|>")),
    ("chatml", "<|im_start|>user\nWeather in Bern?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"),
])
def test_empty_assistant_text_renders_as_nothing_in_the_plain_formats(fmt, expected):
    assert render([USER, {"role": "assistant", "content": ""}], chat_format=fmt) == expected


@pytest.mark.parametrize("fmt, expected", [
    ("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\nSunny, 21 degrees.\n\n<|eot_id|>"),
    ("chatml", "<|im_start|>assistant\nSunny, 21 degrees.<|im_end|>\n"),
])
def test_response_blocks_are_joined_with_nothing_between_them_in_the_plain_formats(fmt, expected):
    text = render([USER, blocks({"type": "response", "text": "Sunny,"},
                                {"type": "response", "text": " 21 degrees."})],
                  chat_format=fmt)
    assert text.endswith(expected)


# --- Apertus: which message each piece belongs to, and what is trained ------------------


def test_thoughts_and_response_pieces_belong_to_their_message_and_are_trained():
    got = render_segments([SYSTEM, USER, blocks({"type": "thoughts", "text": "Look it up."},
                                                {"type": "response", "text": "Sunny."})])
    assert got == OPENING + [
        Segment("<|assistant_start|>", 2),
        Segment("<|inner_prefix|>", 2, True),
        Segment("Look it up.", 2, True),
        Segment("<|inner_suffix|>", 2, True),
        Segment("Sunny.", 2, True),
        Segment("<|assistant_end|>", 2, True),
    ]


def test_a_tool_outputs_block_belongs_to_its_message_and_is_not_trained():
    got = render_segments([SYSTEM, USER, blocks(CALL, {"type": "tool_outputs", "outputs": ["21"]})])
    assert got == OPENING + [
        Segment("<|assistant_start|>", 2),
        Segment('<|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|>', 2, True),
        Segment("[21]", 2),
        Segment("<|assistant_end|>", 2, True),
    ]


def test_a_turn_ending_in_a_tool_message_closes_on_that_message():
    """The closing marker of a turn whose last message is a tool message belongs to that message."""
    got = render_segments([SYSTEM, USER, OPENAI_CALL, {"role": "tool", "content": "21"},
                           {"role": "user", "content": "Thanks"}])
    assert got == OPENING + [
        Segment("<|assistant_start|>", 2),
        Segment('<|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|>', 2, True),
        Segment("[", 3),
        Segment("21", 3),
        Segment("]", 3),
        Segment("<|assistant_end|>", 3, True),
        Segment("<|user_start|>Thanks<|user_end|>", 4),
    ]


def test_the_first_response_closes_the_thoughts_once():
    """Thoughts open <|inner_prefix|> once; the first response closes it, later responses add no marker."""
    text = render([SYSTEM, USER, blocks({"type": "thoughts", "text": "Hm."}, {"type": "response", "text": "Sunny"},
                                        {"type": "response", "text": " and warm."})])
    assert text.endswith("<|assistant_start|><|inner_prefix|>Hm.<|inner_suffix|>Sunny and warm.<|assistant_end|>")


def test_string_content_with_calls_keeps_both_and_labels_each_piece():
    """String content and OpenAI-style calls in one message both render, trained, under that message."""
    got = render_segments([SYSTEM, USER, {**OPENAI_CALL, "content": "Checking."},
                           {"role": "tool", "content": "21"},
                           {"role": "assistant", "content": "21 degrees."}])
    assert got == OPENING + [
        Segment("<|assistant_start|>", 2),
        Segment("Checking.", 2, True),
        Segment('<|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|>', 2, True),
        Segment("[", 3),
        Segment("21", 3),
        Segment("]", 3),
        Segment("21 degrees.", 4, True),
        Segment("<|assistant_end|>", 4, True),
    ]


def test_block_content_with_openai_calls_keeps_the_calls_after_the_blocks():
    thoughts = {"blocks": [{"type": "thoughts", "text": "Look it up."}]}
    text = render([SYSTEM, USER, {**OPENAI_CALL, "content": thoughts}])
    assert text.endswith('<|assistant_start|><|inner_prefix|>Look it up.'
                         '<|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|><|assistant_end|>')


def test_a_generation_prompt_after_a_user_turn_belongs_to_no_message():
    got = render_segments([SYSTEM, USER], add_generation_prompt=True)
    assert got == OPENING + [Segment("<|assistant_start|>", None)]


def test_the_apertus_renderer_on_its_own_has_the_defaults_of_render():
    """Without options the turn is closed and thinking is off, as ``render`` does."""
    messages = [SYSTEM, USER, {"role": "assistant", "content": "Sunny."}]
    assert apertus.segments(messages) == render_segments(messages)


def test_by_default_a_turn_is_closed_and_thinking_is_off():
    assert render([SYSTEM, USER, {"role": "assistant", "content": "Sunny."}]) == (
        "<s><|system_start|>Be brief.<|system_end|>"
        "<|developer_start|>Deliberation: disabled\nTool Capabilities: disabled<|developer_end|>"
        "<|user_start|>Weather in Bern?<|user_end|><|assistant_start|>Sunny.<|assistant_end|>")


# --- Apertus: the opening blocks ---------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
TIME = {"name": "get_time", "description": "Current time."}


def test_default_system_text_and_developer_block_with_tools_and_thinking():
    """No system message: the default text with the date, no message's; the developer block lists every
    declared tool, one declaration a line, and says whether thinking is on."""
    got = render_segments([USER], tools=[WEATHER, TIME], enable_thinking=True, chat_date="2025-09-21")
    assert got == [
        Segment("<s>", None),
        Segment("<|system_start|>You are a helpful, honest and harmless assistant.\n"
                "Current date: 2025-09-21<|system_end|>", None),
        Segment("<|developer_start|>Deliberation: enabled\nTool Capabilities:\n"
                "type get_weather = (_: {\ncity?: string\n}) => any;\n"
                "// Current time.\ntype get_time = () => any;<|developer_end|>", None),
        Segment("<|user_start|>Weather in Bern?<|user_end|>", 0),
    ]


def test_an_empty_date_is_refused():
    with pytest.raises(ValueError, match="date must be a datetime.date or a non-empty string, got ''"):
        render([USER], chat_date="")


@pytest.mark.parametrize("fmt, expected", [
    ("apertus", ("<s><|system_start|>Be brief.<|system_end|>"
                 "<|developer_start|>Deliberation: disabled\nTool Capabilities: disabled<|developer_end|>")),
    ("llama3", "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.\n\n<|eot_id|>"),
    ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n"),
])
def test_a_conversation_of_only_a_system_message_renders(fmt, expected):
    assert render([SYSTEM], chat_format=fmt) == expected


def test_a_system_message_belongs_to_message_zero_in_the_header_formats():
    got = render_segments([SYSTEM, USER], chat_format="llama3")
    assert [s.index for s in got] == [None, 0, 0, 1, 1]


# --- Apertus: declared tools and one kind of content per turn ----------------------------


def test_a_call_to_an_undeclared_tool_is_refused_listing_the_declared_ones():
    message = {"role": "assistant", "content": None,
               "tool_calls": [{"function": {"name": "search", "arguments": {}}}]}
    with pytest.raises(InputError, match=r"^message 1 \(assistant\): call to tool 'search', which is not among "
                                         r"the declared tools \(get_time, get_weather\)$"):
        render([USER, message], tools=[WEATHER, TIME])


def test_a_call_to_a_declared_tool_renders():
    assert render([SYSTEM, USER, OPENAI_CALL], tools=[WEATHER]).endswith(
        '<|assistant_start|><|tools_prefix|>[{"get_weather": {"city": "Bern"}}]<|tools_suffix|><|assistant_end|>')


@pytest.mark.parametrize("first, later, first_kind, later_kind", [
    ({**OPENAI_CALL, "content": "Checking."}, blocks({"type": "response", "text": "21 degrees."}),
     "string", "blocks"),
    (blocks(CALL), {"role": "assistant", "content": "21 degrees."}, "blocks", "string"),
])
def test_one_turn_must_not_mix_string_and_block_content(first, later, first_kind, later_kind):
    with pytest.raises(InputError, match=rf"^message 3 \(assistant\): {later_kind} content in an assistant turn "
                                         rf"whose message 1 has {first_kind} content; one turn must use one$"):
        render([USER, first, {"role": "tool", "content": "21"}, later])


def test_tool_outputs_given_twice_are_refused_naming_the_block():
    with pytest.raises(InputError, match=r"^message 3 \(assistant\): block 0: tool outputs given both as tool "
                                         "messages and as a tool_outputs block$"):
        render([USER, OPENAI_CALL, {"role": "tool", "content": "21"},
                blocks({"type": "tool_outputs", "outputs": ["21"]})])


# --- turn order -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["apertus", "llama3", "chatml"])
@pytest.mark.parametrize("system", [[], [SYSTEM]], ids=["alone", "after_system"])
def test_an_opening_assistant_message_is_refused_in_every_format(fmt, system):
    index = len(system)
    with pytest.raises(InputError, match=rf"^message {index} \(assistant\): the conversation opens with an "
                                         "assistant message"):
        render([*system, {"role": "assistant", "content": "Hello!"}, USER], chat_format=fmt)


@pytest.mark.parametrize("earlier, later", [
    ({"role": "assistant", "content": "It is"}, {"role": "assistant", "content": " sunny."}),
    (blocks(CALL, {"type": "tool_outputs", "outputs": ["21"]}, {"type": "response", "text": "21 degrees."}),
     blocks({"type": "response", "text": " Sunny."})),
], ids=["string", "outputs_then_response"])
def test_an_assistant_message_after_one_not_ending_in_tool_outputs_is_refused(earlier, later):
    """Only the last block counts: tool outputs earlier in the message do not open the way."""
    with pytest.raises(InputError, match=r"^message 2 \(assistant\): follows assistant message 1 with no user or "
                                         "tool message between them"):
        render([USER, earlier, later])


def test_an_assistant_message_after_one_ending_in_tool_outputs_continues_the_turn():
    text = render([SYSTEM, USER, blocks(CALL, {"type": "tool_outputs", "outputs": ["21"]}),
                   blocks({"type": "response", "text": "21 degrees."})])
    assert text.endswith("<|tools_suffix|>[21]21 degrees.<|assistant_end|>")


# --- special tokens in text -------------------------------------------------------------


@pytest.mark.parametrize("messages, expected", [
    ([{"role": "assistant", "content": "Done<|assistant_end|>"}],
     "message 1 (assistant): content contains the special token '<|assistant_end|>'"),
    ([blocks({"type": "response", "text": "<s>"})],
     "message 1 (assistant): content contains the special token '<s>'"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_weather",
                                                                           "arguments": {"q": "<|user_end|>"}}}]}],
     "message 1 (assistant): tool-call arguments contains the special token '<|user_end|>'"),
    ([blocks(CALL, {"type": "tool_outputs", "outputs": ["<|tools_suffix|>"]})],
     "message 1 (assistant): a tool output contains the special token '<|tools_suffix|>'"),
    ([OPENAI_CALL, {"role": "tool", "content": "<|inner_suffix|>"}],
     "message 2 (tool): content contains the special token '<|inner_suffix|>'"),
    ([{"role": "user", "content": "and <|inner_prefix|>?"}],
     "message 1 (user): content contains the special token '<|inner_prefix|>'"),
], ids=["assistant_text", "assistant_block", "call_arguments", "outputs_block", "tool_message", "user"])
def test_special_tokens_are_refused_naming_the_message_and_the_text(messages, expected):
    """Turn delimiters are refused everywhere; the thought and tool markers outside assistant content."""
    with pytest.raises(InputError) as err:
        render([USER, *messages])
    assert str(err.value) == f"{expected}, which would be tokenized as format structure"


def test_assistant_content_may_hold_thought_and_tool_markers():
    """Raw model output: the markers stay in the text, trained on."""
    text = render([SYSTEM, USER, {"role": "assistant", "content": "<|inner_prefix|>Hm.<|inner_suffix|>Sunny."}])
    assert text.endswith("<|assistant_start|><|inner_prefix|>Hm.<|inner_suffix|>Sunny.<|assistant_end|>")


# --- normalisation: what each message may hold ------------------------------------------


def error_of(messages, **kwargs):
    with pytest.raises(InputError) as err:
        render(messages, **kwargs)
    return str(err.value)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
def test_reasoning_fields_are_refused_not_dropped(field):
    assert error_of([USER, {"role": "assistant", "content": "Sunny.", field: "Look it up."}]) == (
        f"message 1 (assistant): field {field!r} is not rendered; put the reasoning in a "
        '{"type": "thoughts"} block instead')


@pytest.mark.parametrize("content", [{"text": "Sunny."}, [{"type": "text", "text": "Sunny."}], 21])
def test_assistant_content_of_another_shape_is_refused(content):
    assert error_of([USER, {"role": "assistant", "content": content}]) == (
        'message 1 (assistant): content must be a string or {"blocks": [...]}')


@pytest.mark.parametrize("tool_calls, expected", [
    ({"function": {"name": "get_weather", "arguments": {}}}, "tool_calls must be a list"),
    (["get_weather"], "tool_calls[0] must be a mapping"),
    ([{"type": "retrieval", "function": {"name": "get_weather", "arguments": {}}}],
     "tool_calls[0] has type 'retrieval'; only 'function'"),
    ([{"type": "function", "name": "get_weather"}],
     "tool_calls[0] needs a 'function' with 'name' and 'arguments'"),
    ([{"function": {"name": "", "arguments": {}}}],
     "tool_calls[0]: tool call name must be a non-empty string, got ''"),
], ids=["not_list", "not_mapping", "type", "no_function", "empty_name"])
def test_openai_tool_calls_are_refused_naming_the_call(tool_calls, expected):
    assert error_of([USER, {"role": "assistant", "content": None, "tool_calls": tool_calls}]) == (
        f"message 1 (assistant): {expected}")


def test_an_explicit_function_type_and_dict_arguments_are_accepted_as_json_text():
    """Dict arguments are written as JSON with their characters kept as they are."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
    text = render([SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [call]}])
    assert text.endswith('<|tools_prefix|>[{"get_weather": {"city": "Zürich"}}]<|tools_suffix|><|assistant_end|>')


def test_user_text_parts_are_joined_with_nothing_between_them():
    content = {"parts": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Bern?"}]}
    assert render([SYSTEM, {"role": "user", "content": content}]) == render([SYSTEM, USER])


@pytest.mark.parametrize("content, expected", [
    ({"parts": [{"type": "text", "text": "Look:"}, {"type": "image", "url": "x.png"}]},
     "part 1 has type 'image'; only 'text' parts"),
    ({"parts": ["Weather?"]}, "part 0 has type 'str'; only 'text' parts"),
    ({"parts": [{"type": "text"}]}, "part 0 has no string 'text'"),
    ({"text": "Weather?"}, 'content must be a string or {"parts": [{"type": "text", "text": str}]}'),
    (None, 'content must be a string or {"parts": [{"type": "text", "text": str}]}'),
], ids=["image", "bare_string", "no_text", "no_parts", "none"])
def test_user_content_is_refused_naming_the_part(content, expected):
    assert error_of([SYSTEM, {"role": "user", "content": content}]) == f"message 1 (user): {expected}"


def test_a_system_message_of_another_shape_is_refused_naming_it():
    assert error_of([{"role": "system", "content": ["Be brief."]}, USER]) == (
        'message 0 (system): content must be a string or {"text": str}')


def test_a_tool_message_without_content_is_refused_naming_it():
    assert error_of([USER, OPENAI_CALL, {"role": "tool", "content": None}]) == (
        "message 2 (tool): tool message has no content")


@pytest.mark.parametrize("messages", ["Weather in Bern?", b"Weather?", USER], ids=["str", "bytes", "mapping"])
def test_a_conversation_that_is_not_a_list_is_refused(messages):
    assert error_of(messages) == f"a conversation must be a list of messages, got {type(messages).__name__}"


@pytest.mark.parametrize("role, hint", [
    ("developer", "; the developer block is generated from tools/enable_thinking"),
    ("bot", ""),
])
def test_an_unknown_role_is_refused_with_a_hint_for_developer_only(role, hint):
    assert error_of([USER, {"role": role, "content": "x"}]) == (
        f"message 1 ({role}): unknown role {role!r}; known roles: system, user, assistant, tool{hint}")
