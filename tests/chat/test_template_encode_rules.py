"""Rules of a model's own chat template and of the token masks that the other chat tests leave open.

A mutation check on ``align.chat.template`` and ``align.chat.encode`` showed rules no test held:
what a template's failure with an empty message says, which render decides whether earlier
reasoning was dropped (the conversation's tools, its thinking switch), that the caller's messages
are left as they were, which assistant turn counts as the last, and how a token that straddles the
mask boundary names the text on each side. Each test states one such rule as a user sees it.
"""

from __future__ import annotations

import re
import types

import pytest

from align.chat import encode, install_format
from align.chat.encode import encode_completion, loss_mask
from align.chat.segments import Segment
from align.chat.template import (
    apply_template,
    assistant_char_spans,
    check_fast,
    check_own_template,
    check_template,
    dropped_reasoning,
    earlier_reasoning,
    renders_last_reasoning,
    template_name,
    turn_end,
)
from align.errors import ConfigError, InputError
from align.testing.tiny import build_template_tokenizer, build_tokenizer
from chat_cases import trained_runs

# Each role opens and closes with its own tokens; the generation prompt opens the assistant's turn.
GOOD = ("{% for m in messages %}<|{{ m.role }}_start|>{{ m.content }}<|{{ m.role }}_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant_start|>{% endif %}")
USER = {"role": "user", "content": "Is 4 even?"}
REASONED = {"role": "assistant", "content": "yes", "reasoning_content": "4 is two twos."}
LAST = {"role": "assistant", "content": "no", "reasoning_content": "5 is odd."}
TWO_TURNS = [USER, REASONED, {"role": "user", "content": "And 5?"}, LAST]


def with_template(template: str, name: str = "") -> object:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    tokenizer.name_or_path = name
    return tokenizer


def trained_pieces(tokenizer, encoded) -> list[str]:
    """The trained text, one string per run of consecutive trained tokens."""
    return trained_runs(tokenizer, encoded.input_ids, encoded.loss_mask)


def reasoning_when(condition: str) -> str:
    """GOOD, writing an assistant's reasoning before its content only when ``condition`` holds."""
    return GOOD.replace("{{ m.content }}", "{% if " + condition + " and m.reasoning_content %}"
                        "<|inner_prefix|>{{ m.reasoning_content }}<|inner_suffix|>{% endif %}{{ m.content }}")


# --- what a failing template says ----------------------------------------------------------


def test_a_template_failing_with_an_empty_message_says_so_plainly():
    """An error without text is named by its type alone, followed by nothing."""
    tokenizer = with_template("{{ raise_exception('') }}", "models/silent")
    with pytest.raises(ConfigError, match=r"chat template of 'models/silent' fails on a plain conversation \(user\): "
                                          r"TemplateError: ; fix the template"):
        check_own_template(tokenizer)


# --- earlier reasoning ------------------------------------------------------------------


def test_the_last_assistant_turn_is_the_last_even_when_a_user_message_follows():
    """A conversation ending on a user message: its one assistant turn is still the last one."""
    assert earlier_reasoning([USER, REASONED, {"role": "user", "content": "And 5?"}]) == []


def test_every_assistant_turn_before_the_last_is_earlier():
    third = {"role": "assistant", "content": "maybe", "reasoning_content": "6 is even."}
    conversation = [*TWO_TURNS, {"role": "user", "content": "And 6?"}, third]
    assert earlier_reasoning(conversation) == [(1, "reasoning_content"), (3, "reasoning_content")]


def test_dropped_reasoning_follows_the_thinking_switch_it_is_given():
    """Off by default: a template that writes reasoning only when thinking is on drops it unless asked."""
    tokenizer = with_template(reasoning_when("enable_thinking"))
    assert dropped_reasoning(tokenizer, TWO_TURNS) == [(1, "reasoning_content")]
    assert dropped_reasoning(tokenizer, TWO_TURNS, enable_thinking=False) == [(1, "reasoning_content")]
    assert dropped_reasoning(tokenizer, TWO_TURNS, enable_thinking=True) == []


def test_dropped_reasoning_renders_with_the_conversations_tools():
    tokenizer = with_template(reasoning_when("tools"))
    tools = [{"type": "function", "function": {"name": "parity"}}]
    assert dropped_reasoning(tokenizer, TWO_TURNS, tools=tools) == []
    assert dropped_reasoning(tokenizer, TWO_TURNS) == [(1, "reasoning_content")]


