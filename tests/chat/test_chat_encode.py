"""encode() masks and spans, and encode_completion(): the one tokenization path."""

from __future__ import annotations

import pytest
from chat_cases import CASE_IDS, CASES, DATE, TIME, by_name, template_kwargs, trained_runs

from align.chat import FORMATS, chat_template, encode, encode_completion, install_format
from align.testing.tiny import build_tokenizer


def _encode(tokenizer, case):
    install_format(tokenizer, chat_format=case.format)
    return encode(tokenizer, case.messages, chat_format=case.format, tools=case.tools,
                  add_generation_prompt=case.add_generation_prompt,
                  enable_thinking=case.enable_thinking, chat_date=DATE)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_mask_trains_exactly_the_assistant_text(case, tokenizer):
    enc = _encode(tokenizer, case)
    assert enc.text == case.expected
    assert trained_runs(tokenizer, enc.input_ids, enc.loss_mask) == case.trained
    assert 0 < sum(enc.loss_mask) < len(enc.loss_mask)
    assert len(enc.loss_mask) == len(enc.input_ids)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_ids_are_the_one_rendered_string_with_a_single_bos(case, tokenizer):
    enc = _encode(tokenizer, case)
    assert enc.input_ids == tokenizer(case.expected, add_special_tokens=False)["input_ids"]
    bos_id = tokenizer.convert_tokens_to_ids("<s>")
    expected_bos = 1 if FORMATS[case.format].bos else 0
    assert enc.input_ids.count(bos_id) == expected_bos
    assert (enc.input_ids[0] == bos_id) == bool(expected_bos)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_template_generation_marks_give_the_same_mask(case, tokenizer):
    enc = _encode(tokenizer, case)
    out = tokenizer.apply_chat_template(
        case.messages, chat_template=chat_template(case.format), tokenize=True,
        return_dict=True, return_assistant_tokens_mask=True, **template_kwargs(case))
    assert out["input_ids"] == enc.input_ids
    assert out["assistant_masks"] == enc.loss_mask


def test_spans_cover_each_message(tokenizer):
    case = by_name("apertus_openai_tool_messages")
    enc = _encode(tokenizer, case)
    pieces = [tokenizer.decode(enc.input_ids[a:b]) for a, b in enc.spans]
    assert pieces == [
        "<|user_start|>Compare Bern and Geneva.<|user_end|>",
        ('<|assistant_start|>Let me check both.<|tools_prefix|>[{"get_weather": {"city": "Bern"}}, '
        '{"get_weather": {"city": "Geneva"}}]<|tools_suffix|>'),
        "[18",
        ", 22]",
        "Geneva is warmer (22 vs 18).<|assistant_end|>",
    ]


def test_system_span_is_the_system_block(tokenizer):
    enc = _encode(tokenizer, by_name("apertus_plain_with_system"))
    a, b = enc.spans[0]
    assert tokenizer.decode(enc.input_ids[a:b]) == "<|system_start|>You are terse.<|system_end|>"


def test_token_straddling_the_mask_boundary_raises():
    # A tokenizer that learned "]." merges the closing bracket of a tool output (untrained)
    # with the first character of the reply (trained).
    tokenizer = build_tokenizer(extra_text=["x]. y"] * 300)
    messages = [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "content": "9"},
        {"role": "assistant", "content": ". It is nine."},
    ]
    with pytest.raises(ValueError, match=r"token \d+ \('\]\.'.*straddles the boundary between "
                       r"untrained text of message 2 and trained text of message 3"):
        encode(tokenizer, messages, tools=[TIME], chat_date=DATE)


def test_encode_needs_the_format_tokens(tokenizer):
    with pytest.raises(ValueError, match="lacks the 'chatml' tokens.*install_format"):
        encode(tokenizer, [{"role": "user", "content": "Hi"}], chat_format="chatml")


# -- encode_completion ---------------------------------------------------------------------


@pytest.mark.parametrize("name,completion,decoded", [
    ("apertus_generation_prompt", "Goodbye.", "Goodbye.<|assistant_end|>"),
    ("apertus_generation_prompt",
     ('<|inner_prefix|>Call it.<|inner_suffix|><|tools_prefix|>[{"get_weather": {"city": "Bern"}}]'
     "<|tools_suffix|>"),
     ('<|inner_prefix|>Call it.<|inner_suffix|><|tools_prefix|>[{"get_weather": {"city": "Bern"}}]'
     "<|tools_suffix|><|assistant_end|>")),
    ("apertus_continue_after_tool_output", "It is 21 degrees.",
     "It is 21 degrees.<|assistant_end|>"),
    ("llama3_generation_prompt", "Très bien.", "Très bien.\n\n<|eot_id|>"),
    ("chatml_multi_turn_generation_prompt", "D.", "D.<|im_end|>"),
])
def test_completion_ids_follow_the_prompt_ids(tokenizer, name, completion, decoded):
    case = by_name(name)
    install_format(tokenizer, chat_format=case.format)
    kw = {"chat_format": case.format, "tools": case.tools, "chat_date": DATE}
    prompt_ids, completion_ids = encode_completion(tokenizer, case.messages, completion, **kw)
    prompt = encode(tokenizer, case.messages, add_generation_prompt=True, **kw)
    assert prompt_ids == prompt.input_ids
    assert tokenizer.decode(completion_ids) == decoded
    if "<|" not in completion:  # a plain reply: the full conversation starts with the pair
        full = encode(tokenizer, case.messages + [{"role": "assistant", "content": completion}],
                      **kw)
        n, m = len(prompt_ids), len(completion_ids)
        assert full.input_ids[: n + m] == prompt_ids + completion_ids
        assert full.loss_mask[n : n + m] == [1] * m
        assert full.loss_mask[n + m :] == [0] * (len(full.input_ids) - n - m)  # chatml's "\n"


def test_merge_across_the_prompt_boundary_raises(tokenizer):
    # Continuing the assistant text "th" with "e end": alone "th" is ["t", "h"], but
    # "the end" tokenizes as ["t", "he", ...], so the prompt ids are not a prefix.
    messages = [{"role": "user", "content": "Say it"}, {"role": "assistant", "content": "th"}]
    with pytest.raises(ValueError, match="not a prefix.*merges text across the "
                       "prompt/completion boundary"):
        encode_completion(tokenizer, messages, "e end", chat_date=DATE)


def test_blank_line_merge_breaks_the_llama3_prefix():
    # The Lucie header ends with "\n\n". A tokenizer with a "\n\n" token (and GPT-2-style
    # pre-tokenization) splits it differently once text follows: the classic trap.
    tokenizer = build_tokenizer(extra_text=["x\n\n"] * 300)
    install_format(tokenizer, chat_format="llama3")
    with pytest.raises(ValueError, match="not a prefix"):
        encode_completion(tokenizer, [{"role": "user", "content": "Hi"}], "Hello", chat_format="llama3")


@pytest.mark.parametrize("completion,pattern", [
    ("Bye<|assistant_end|>", "already ends with '<\\|assistant_end\\|>'"),
    ("Bye<|user_start|>more", "contains the special token '<\\|user_start\\|>'"),
    (None, "completion must be a string"),
])
def test_bad_completion_raises(tokenizer, completion, pattern):
    with pytest.raises(ValueError, match=pattern):
        encode_completion(tokenizer, [{"role": "user", "content": "Hi"}], completion, chat_date=DATE)
