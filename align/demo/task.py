"""The demo's task: 3-digit addition in the Apertus chat format, with a calculator tool.

Why this task (measured, see the project's demo notes): 3-digit addition with zero-padded
operands is hard enough for a 1M-parameter model that SFT leaves room for QRPO, and its
answers can be checked exactly (the verifiable reward). A share of the SFT conversations
call a calculator tool for multiplication, so the demo trains on tool calls and tool
outputs (which the loss mask must leave out) as well.

The tokenizer splits digits into single tokens (so arithmetic is learnable) and merges
the constant chat-format text into a few tokens (so sequences stay short on CPU).
"""

from __future__ import annotations

import random
import re
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from align.testing.tiny import (
    APERTUS_SPECIAL_TOKENS,
    BASE_SPECIAL_TOKENS,
    build_causal_lm,
    wrap_tokenizer,
)

SYSTEM = "Add the two numbers."
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


def addition_prompt(a: int, b: int, digits: int = 3) -> list[dict[str, str]]:
    """The prompt conversation for one addition problem (operands zero-padded)."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{a:0{digits}d}+{b:0{digits}d}"}]


def addition_answer(a: int, b: int) -> str:
    return str(a + b)


def tool_conversation(a: int, b: int, digits: int = 3) -> dict[str, Any]:
    """A multiplication solved with the calculator: a tool call, its output, the answer."""
    expression = f"{a:0{digits}d}*{b:0{digits}d}"
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


def _pairs(rng: random.Random, count: int, exclude: set[tuple[int, int]], digits: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    seen = set(exclude)
    if count + len(seen) > 10 ** (2 * digits):
        raise ValueError(f"{count} problems with {digits}-digit operands: there are only {10 ** (2 * digits)}")
    while len(out) < count:
        pair = (rng.randrange(10**digits), rng.randrange(10**digits))
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def make_splits(
    *, sft: int, prompts: int, held_out: int, validation: int, tool_fraction: float, seed: int, digits: int = 3
) -> dict[str, list[dict[str, Any]]]:
    """Disjoint problem sets: SFT conversations, QRPO prompts, validation and held-out eval.

    Held-out, validation and QRPO prompts never overlap. With few digits the SFT set may
    repeat problems (it samples with replacement from what the others leave).
    """
    rng = random.Random(seed)
    held = _pairs(rng, held_out, set(), digits)
    val = _pairs(rng, validation, set(held), digits)
    prompt_pairs = _pairs(rng, prompts, set(held) | set(val), digits)
    taken = set(held) | set(val) | set(prompt_pairs)
    free = [(a, b) for a in range(10**digits) for b in range(10**digits) if (a, b) not in taken] if digits <= 2 else None
    sft_pairs = [rng.choice(free) for _ in range(sft)] if free is not None else _pairs(rng, sft, taken, digits)

    def prompt_record(split: str, i: int, a: int, b: int) -> dict[str, Any]:
        return {"id": f"{split}-{i:05d}", "messages": addition_prompt(a, b, digits), "answer": addition_answer(a, b)}

    sft_rows = []
    for i, (a, b) in enumerate(sft_pairs):
        if rng.random() < tool_fraction:
            row = tool_conversation(a, b, digits)
        else:
            row = {"messages": addition_prompt(a, b, digits) + [{"role": "assistant", "content": addition_answer(a, b)}]}
        sft_rows.append({"id": f"sft-{i:05d}", **row})
    return {
        "sft": sft_rows,
        "prompts": [prompt_record("prompt", i, a, b) for i, (a, b) in enumerate(prompt_pairs)],
        "validation": [prompt_record("val", i, a, b) for i, (a, b) in enumerate(val)],
        "held_out": [prompt_record("test", i, a, b) for i, (a, b) in enumerate(held)],
    }


def batch_by_kind(rows: list[dict[str, Any]], batch_size: int, *, seed: int) -> list[dict[str, Any]]:
    """Rows reordered so that each run of ``batch_size`` holds additions only or tool calls only.

    Tool conversations are about 48 tokens and additions about 22, so one tool row in a
    padded batch doubles its length. Batches of one kind (shuffled among each other, the
    rows shuffled within their kind) keep addition batches short; a sequential sampler
    then reads them in this order. Left-over rows of both kinds share the last batch.
    Sorting by length instead (a length-grouped sampler) made batches of sums below 1000
    and batches of sums above it, and SFT stopped learning (measured: loss still ~2.0
    after 270 steps, against 1.3 after 170 steps with random batches).
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
