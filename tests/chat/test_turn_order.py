"""Turn order: a conversation opens with a user message (after an optional system one),
and an assistant message never directly follows another, except after the earlier one's
tool outputs. Both used to be merged silently into one turn; now `render`, `encode` and
the jinja templates refuse them, naming the message."""

from __future__ import annotations

import jinja2
import pytest

from align.chat import chat_template, encode, install_format, render

DATE = "2025-09-21"
USER = {"role": "user", "content": "Weather in Bern?"}
CALL = {"type": "tool_calls", "calls": [{"name": "get_weather", "arguments": '{"city": "Bern"}'}]}
OPENAI_CALL = {"role": "assistant", "content": None,
               "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}]}

BAD = {
    "opens_with_assistant": ([{"role": "assistant", "content": "Hello!"}, USER], 0, "opens with an assistant"),
    "opens_with_assistant_after_system": (
        [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi."}, USER], 1,
        "opens with an assistant"),
    "two_strings_in_a_row": ([USER, {"role": "assistant", "content": "It is"},
                              {"role": "assistant", "content": " sunny."}], 2, "follows assistant message 1"),
    "two_block_messages_in_a_row": (
        [USER, {"role": "assistant", "content": {"blocks": [{"type": "thoughts", "text": "Check."}]}},
         {"role": "assistant", "content": {"blocks": [{"type": "response", "text": "Sunny."}]}}], 2,
        "follows assistant message 1"),
    "call_without_its_output": ([USER, OPENAI_CALL, {"role": "assistant", "content": "Sunny."}], 2,
                                "follows assistant message 1"),
    "second_reply_after_a_tool_answer": (
        [USER, OPENAI_CALL, {"role": "tool", "content": "21"}, {"role": "assistant", "content": "21 degrees."},
         {"role": "assistant", "content": "Anything else?"}], 4, "follows assistant message 3"),
}
PLAIN_BAD = ("opens_with_assistant", "opens_with_assistant_after_system", "two_strings_in_a_row")


@pytest.mark.parametrize("name", list(BAD))
def test_apertus_refuses_naming_the_message(name):
    messages, index, needle = BAD[name]
    with pytest.raises(ValueError, match=rf"message {index} \(assistant\): .*{needle}"):
        render(messages, chat_date=DATE)


@pytest.mark.parametrize("fmt", ["llama3", "chatml"])
@pytest.mark.parametrize("name", PLAIN_BAD)
def test_header_formats_refuse_the_same(fmt, name):
    messages, index, needle = BAD[name]
    with pytest.raises(ValueError, match=rf"message {index} \(assistant\): .*{needle}"):
        render(messages, chat_format=fmt)


@pytest.mark.parametrize("name", list(BAD))
def test_the_apertus_template_refuses_the_same(name, tokenizer):
    messages, index, _ = BAD[name]
    with pytest.raises(jinja2.TemplateError, match=rf"message {index} \(assistant\)"):
        tokenizer.apply_chat_template(messages, chat_template=chat_template("apertus"), tokenize=False,
                                      date_string=DATE)


@pytest.mark.parametrize("fmt", ["llama3", "chatml"])
@pytest.mark.parametrize("name", PLAIN_BAD)
def test_the_header_templates_refuse_the_same(fmt, name, tokenizer):
    messages, index, _ = BAD[name]
    with pytest.raises(jinja2.TemplateError, match=rf"message {index} \(assistant\)"):
        tokenizer.apply_chat_template(messages, chat_template=chat_template(fmt), tokenize=False)


def test_encode_refuses_training_data_with_two_replies_in_a_row(tokenizer):
    install_format(tokenizer, chat_format="apertus")
    messages, _, _ = BAD["two_strings_in_a_row"]
    with pytest.raises(ValueError, match=r"message 2 \(assistant\): follows assistant message 1"):
        encode(tokenizer, messages, chat_date=DATE)


GOOD = {
    "openai_call_tool_answer": [USER, OPENAI_CALL, {"role": "tool", "content": "21"},
                                {"role": "assistant", "content": "21 degrees."}],
    "blocks_call_tool_answer": [
        USER, {"role": "assistant", "content": {"blocks": [CALL]}}, {"role": "tool", "content": "21"},
        {"role": "assistant", "content": {"blocks": [{"type": "response", "text": "21 degrees."}]}}],
    "outputs_block_then_answer": [
        USER, {"role": "assistant", "content": {"blocks": [CALL, {"type": "tool_outputs", "outputs": ["21"]}]}},
        {"role": "assistant", "content": {"blocks": [{"type": "response", "text": "21 degrees."}]}}],
    "one_message_whole_turn": [USER, {"role": "assistant", "content": {"blocks": [
        CALL, {"type": "tool_outputs", "outputs": ["21"]}, {"type": "response", "text": "21 degrees."}]}}],
    "system_user_assistant": [{"role": "system", "content": "Be brief."}, USER,
                              {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}],
}


@pytest.mark.parametrize("name", list(GOOD))
def test_legitimate_tool_turns_render_as_one_turn_in_render_and_template(name, tokenizer):
    messages = GOOD[name]
    text = render(messages, chat_date=DATE)
    assert text.count("<|assistant_start|>") == 1
    assert tokenizer.apply_chat_template(messages, chat_template=chat_template("apertus"), tokenize=False,
                                         date_string=DATE) == text


def test_a_prompt_ending_in_tool_outputs_continues_in_the_open_turn():
    prompt = GOOD["outputs_block_then_answer"][:2]
    full = render(prompt + [{"role": "assistant", "content": {"blocks": [{"type": "response", "text": "Done."}]}}],
                  chat_date=DATE)
    assert full == render(prompt, add_generation_prompt=True, chat_date=DATE) + "Done.<|assistant_end|>"
