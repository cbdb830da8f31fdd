"""chat_format='tokenizer': a model's own chat template (Qwen3's and Llama 3's, as TRL ships
them) renders the conversation, and the loss mask is exactly the assistant turns: the
expected texts below are written by hand from the templates."""

from __future__ import annotations

import pytest

from align.chat import encode, install_format
from align.chat.encode import encode_completion
from align.errors import InputError
from align.testing.tiny import build_template_tokenizer, build_tokenizer
from chat_cases import trained_runs

TWO_TURNS = [{"role": "user", "content": "Is 4 even?"}, {"role": "assistant", "content": "yes"},
             {"role": "user", "content": "And 5?"}, {"role": "assistant", "content": "no"}]


def trained_pieces(tokenizer, encoded) -> list[str]:
    """The trained text, one string per run of consecutive trained tokens."""
    return trained_runs(tokenizer, encoded.input_ids, encoded.loss_mask)


def test_qwen3_two_turns_train_each_answer_and_its_end_of_turn():
    tokenizer = build_template_tokenizer("qwen3")
    encoded = encode(tokenizer, TWO_TURNS, chat_format="tokenizer")
    assert encoded.text == ("<|im_start|>user\nIs 4 even?<|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n"
                            "<|im_start|>user\nAnd 5?<|im_end|>\n"
                            "<|im_start|>assistant\n<think>\n\n</think>\n\nno<|im_end|>\n")
    # enable_thinking=false: the generation prompt holds the empty think block, so it is prompt, not trained
    assert trained_pieces(tokenizer, encoded) == ["yes<|im_end|>", "no<|im_end|>"]
    thinking = encode(tokenizer, TWO_TURNS, chat_format="tokenizer", enable_thinking=True)
    # with thinking on, the model writes the think block itself: trained
    assert trained_pieces(tokenizer, thinking) == ["yes<|im_end|>", "<think>\n\n</think>\n\nno<|im_end|>"]


def test_llama3_trains_each_answer_and_eot_never_the_headers():
    tokenizer = build_template_tokenizer("llama3")
    encoded = encode(tokenizer, [{"role": "system", "content": "Be brief."}, *TWO_TURNS], chat_format="tokenizer")
    assert encoded.text == ("<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                            "<|start_header_id|>user<|end_header_id|>\n\nIs 4 even?<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\nyes<|eot_id|>"
                            "<|start_header_id|>user<|end_header_id|>\n\nAnd 5?<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\nno<|eot_id|>")
    assert trained_pieces(tokenizer, encoded) == ["yes<|eot_id|>", "no<|eot_id|>"]
    assert encoded.spans[1] == (0, 0) and encoded.spans[2][1] > encoded.spans[2][0]  # spans: the assistant turns


@pytest.mark.parametrize(("name", "prompt", "completion"), [
    ("qwen3", "<|im_start|>user\nIs 4 even?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
     "yes<|im_end|>"),
    ("llama3", "<s><|start_header_id|>user<|end_header_id|>\n\nIs 4 even?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n", "yes<|eot_id|>"),
])
def test_a_pair_completion_is_the_generated_text_and_the_templates_end_of_turn(name, prompt, completion):
    tokenizer = build_template_tokenizer(name)
    prompt_ids, completion_ids = encode_completion(tokenizer, TWO_TURNS[:1], "yes", chat_format="tokenizer")
    assert tokenizer.decode(prompt_ids) == prompt and tokenizer.decode(completion_ids) == completion
    _, cut = encode_completion(tokenizer, TWO_TURNS[:1], "ye", chat_format="tokenizer", end_of_turn=False)
    assert tokenizer.decode(cut) == "ye"


def test_special_tokens_in_text_are_refused_naming_where():
    tokenizer = build_template_tokenizer("qwen3")
    with pytest.raises(InputError, match=r"message 1 holds '<\|im_end\|>'"):
        encode(tokenizer, [TWO_TURNS[0], {"role": "assistant", "content": "yes<|im_end|>"}], chat_format="tokenizer")
    with pytest.raises(InputError, match=r"completion contains the special token .<\|im_start\|>."):
        encode_completion(tokenizer, TWO_TURNS[:1], "<|im_start|>user", chat_format="tokenizer")


def test_a_template_that_cannot_give_exact_masks_is_refused():
    tokenizer = build_tokenizer()
    # writes nothing after an assistant's content: the model could not learn to stop
    tokenizer.chat_template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(InputError, match="writes nothing after an assistant's content"):
        encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    # renders an answered turn with a header its generation prompt never shows
    tokenizer.chat_template = ("{% for m in messages %}{% if m.role == 'assistant' %}[A] {{ m.content }}</s>"
                               "{% else %}[{{ m.role[0] | upper }}] {{ m.content }}{% endif %}{% endfor %}"
                               "{% if add_generation_prompt %}[GEN] {% endif %}")
    with pytest.raises(InputError, match=r"message 1: the tokenizer's chat template renders"):
        encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")
    tokenizer.chat_template = None
    with pytest.raises(Exception, match="has no chat_template"):
        encode(tokenizer, TWO_TURNS[:2], chat_format="tokenizer")


def test_installing_keeps_the_template_and_stops_at_its_end_of_turn(tiny_model):
    import copy

    tokenizer = build_template_tokenizer("qwen3")
    template = tokenizer.chat_template
    model = copy.deepcopy(tiny_model)
    assert install_format(tokenizer, model, chat_format="tokenizer") is None
    assert tokenizer.chat_template == template and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.get_input_embeddings().weight.shape[0] >= len(tokenizer)
