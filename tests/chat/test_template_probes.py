"""A model's own chat template is probed once, before it renders any row
(`align.chat.template.check_own_template`), and the reasoning of earlier turns is checked only
on conversations that have some (`dropped_reasoning`). The templates below are written by hand;
what each must get is written out."""

from __future__ import annotations

import types

import pytest

from align.chat import encode
from align.chat.template import (
    check_own_template,
    dropped_reasoning,
    earlier_reasoning,
    renders_last_reasoning,
)
from align.errors import ConfigError, InputError
from align.sampling.base import PromptEncoder
from align.testing.tiny import build_template_tokenizer, build_tokenizer
from chat_cases import trained_runs

# Each role opens and closes with its own tokens; the generation prompt opens the assistant's turn.
GOOD = ("{% for m in messages %}<|{{ m.role }}_start|>{{ m.content }}<|{{ m.role }}_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant_start|>{% endif %}")
NO_GENERATION_PROMPT = GOOD.split("{% if")[0]
EVERY_ROLE_AS_USER = ("{% for m in messages %}<|user_start|>{{ m.content }}<|user_end|>{% endfor %}"
                      "{% if add_generation_prompt %}<|user_start|>{% endif %}")
SYSTEM_AS_USER = ("{% for m in messages %}{% if m.role == 'assistant' %}<|assistant_start|>{{ m.content }}"
                  "<|assistant_end|>{% else %}<|user_start|>{{ m.content }}<|user_end|>{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant_start|>{% endif %}")
# Mistral's shape: the user turn's [/INST] is what the assistant answers after; no opener, no prompt
NO_OPENER = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
             "{% elif m.role == 'assistant' %}{{ m.content }}</s>"
             "{% else %}{{ raise_exception('only user and assistant roles') }}{% endif %}{% endfor %}")
# fails on an empty message only: a fault the probe cannot see, met on a row
EMPTY_DIVIDES = GOOD.replace("{{ m.content }}", "{{ m.content }}{{ '' if 100 // (m.content | length) else '' }}")

TWO_TURNS = [{"role": "user", "content": "Is 4 even?"}, {"role": "assistant", "content": "yes"},
             {"role": "user", "content": "And 5?"}, {"role": "assistant", "content": "no"}]


def with_template(template: str, name: str = "") -> object:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    tokenizer.name_or_path = name
    return tokenizer


def counting(tokenizer) -> list:
    """Count the tokenizer's renders from now on."""
    calls: list = []
    render = tokenizer.apply_chat_template

    def counted(*args, **kwargs):
        calls.append(args)
        return render(*args, **kwargs)

    tokenizer.apply_chat_template = counted
    return calls


def trained_pieces(tokenizer, encoded) -> list[str]:
    """The trained text, one string per run of consecutive trained tokens."""
    return trained_runs(tokenizer, encoded.input_ids, encoded.loss_mask)


def test_a_template_without_a_generation_prompt_is_refused_where_it_is_used():
    tokenizer = with_template(NO_GENERATION_PROMPT, "models/no-prompt")
    message = (r"the chat template of 'models/no-prompt' has no generation prompt .* opens an assistant turn with "
               r"'<\|assistant_start\|>'")
    with pytest.raises(ConfigError, match=message):
        check_own_template(tokenizer)
    with pytest.raises(ConfigError, match=message):  # sampling: before any prompt is rendered
        PromptEncoder(tokenizer, "tokenizer")
    with pytest.raises(ConfigError, match=message):  # SFT: before the opener is trained as the model's text
        encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")


def test_a_template_that_opens_no_turn_needs_no_generation_prompt():
    tokenizer = with_template(NO_OPENER)
    check_own_template(tokenizer)
    encoded = encode(tokenizer, TWO_TURNS, chat_format="tokenizer")
    assert encoded.text == "<s>[INST] Is 4 even? [/INST]yes</s>[INST] And 5? [/INST]no</s>"
    assert trained_pieces(tokenizer, encoded) == ["yes</s>", "no</s>"]


@pytest.mark.parametrize(("template", "roles"), [
    (EVERY_ROLE_AS_USER, "a user message and an assistant message"),
    (SYSTEM_AS_USER, "a user message and a system message"),
])
def test_a_template_that_renders_roles_alike_is_refused(template, roles):
    with pytest.raises(ConfigError, match=f"renders {roles} the same way"):
        check_own_template(with_template(template))


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_real_templates_pass_the_probes(name):
    tokenizer = build_template_tokenizer(name)
    check_own_template(tokenizer)
    check_own_template(tokenizer, enable_thinking=True)


def test_any_exception_of_a_template_is_a_config_error_naming_it(tmp_path):
    tokenizer = with_template("{{ 1 / 0 }}")
    tokenizer.save_pretrained(tmp_path / "crashing")
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tmp_path / "crashing")
    with pytest.raises(ConfigError, match=r"chat template of '.*crashing' fails on a plain conversation \(user\): "
                                          r"ZeroDivisionError: division by zero"):
        check_own_template(loaded)
    with pytest.raises(ConfigError, match=r"TemplateSyntaxError: Unexpected end of template"):
        check_own_template(with_template("{% for m in messages %}"))


