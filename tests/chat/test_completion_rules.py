"""Rules of one (prompt, completion) tokenization and of a conversation cut at a token budget.

``encode_completion`` is what the reference pass, the preference trainer and annotation share: the
prompt it renders must be the one the model sampled from (the model's own template with the
conversation's thinking switch), and a doubled BOS is refused there as it is for whole
conversations. A conversation cut at ``max_tokens`` gives every message past the cut an empty
span at the start, as a message without tokens has elsewhere.
"""

from __future__ import annotations

import pytest

from align.chat import encode
from align.chat.encode import encode_completion
from align.errors import ConfigError, InputError
from align.testing.tiny import build_tokenizer

GOOD = ("{% for m in messages %}<|{{ m.role }}_start|>{{ m.content }}<|{{ m.role }}_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant_start|>{% endif %}")
# With thinking off the generation prompt closes an empty reasoning block (as Qwen3's template does).
THINKING_SWITCH = GOOD.replace(
    "<|assistant_start|>{% endif %}",
    "<|assistant_start|>{% if enable_thinking is defined and not enable_thinking %}"
    "<|inner_prefix|><|inner_suffix|>{% endif %}{% endif %}")
PROMPT = [{"role": "user", "content": "Is 4 even?"}]


def with_template(template: str) -> object:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def pieces(tokenizer, ids) -> list[str]:
    return tokenizer.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("thinking", [False, True])
def test_the_completion_prompt_follows_the_conversation_thinking_switch(thinking):
    """The prompt ids are the template's generation prompt rendered with the same switch the sampler used."""
    tokenizer = with_template(THINKING_SWITCH)
    prompt_ids, completion_ids = encode_completion(tokenizer, PROMPT, "yes", chat_format="tokenizer",
                                                   enable_thinking=thinking)
    tail = pieces(tokenizer, prompt_ids)[-3:]
    if thinking:
        assert tail[-1] == "<|assistant_start|>" and "<|inner_prefix|>" not in tail
    else:
        assert tail == ["<|assistant_start|>", "<|inner_prefix|>", "<|inner_suffix|>"]
    assert tokenizer.decode(completion_ids).startswith("yes")


@pytest.mark.parametrize("chat_format", ["tokenizer"])
def test_a_completion_whose_prompt_starts_with_two_bos_tokens_is_refused(chat_format):
    tokenizer = with_template("{{ bos_token }}{{ bos_token }}" + GOOD)
    with pytest.raises(InputError, match="the token ids start with two BOS tokens"):
        encode_completion(tokenizer, PROMPT, "yes", chat_format=chat_format)
    one = with_template("{{ bos_token }}" + GOOD)
    prompt_ids, _ = encode_completion(one, PROMPT, "yes", chat_format=chat_format)
    assert prompt_ids[0] == one.bos_token_id and prompt_ids[1] != one.bos_token_id


@pytest.mark.parametrize("chat_format", ["apertus", "tokenizer"])
def test_messages_past_the_cut_span_no_token_at_the_end(chat_format):
    """A conversation cut inside its first message: every span is the whole text's span cut at the
    budget, so the messages past the cut span no token, at the end (those far past it too)."""
    tokenizer = with_template(GOOD)
    conversation = [{"role": "user", "content": "a b c d e f g h"}, {"role": "assistant", "content": "yes"},
                    {"role": "user", "content": "more " * 400}, {"role": "assistant", "content": "no"}]
    whole = encode(tokenizer, conversation, chat_format=chat_format)
    first = encode(tokenizer, conversation, chat_format=chat_format, max_tokens=3)
    assert first.input_ids == whole.input_ids[:3]
    assert whole.spans[1][0] > 3 and len(first.text) > 1000  # the assistant turns start past the cut
    assert first.spans == [(min(a, 3), min(b, 3)) for a, b in whole.spans]
    assert first.spans[1] == first.spans[3] == (3, 3)


def test_a_template_that_writes_the_assistant_text_twice_is_refused():
    """Where such a turn starts and ends cannot be told (the opener before the first copy, the end after the
    last?), so the template is refused before any row is rendered; once is accepted."""
    twice = GOOD.replace("{{ m.content }}<|{{ m.role }}_end|>",
                         "{{ m.content }}{% if m.role == 'assistant' %} ({{ m.content }}){% endif %}<|{{ m.role }}_end|>")
    with pytest.raises(ConfigError, match="writes an assistant's text more than once in its turn"):
        encode_completion(with_template(twice), PROMPT, "yes", chat_format="tokenizer")
    prompt_ids, completion_ids = encode_completion(with_template(GOOD), PROMPT, "yes", chat_format="tokenizer")
    assert completion_ids