def test_dropped_reasoning_leaves_the_callers_messages_as_they_were():
    tokenizer = with_template(reasoning_when("true"))
    conversation = [dict(m) for m in TWO_TURNS]
    assert dropped_reasoning(tokenizer, conversation) == []
    assert conversation[1] == {"role": "assistant", "content": "yes", "reasoning_content": "4 is two twos."}


def test_a_conversation_holding_a_non_message_gives_no_dropped_reasoning():
    """A conversation the template cannot render gives [] here: encoding it names the row."""
    tokenizer = with_template(reasoning_when("true"))
    assert dropped_reasoning(tokenizer, [*TWO_TURNS[:3], "not a message", LAST]) == []


# --- loss masks: a token across the boundary ----------------------------------------------


def test_a_token_across_the_boundary_names_text_that_belongs_to_no_message():
    """Text outside every message (a template's markup) is named as such, the turn by its index."""
    segments = [Segment("ab", None), Segment("cd", 1, trained=True)]
    with pytest.raises(ValueError, match=r"token 1 \('bc', chars 1-3\) straddles the boundary between "
                                         r"untrained text of no message and trained text of message 1:"):
        loss_mask("abcd", [(0, 1), (1, 3), (3, 4)], segments)


# --- naming the template and the tokenizer -------------------------------------------------


def test_a_tokenizer_without_a_template_is_named_or_called_the_model():
    with pytest.raises(ConfigError, match=r"the tokenizer of 'models/plain' has no chat_template"):
        check_template(with_template("", "models/plain"))
    with pytest.raises(ConfigError, match=r"the tokenizer of 'the model' has no chat_template"):
        check_template(with_template("", ""))
    with pytest.raises(ConfigError, match=r"the tokenizer of 'the model' has no chat_template"):
        check_template(types.SimpleNamespace())  # an object without a template or a name at all


def test_a_template_without_a_name_is_called_the_tokenizer():
    assert template_name(types.SimpleNamespace()) == "the tokenizer"
    with pytest.raises(ConfigError, match=r"the chat template of 'the tokenizer' fails on a plain conversation"):
        check_own_template(with_template("{{ 1 / 0 }}", ""))


def test_an_object_that_does_not_say_it_is_fast_is_refused():
    with pytest.raises(InputError, match="needs a fast tokenizer .offsets mapping.; got SimpleNamespace"):
        check_fast(types.SimpleNamespace())


# --- the one rendering ------------------------------------------------------------------


def test_apply_template_renders_the_tools_and_no_generation_prompt_nor_thinking_unless_asked():
    tokenizer = with_template("{% if tools %}<|tools_prefix|>{{ tools | length }} tool<|tools_suffix|>{% endif %}"
                              + reasoning_when("enable_thinking"))
    tools = [{"type": "function", "function": {"name": "parity"}}]
    assert apply_template(tokenizer, TWO_TURNS[:2], tools=tools) == (
        "<|tools_prefix|>1 tool<|tools_suffix|><|user_start|>Is 4 even?<|user_end|>"
        "<|assistant_start|>yes<|assistant_end|>")
    assert apply_template(tokenizer, TWO_TURNS[:2], add_generation_prompt=True, enable_thinking=True) == (
        "<|user_start|>Is 4 even?<|user_end|>"
        "<|assistant_start|><|inner_prefix|>4 is two twos.<|inner_suffix|>yes<|assistant_end|><|assistant_start|>")


# --- the probes of a template -------------------------------------------------------------


def test_a_template_failing_on_a_longer_probe_names_each_role_of_it():
    """The probe conversation is named by its roles in order, comma-separated."""
    tokenizer = with_template(GOOD.replace("{{ m.content }}", "{% if m.role == 'assistant' %}{{ 1 / 0 }}{% endif %}"
                                                              "{{ m.content }}"), "models/no-answers")
    with pytest.raises(ConfigError, match=r"'models/no-answers' fails on a plain conversation \(user, assistant\): "
                                          r"ZeroDivisionError"):
        check_own_template(tokenizer)


# Each template is faulty only with thinking off (Qwen3's test of the switch: `enable_thinking is false`)
PROMPT_ONLY_WHEN_THINKING = GOOD.replace("{% if add_generation_prompt %}",
                                         "{% if add_generation_prompt and enable_thinking is not false %}")
