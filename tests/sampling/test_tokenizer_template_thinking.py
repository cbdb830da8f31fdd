"""`chat_format: tokenizer` passes `enable_thinking` to the model's own chat template.

An offline model such as Qwen3 reads the switch as a template variable; without it the
template's default (thinking on) renders, and the completions carry their reasoning.
"""

from __future__ import annotations

import pytest

from align.sampling.base import PromptEncoder
from align.testing.tiny import build_tokenizer

# A Qwen3-like template: the generation prompt opens an empty thought when thinking is off,
# and thinking is on unless the caller says otherwise.
THINKING_TEMPLATE = (
    "{%- for m in messages -%}<|{{ m['role'] }}|>{{ m['content'] }}\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and enable_thinking is false -%}[no-think]"
    "{%- else -%}[think]{%- endif -%}{%- endif -%}"
)
CONV = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})  # the template's markers
    tok.chat_template = THINKING_TEMPLATE
    return tok


@pytest.mark.parametrize("enable_thinking, marker", [(False, "[no-think]"), (True, "[think]")])
def test_tokenizer_template_follows_enable_thinking(tokenizer, enable_thinking, marker):
    text = PromptEncoder(tokenizer, "tokenizer", enable_thinking=enable_thinking).render(CONV)
    assert text.endswith(marker), text


def test_tokenizer_format_ids_follow_the_setting(tokenizer):
    off = PromptEncoder(tokenizer, "tokenizer", enable_thinking=False).prompt_ids(CONV)
    on = PromptEncoder(tokenizer, "tokenizer", enable_thinking=True).prompt_ids(CONV)
    assert off != on


def test_sampler_config_reaches_the_tokenizer_template(tokenizer, tmp_path):
    from align.sampling.config import SamplerConfig, build_sampler
    from align.testing.tiny import build_causal_lm

    build_causal_lm(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    sampler = build_sampler(SamplerConfig(backend="transformers", model=str(tmp_path),
                                          chat_format="tokenizer", enable_thinking=False))
    assert sampler.encoder.render(CONV).endswith("[no-think]")