def test_a_template_failing_on_one_row_names_the_template_not_the_row():
    tokenizer = with_template(EMPTY_DIVIDES, "models/divides")
    check_own_template(tokenizer)  # every probe message has text
    encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    empty = [TWO_TURNS[0], {"role": "assistant", "content": ""}]
    with pytest.raises(ConfigError, match=r"chat template of 'models/divides' fails on a conversation: "
                                          r"ZeroDivisionError: integer division or modulo by zero"):
        encode(tokenizer, empty, chat_format="tokenizer")
    # the template's own refusal of a conversation stays the row's error
    refusing = with_template(GOOD.replace("{% for", "{% if messages[0].content == 'no' %}"
                                          "{{ raise_exception('not this one') }}{% endif %}{% for"))
    with pytest.raises(InputError, match="not this one"):
        encode(refusing, [{"role": "user", "content": "no"}, TWO_TURNS[1]], chat_format="tokenizer")


def test_the_probe_runs_once_per_template_and_thinking_switch():
    tokenizer = with_template(GOOD)
    calls = counting(tokenizer)
    check_own_template(tokenizer)
    first = len(calls)
    assert first > 0
    check_own_template(tokenizer)
    assert len(calls) == first  # remembered: no render
    encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    once = len(calls)
    encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    assert len(calls) - once == 2 * 2  # each encode: the conversation and its turn's generation prompt
    before = len(calls)
    check_own_template(tokenizer, enable_thinking=True)
    assert len(calls) - before == first  # another switch: probed anew
    tokenizer.chat_template = SYSTEM_AS_USER  # another template on the same tokenizer: probed anew
    with pytest.raises(ConfigError, match="the same way"):
        check_own_template(tokenizer)


def reasoning_turns(first: str, last: str) -> list[dict]:
    return [TWO_TURNS[0], {**TWO_TURNS[1], "reasoning_content": first},
            TWO_TURNS[2], {**TWO_TURNS[3], "reasoning_content": last}]


def test_qwen3_drops_the_reasoning_of_turns_before_the_last_user_message():
    tokenizer = build_template_tokenizer("qwen3")
    conversation = reasoning_turns("4 is two twos.", "5 is odd.")
    assert earlier_reasoning(conversation) == [(1, "reasoning_content")]
    assert dropped_reasoning(tokenizer, conversation) == [(1, "reasoning_content")]
    assert renders_last_reasoning(tokenizer, "reasoning_content")
    # with it dropped, what is trained: the first answer, then the last turn with its reasoning
    encoded = encode(tokenizer, conversation, chat_format="tokenizer", enable_thinking=True)
    assert trained_pieces(tokenizer, encoded) == ["yes<|im_end|>", "<think>\n5 is odd.\n</think>\n\nno<|im_end|>"]


def test_reasoning_of_a_tool_call_after_the_last_user_message_is_kept():
    tokenizer = build_template_tokenizer("qwen3")
    call = {"type": "function", "function": {"name": "parity", "arguments": {"n": 5}}}
    conversation = [TWO_TURNS[0], {"role": "assistant", "content": "", "tool_calls": [call],
                                   "reasoning_content": "ask the tool"},
                    {"role": "tool", "content": "odd"}, {"role": "assistant", "content": "odd",
                                                         "reasoning_content": "the tool says odd"}]
    assert earlier_reasoning(conversation) == [(1, "reasoning_content")]
    assert dropped_reasoning(tokenizer, conversation) == []


def test_a_template_without_reasoning_renders_none_of_it():
    tokenizer = build_template_tokenizer("llama3")
    assert not renders_last_reasoning(tokenizer, "reasoning_content")
    assert dropped_reasoning(tokenizer, reasoning_turns("a", "b")) == [(1, "reasoning_content")]


def test_the_reasoning_check_renders_nothing_without_earlier_reasoning():
    """SFT's row check (align.stages.sft): no render for a row without reasoning, one probe for all the
    rows with last-turn reasoning, one render per row with earlier-turn reasoning."""
    from align.stages.sft import _reasoning_check

    tokenizer = build_template_tokenizer("qwen3")
    calls = counting(tokenizer)
    check = _reasoning_check(types.SimpleNamespace(thinking_turns="all"), tokenizer)
    last_only = reasoning_turns("", "5 is odd.")
    for k in range(5):
        check(f"r{k}", {"messages": TWO_TURNS}, TWO_TURNS)
    assert calls == []
    for k in range(5):
        check(f"r{k}", {"messages": last_only}, last_only)
    assert len(calls) == 1
    both = reasoning_turns("4 is two twos.", "5 is odd.")
    with pytest.raises(ConfigError, match=r"record 'r9': the chat template of .* leaves out the reasoning "
                                          r"\('reasoning_content'\) of assistant message 1, a turn before the "
                                          r"last.*thinking_turns=last_turn"):
        check("r9", {"messages": both}, both)
    assert len(calls) == 2
    lenient = _reasoning_check(types.SimpleNamespace(thinking_turns="last_turn"), tokenizer)
    lenient("r9", {"messages": both}, both)
    assert len(calls) == 2


def test_a_template_whose_markers_are_not_tokens_of_its_tokenizer_is_refused():
    """ChatML's markers on a tokenizer that lacks them (a template carried over from another model):
    each marker is named with the pieces it would be split into; with the markers added, it passes."""
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tokenizer = build_tokenizer()
    tokenizer.chat_template = chatml
    pieces = len(tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"])
    assert pieces > 1
    with pytest.raises(ConfigError) as caught:
        check_own_template(tokenizer)
    message = str(caught.value)
    assert f"'<|im_end|>' ({pieces} tokens)" in message and "'<|im_start|>' (" in message
    assert "does not hold as tokens" in message
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    check_own_template(tokenizer)