ROLES_ALIKE_WHEN_NOT_THINKING = GOOD.replace("<|{{ m.role }}_",
                                             "<|{{ 'assistant' if enable_thinking is false else m.role }}_")
FOREIGN_MARKER_WHEN_NOT_THINKING = GOOD.replace("{% endfor %}", "{% if enable_thinking is false %}<|im_end|>{% endif %}"
                                                                "{% endfor %}")


@pytest.mark.parametrize(("template", "fault"), [
    (PROMPT_ONLY_WHEN_THINKING, "has no generation prompt"),
    (ROLES_ALIKE_WHEN_NOT_THINKING, "renders a user message and an assistant message the same way"),
    (FOREIGN_MARKER_WHEN_NOT_THINKING, r"writes '<\|im_end\|>' \(\d+ tokens\)"),
], ids=["generation-prompt", "roles", "markers"])
def test_each_probe_renders_with_the_thinking_switch_it_is_given(template, fault):
    """Off unless asked: such a template is refused with thinking off (and by default), accepted with it on."""
    check_own_template(with_template(template), enable_thinking=True)
    with pytest.raises(ConfigError, match=fault):
        check_own_template(with_template(template), enable_thinking=False)
    with pytest.raises(ConfigError, match=fault):
        check_own_template(with_template(template))


def test_the_generation_prompt_probe_compares_renders_made_with_one_switch():
    """A header written with thinking off is shared by the three probe renders: the opener found is the
    assistant's own, not the header."""
    header = "{% if enable_thinking is false %}<|system_start|>Reasoning: off<|system_end|>{% endif %}"
    tokenizer = with_template(header + GOOD.split("{% if add_generation_prompt")[0])
    with pytest.raises(ConfigError, match=r"has no generation prompt .* opens an assistant turn with "
                                          r"'<\|assistant_start\|>': SFT"):
        check_own_template(tokenizer)


def test_a_template_that_never_writes_an_assistants_text_has_no_opener_to_check():
    """The probe passes it (there is no opener to find); where the turn ends cannot be found, which
    encoding names."""
    tokenizer = with_template("{% for m in messages %}<|{{ m.role }}_start|>{% if m.role != 'assistant' %}"
                              "{{ m.content }}{% endif %}<|{{ m.role }}_end|>{% endfor %}")
    check_own_template(tokenizer)
    with pytest.raises(InputError, match="does not write an assistant's content as given"):
        encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")


def test_a_role_blind_template_is_shown_with_what_it_rendered():
    """The probe renders the same text as each role; the error shows the render, and other roles
    written as themselves do not hide the two written alike."""
    user_for_both = GOOD.replace("<|{{ m.role }}_", "<|{{ 'user' if m.role == 'assistant' else m.role }}_")
    tokenizer = with_template(user_for_both.replace("<|assistant_start|>{% endif %}", "<|user_start|>{% endif %}"))
    with pytest.raises(ConfigError, match=re.escape(
            "renders a user message and an assistant message the same way ('<|user_start|>align probe question"
            "<|user_end|><|user_start|>align probe text<|user_end|>')")):
        check_own_template(tokenizer)


def test_every_foreign_marker_of_the_user_and_assistant_turns_is_named_once():
    """The probe conversation holds a user and an assistant turn; each marker missing from the vocabulary is
    named once, with the number of pieces it would be split into, comma-separated."""
    tokenizer = with_template(GOOD.replace("<|{{ m.role }}_end|>", "<|{{ m.role }}_end|><|{{ m.role }}_done|>"))
    user = len(tokenizer("<|user_done|>", add_special_tokens=False)["input_ids"])
    assistant = len(tokenizer("<|assistant_done|>", add_special_tokens=False)["input_ids"])
    with pytest.raises(ConfigError, match=re.escape(
            f"writes '<|user_done|>' ({user} tokens), '<|assistant_done|>' ({assistant} tokens), which its tokenizer")):
        check_own_template(tokenizer)


# --- the reasoning of the last turn --------------------------------------------------------


def test_whether_the_last_reasoning_is_rendered_is_known_per_switch_and_template():
    tokenizer = with_template(reasoning_when("enable_thinking"))
    assert not renders_last_reasoning(tokenizer, "reasoning_content")
    assert renders_last_reasoning(tokenizer, "reasoning_content", enable_thinking=True)
    assert not renders_last_reasoning(tokenizer, "reasoning_content", enable_thinking=False)
    tokenizer.chat_template = reasoning_when("true")  # another template on the same tokenizer: probed anew
    assert renders_last_reasoning(tokenizer, "reasoning_content")
    # the probe's assistant message has text as well as reasoning: a template that needs it renders it
    tokenizer.chat_template = reasoning_when("true").replace("{{ m.content }}", "{{ m.content + '' }}")
    assert renders_last_reasoning(tokenizer, "reasoning_content")


