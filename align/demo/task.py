"""The demo's task: sorting digits in the Apertus chat format, with a calculator tool.

Why sorting (measured on 2 CPU cores, plain PyTorch loops beside the library's SFT): the
0.9M-parameter model learns it smoothly in the chat format, so SFT can be stopped in the
middle (about 0.75 greedy accuracy), where most prompts have both right and wrong samples
and QRPO has something to learn from. Addition, the first choice, is learned through a long
plateau and a sudden jump, and in the chat format the jump did not come within the demo's
budget. Answers are checked exactly (the verifiable reward). A share of the SFT
conversations call a calculator tool for a multiplication, so the demo trains on tool calls
and tool outputs (which the loss mask must leave out) as well.

The tokenizer splits digits into single tokens and merges the constant chat-format text into
a few tokens (so sequences stay short on CPU).
"""

from __future__ import annotations

import random
import re
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from align.errors import ConfigError
from align.testing.tiny import (
    APERTUS_SPECIAL_TOKENS,
    BASE_SPECIAL_TOKENS,
    build_causal_lm,
    wrap_tokenizer,
)

SYSTEM = "Sort the digits."
TOOL_SYSTEM = "Use the calculator."
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12*7"}},
            "required": ["expression"],
        },
    },
}


def sorting_prompt(digits: str) -> list[dict[str, str]]:
    """The prompt conversation for one problem: a string of digits to sort."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": digits}]


def sorting_answer(digits: str) -> str:
    return "".join(sorted(digits))


def tool_conversation(a: int, b: int) -> dict[str, Any]:
    """A multiplication solved with the calculator: a tool call, its output, the answer."""
    expression = f"{a}*{b}"
    return {
        "messages": [
            {"role": "system", "content": TOOL_SYSTEM},
            {"role": "user", "content": expression},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
                ],
            },
            {"role": "tool", "content": str(a * b)},
            {"role": "assistant", "content": str(a * b)},
        ],
        "tools": [CALCULATOR],
    }


def _problems(rng: random.Random, count: int, exclude: set[str], length: int) -> list[str]:
    """``count`` distinct digit strings of ``length`` digits, none of them in ``exclude``."""
    out: list[str] = []
    seen = set(exclude)
    if count + len(seen) > 10**length:
        raise ConfigError(f"{count} problems of {length} digits: there are only {10**length}")
    while len(out) < count:
        problem = "".join(rng.choice("0123456789") for _ in range(length))
        if problem not in seen:
            seen.add(problem)
            out.append(problem)
    return out


def make_splits(
    *, sft: int, prompts: int, held_out: int, validation: int, tool_fraction: float, seed: int, length: int = 5
) -> dict[str, list[dict[str, Any]]]:
    """Disjoint problem sets: SFT conversations, QRPO prompts, validation and held-out eval.

    No problem appears in two sets, and none repeats within a set.
    """
    rng = random.Random(seed)
    held = _problems(rng, held_out, set(), length)
    val = _problems(rng, validation, set(held), length)
    prompt_problems = _problems(rng, prompts, set(held) | set(val), length)
    sft_problems = _problems(rng, sft, set(held) | set(val) | set(prompt_problems), length)

    def prompt_record(split: str, i: int, problem: str) -> dict[str, Any]:
        return {"id": f"{split}-{i:05d}", "messages": sorting_prompt(problem), "answer": sorting_answer(problem)}

    sft_rows = []
    for i, problem in enumerate(sft_problems):
        if rng.random() < tool_fraction:
            row = tool_conversation(rng.randrange(10, 100), rng.randrange(10, 100))
        else:
            row = {"messages": sorting_prompt(problem) + [{"role": "assistant", "content": sorting_answer(problem)}]}
        sft_rows.append({"id": f"sft-{i:05d}", **row})
    return {
        "sft": sft_rows,
        "prompts": [prompt_record("prompt", i, p) for i, p in enumerate(prompt_problems)],
        "validation": [prompt_record("val", i, p) for i, p in enumerate(val)],
        "held_out": [prompt_record("test", i, p) for i, p in enumerate(held)],
    }


def batch_by_kind(rows: list[dict[str, Any]], batch_size: int, *, seed: int) -> list[dict[str, Any]]:
    """Rows reordered so that each run of ``batch_size`` holds task rows only or tool calls only.

    Tool conversations are about twice as long as the others, so one tool row in a padded
    batch doubles its length. Batches of one kind (shuffled among each other, the rows
    shuffled within their kind) keep the other batches short; a sequential sampler then
    reads them in this order. Left-over rows of both kinds share the last batch. (Grouping
    rows by length instead was measured on addition: batches of sums below 1000 and of sums
    above it, and SFT stopped learning.)
    """
    rng = random.Random(seed)
    kinds: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for row in rows:
        kinds[bool(row.get("tools"))].append(row)
    batches: list[list[dict[str, Any]]] = []
    rest: list[dict[str, Any]] = []
    for group in kinds.values():
        rng.shuffle(group)
        full = len(group) - len(group) % batch_size
        batches += [group[i : i + batch_size] for i in range(0, full, batch_size)]
        rest += group[full:]
    rng.shuffle(batches)
    return [row for batch in batches for row in batch] + rest


def build_demo_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """BPE whose digits stay single tokens; the constant format text merges into few tokens.

    Only digits split the text before BPE (no word regex), so a constant run such as the
    developer block becomes one token and a prompt is about 20 tokens long.
    """
    specials = BASE_SPECIAL_TOKENS + APERTUS_SPECIAL_TOKENS
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Train on the text between special tokens, so a constant run merges into one token.
    splitter = re.compile("|".join(re.escape(t) for t in specials))
    tok.train_from_iterator((piece for text in texts for piece in splitter.split(text) if piece), trainer=trainer)
    return wrap_tokenizer(tok, specials)


def build_demo_model(tokenizer: PreTrainedTokenizerFast, *, seed: int) -> LlamaForCausalLM:
    """0.9M-parameter Llama (hidden 128, 4 layers, 4 heads of 32): the size that worked."""
    model = build_causal_lm(
        tokenizer, seed=seed, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
    )
    return model.train()  # the demo trains it; the tiny builder hands models out in eval mode