# --- the end of a turn ---------------------------------------------------------------------


def test_the_end_of_turn_is_read_with_the_thinking_switch_and_remembered_per_switch():
    tokenizer = with_template(GOOD.replace("<|{{ m.role }}_end|>", "{% if enable_thinking and m.role == 'assistant' %}"
                                           "<|inner_suffix|>{% else %}<|{{ m.role }}_end|>{% endif %}"))
    assert turn_end(tokenizer) == "<|assistant_end|>"
    assert turn_end(tokenizer, enable_thinking=True) == "<|inner_suffix|>"
    assert turn_end(tokenizer, enable_thinking=False) == "<|assistant_end|>"
    encoded = encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer", enable_thinking=True)
    assert trained_pieces(tokenizer, encoded) == ["yes<|inner_suffix|>"]


def test_a_render_that_starts_with_the_assistants_turn_has_it_from_character_0():
    """The boundaries at 0: the assistant's text found at character 0, an empty answer's end of turn too."""
    tokenizer = with_template("{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content }}<|assistant_end|>"
                              "{% endif %}{% endfor %}")
    assert turn_end(tokenizer) == "<|assistant_end|>"
    empty = [USER, {"role": "assistant", "content": ""}]
    assert assistant_char_spans(tokenizer, empty, "<|assistant_end|>") == {1: (0, 17)}


# --- where an assistant turn starts and ends -----------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "parity", "description": "Whether n is even.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def test_the_generation_prompt_of_a_turn_is_rendered_with_the_conversations_tools():
    tokenizer = with_template("{% if tools %}<|tools_prefix|>{{ tools | length }} tool<|tools_suffix|>{% endif %}" + GOOD)
    encoded = encode(tokenizer, TWO_TURNS, chat_format="tokenizer", tools=TOOLS)
    assert encoded.text.startswith("<|tools_prefix|>1 tool<|tools_suffix|><|user_start|>")
    assert trained_pieces(tokenizer, encoded) == ["yes<|assistant_end|>", "no<|assistant_end|>"]


def test_qwen3_without_thinking_trains_each_answer_of_a_conversation_with_tools():
    """Qwen3 prompts with an empty think block that its history does not carry: the turn starts after the
    part of the prompt the history shares, and the history is rendered with the tools too."""
    tokenizer = build_template_tokenizer("qwen3")
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in TWO_TURNS]
    encoded = encode(tokenizer, plain, chat_format="tokenizer", tools=TOOLS)
    assert encoded.text.startswith("<|im_start|>system\n# Tools\n")
    assert trained_pieces(tokenizer, encoded) == ["yes<|im_end|>", "no<|im_end|>"]


def test_a_history_opener_shorter_than_the_prompt_is_read_with_the_thinking_switch():
    """A header written with thinking off and a prompt longer than the history's opener: the history before
    each turn is rendered with the same switch as the conversation."""
    header = "{% if enable_thinking is false %}<|system_start|>Reasoning: off<|system_end|>{% endif %}"
    tokenizer = with_template(header + GOOD.replace("{% if add_generation_prompt %}<|assistant_start|>",
                                                    "{% if add_generation_prompt %}<|assistant_start|>"
                                                    "<|inner_prefix|><|inner_suffix|>"))
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in TWO_TURNS]
    for thinking in (False, True):
        encoded = encode(tokenizer, plain, chat_format="tokenizer", enable_thinking=thinking)
        assert encoded.text.startswith("<|system_start|>") is not thinking
        assert trained_pieces(tokenizer, encoded) == ["yes<|assistant_end|>", "no<|assistant_end|>"]
    text = apply_template(tokenizer, plain)
    assert assistant_char_spans(tokenizer, plain, text) == {  # thinking off unless asked
        1: (text.index("yes"), text.index("<|user_start|>And")),
        3: (text.index("no<|"), len(text)),
    }


def test_a_history_rendered_otherwise_than_before_the_turn_is_refused():
    """The user's turn closes with a space when it is last, with a newline when an answer follows: the
    model would be trained after a text it was never prompted with."""
    tokenizer = with_template(GOOD.replace("<|{{ m.role }}_end|>", "<|{{ m.role }}_end|>{% if m.role == 'user' %}"
                                           "{{ ' ' if loop.last else '\\n' }}{% endif %}"))
    with pytest.raises(InputError, match=r"message 1: the tokenizer's chat template renders the conversation before "
                                         r"this assistant turn otherwise than its generation prompt for it \(they "
                                         r"differ at character 36: ' <\|assistant_start\|>' against "
                                         r"'\\n<\|assistant_start\|>yes"):
        encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")


def test_qwen3_without_thinking_cannot_place_a_turn_with_no_text_of_its_own():
    """Past the shared opener comes the tool call, not the turn's text (it has none): where the turn
    starts cannot be told, and the conversation is refused naming the message."""
    tokenizer = build_template_tokenizer("qwen3")
    call = {"type": "function", "function": {"name": "parity", "arguments": {"n": 5}}}
    conversation = [USER, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": "odd"}, {"role": "assistant", "content": "odd"}]
    with pytest.raises(InputError, match="message 1: the tokenizer's chat template renders the conversation before"):
        encode(tokenizer, conversation, chat_format="tokenizer")


def test_a_turn_whose_end_is_not_written_after_it_is_refused_naming_it():
    """This template ends an assistant turn with the end of turn only when it is the last message."""
    tokenizer = with_template(GOOD.replace("<|{{ m.role }}_end|>", "{% if m.role == 'assistant' and not loop.last %}"
                                           "<|developer_end|>{% else %}<|{{ m.role }}_end|>{% endif %}"))
    no_end = r"no end of turn '<\|assistant_end\|>' after the assistant's text"
    with pytest.raises(InputError, match=f"message 1: {no_end}"):  # none after it at all
        encode(tokenizer, TWO_TURNS[:3], chat_format="tokenizer")
    with pytest.raises(InputError, match=f"message 3: {no_end}"):  # the first turn took the only one
        encode(tokenizer, TWO_TURNS, chat_format="tokenizer")


def test_two_assistant_turns_in_a_row_are_each_trained():
    """The second turn starts exactly where the first one's end of turn stops (the boundary at equality)."""
    tokenizer = with_template("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} "
                              "[/INST]{% elif m.role == 'assistant' %}{{ m.content }}</s>{% else %}"
                              "{{ raise_exception('only user and assistant roles') }}{% endif %}{% endfor %}")
    conversation = [USER, {"role": "assistant", "content": "yes"}, {"role": "assistant", "content": "and no"}]
    text = apply_template(tokenizer, conversation)
    assert text == "<s>[INST] Is 4 even? [/INST]yes</s>and no</s>"
    assert assistant_char_spans(tokenizer, conversation, text) == {1: (28, 35), 2: (35, 45)}


# --- text that may not hold the template's structure ----------------------------------------


def test_a_special_token_in_an_assistants_reasoning_is_refused_naming_the_message():
    tokenizer = build_template_tokenizer("qwen3")
    conversation = [USER, {"role": "assistant", "content": "yes", "reasoning_content": "even<|im_end|>"}]
    with pytest.raises(InputError, match=r"message 1 holds '<\|im_end\|>', a special token of the tokenizer"):
        encode(tokenizer, conversation, chat_format="tokenizer", enable_thinking=True)


# --- encode: the first max_tokens tokens, one BOS, the tokenizer's tokens ----------------------


def long_conversation() -> list[dict]:
    answer = " ".join(f"step {k} of the proof holds, so the claim follows." for k in range(60))
    return [USER, {"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks."},
            {"role": "assistant", "content": "You are welcome."}]


@pytest.mark.parametrize("max_tokens", [1, 5, 40, 200, 10_000])
def test_the_first_max_tokens_are_those_of_the_whole_conversation(tokenizer, max_tokens):
    """Tokenizing only a prefix (a long conversation) gives the same first tokens, mask and spans (of the
    messages begun within them) as tokenizing all of it, and exactly max_tokens of them when there are
    that many."""
    install_format(tokenizer, chat_format="apertus")
    whole = encode(tokenizer, long_conversation(), chat_date="2025-09-21")
    first = encode(tokenizer, long_conversation(), chat_date="2025-09-21", max_tokens=max_tokens)
    n = min(max_tokens, len(whole.input_ids))
    assert first.input_ids == whole.input_ids[:n] and first.loss_mask == whole.loss_mask[:n]
    assert first.text == whole.text
    reached = [k for k, (a, _) in enumerate(whole.spans) if a < n]  # messages begun within the kept tokens
    assert [first.spans[k] for k in reached] == [(a, min(b, n)) for a, b in (whole.spans[k] for k in reached)]


def test_a_conversation_of_long_tokens_still_gives_max_tokens_tokens():
    """The template's markers are long single tokens: the prefix tokenized first holds fewer tokens than
    it was sized for, and is grown until it holds max_tokens with the margin."""
    tokenizer = with_template(GOOD)
    conversation = [{"role": r, "content": c} for _ in range(100) for r, c in (("user", "a"), ("assistant", "b"))]
    whole = encode(tokenizer, conversation, chat_format="tokenizer")
    first = encode(tokenizer, conversation, chat_format="tokenizer", max_tokens=100)
    assert len(first.input_ids) == 100
    assert first.input_ids == whole.input_ids[:100] and first.loss_mask == whole.loss_mask[:100]


def test_a_text_that_starts_with_two_bos_tokens_is_refused_even_two_tokens_long():
    tokenizer = with_template("{{ bos_token }}{{ bos_token }}" + GOOD)
    with pytest.raises(InputError, match="the token ids start with two BOS tokens"):
        encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer", max_tokens=2)
    encoded = encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer", max_tokens=1)  # one token: nothing to compare
    assert encoded.input_ids == [tokenizer.bos_token_id]


def test_a_bos_token_second_is_not_a_doubled_bos():
    """Also: with a one-character first token, the span of a message that is not an assistant turn is
    still (0, 0)."""
    tokenizer = with_template("x{{ bos_token }}" + GOOD)
    encoded = encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    assert encoded.input_ids[1] == tokenizer.bos_token_id
    a, b = encoded.spans[1]
    assert encoded.spans[0] == (0, 0) and tokenizer.decode(encoded.input_ids[a:b]) == "yes<|assistant_end|>"


def test_a_generation_prompt_asked_of_the_template_is_rendered_and_not_trained():
    tokenizer = with_template(GOOD)
    encoded = encode(tokenizer, TWO_TURNS[:3], chat_format="tokenizer", add_generation_prompt=True)
    assert encoded.text.endswith("<|user_start|>And 5?<|user_end|><|assistant_start|>")
    assert trained_pieces(tokenizer, encoded) == ["yes<|assistant_end|>"]


def test_the_tokenizer_must_say_it_is_fast_and_hold_the_formats_bos():
    from align.chat.encode import check_tokenizer
    from align.chat.formats import get_format

    apertus = get_format("apertus")
    with pytest.raises(InputError, match="align.chat needs a fast tokenizer .offsets mapping.; got SimpleNamespace"):
        check_tokenizer(types.SimpleNamespace(get_added_vocab=dict), apertus)
    no_bos = types.SimpleNamespace(is_fast=True, get_added_vocab=lambda: dict.fromkeys(apertus.special_tokens, 0))
    with pytest.raises(InputError, match=r"lacks the 'apertus' tokens \['<s>'\]"):
        check_tokenizer(no_bos, apertus)


# --- loss masks: zero-width tokens and the boundary ----------------------------------------


@pytest.mark.parametrize(("offsets", "mask"), [
    ([(0, 2), (2, 2), (2, 4), (4, 4)], [0, 0, 1, 1]),  # each zero-width token follows the one before it
    ([(0, 0), (0, 2), (2, 4)], [0, 0, 1]),  # a zero-width first token is untrained
    ([(0, 2), (2, 4), (4, 4), (4, 4)], [0, 1, 1, 1]),
])
def test_a_zero_width_token_follows_its_left_side(offsets, mask):
    segments = [Segment("ab", 0), Segment("cd", 1, trained=True)]
    assert loss_mask("abcd", offsets, segments) == mask


@pytest.mark.parametrize(("offsets", "between"), [
    ([(0, 2), (2, 3), (3, 5), (5, 6)], (r"token 2 \('de', chars 3-5\) straddles the boundary between untrained text "
                                       r"of message 1 and trained text of message 2:")),
    ([(0, 1), (1, 3), (3, 6)], (r"token 1 \('bc', chars 1-3\) straddles the boundary between trained text of "
                               r"message 0 and untrained text of message 1:")),
], ids=["into-a-turn", "out-of-a-turn"])
def test_a_token_across_a_turns_boundary_names_the_text_on_each_side(offsets, between):
    segments = [Segment("ab", 0, trained=True), Segment("cd", 1), Segment("ef", 2, trained=True)]
    with pytest.raises(ValueError, match=between):
        loss_mask("abcdef", offsets, segments)


# --- encode and encode_completion: what reaches the template ---------------------------------


def test_encode_and_encode_completion_render_with_thinking_off_unless_asked():
    tokenizer = with_template(reasoning_when("enable_thinking"))
    off = encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    assert off.text == "<|user_start|>Is 4 even?<|user_end|><|assistant_start|>yes<|assistant_end|>"
    assert "4 is two twos." in encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer", enable_thinking=True).text
    earlier = [USER, REASONED, {"role": "user", "content": "And 5?"}]
    prompt_ids, _ = encode_completion(tokenizer, earlier, "no", chat_format="tokenizer")
    assert tokenizer.decode(prompt_ids) == ("<|user_start|>Is 4 even?<|user_end|><|assistant_start|>yes<|assistant_end|>"
                                            "<|user_start|>And 5?<|user_end|><|assistant_start|>")


def test_a_completion_ends_with_the_templates_end_of_turn_for_its_thinking_switch():
    tokenizer = with_template(GOOD.replace("<|{{ m.role }}_end|>", "{% if enable_thinking and m.role == 'assistant' %}"
                                           "<|inner_suffix|>{% else %}<|{{ m.role }}_end|>{% endif %}"))
    _, off = encode_completion(tokenizer, [USER], "yes", chat_format="tokenizer")
    _, on = encode_completion(tokenizer, [USER], "yes", chat_format="tokenizer", enable_thinking=True)
    assert (tokenizer.decode(off), tokenizer.decode(on)) == ("yes<|assistant_end|>", "yes<|inner_suffix|>")


def test_a_completions_prompt_is_rendered_with_the_tools():
    tokenizer = with_template("{% if tools %}<|tools_prefix|>{{ tools | length }} tool<|tools_suffix|>{% endif %}" + GOOD)
    prompt_ids, _ = encode_completion(tokenizer, [USER], "yes", chat_format="tokenizer", tools=TOOLS)
    assert tokenizer.decode(prompt_ids) == ("<|tools_prefix|>1 tool<|tools_suffix|><|user_start|>Is 4 even?<|user_end|>"
                                            "<|assistant_start|>")


def test_a_completions_prompt_in_an_align_format_follows_the_thinking_switch(tokenizer):
    install_format(tokenizer, chat_format="apertus")
    for thinking in (False, True):
        prompt_ids, _ = encode_completion(tokenizer, [USER], "yes", chat_date="2025-09-21", enable_thinking=thinking)
        prompt = encode(tokenizer, [USER], chat_date="2025-09-21", add_generation_prompt=True, enable_thinking=thinking)
        assert prompt_ids == prompt.input_ids


def test_a_merge_across_the_prompt_boundary_is_named_at_the_prompts_last_token(tokenizer):
    """"th" + "e end": the prompt's last token "h" becomes part of "he" in the whole text."""
    from align.chat.encode import tokenize

    messages = [{"role": "user", "content": "Say it"}, {"role": "assistant", "content": "th"}]
    install_format(tokenizer, chat_format="apertus")
    prompt = encode(tokenizer, messages, chat_date="2025-09-21", add_generation_prompt=True)
    n = len(tokenize(tokenizer, prompt.text)[0])
    with pytest.raises(ValueError, match=f"they differ at token {n - 1} of {n}"):
        encode_completion(tokenizer, messages, "e end", chat_date="2025-09-21")


def test_encoding_probes_the_template_with_its_own_thinking_switch():
    """A template with a generation prompt only when thinking is on is accepted for thinking-on rows."""
    tokenizer = with_template(GOOD.replace("{% if add_generation_prompt %}", "{% if add_generation_prompt and "
                                           "enable_thinking %}"))
    encoded = encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer", enable_thinking=True)
    assert trained_pieces(tokenizer, encoded) == ["yes<|assistant_end|>"]
    _, completion = encode_completion(tokenizer, [USER], "yes", chat_format="tokenizer", enable_thinking=True)
    assert tokenizer.decode(completion) == "yes<|assistant_end|>"
