"""Annotation throughput: what length-sorted batching and charter-prefix reuse buy.

    python bench/annotation_throughput.py            # both measurements, ~5-7 min on 2 cores
    python bench/annotation_throughput.py --quick    # smaller sizes, a smoke run

1. Reward model: the same mixed-length completions scored with `RewardModel` in
   length-sorted batches vs fixed (input-order) batches. Goal: >= 2x.
2. Constitutional judge: the same completions rated pointwise with the transformers
   backend reusing the charter prefix's KV cache vs running every prompt in full.
   Goal: >= 4x.

Both sides of each pair run the library's real code path on the same random-weight
Llama models (built here, no download), big enough that compute, not Python, dominates.
The scores of the two sides are compared too (they must agree). The charter is the
project's default charter; the bench tokenizer is trained with the charter in its corpus
so that the charter is about as many tokens as with a real 100k-vocabulary tokenizer
(2,167 cl100k tokens), which the tiny test tokenizer (512 tokens, ~7,000) is not.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import time
from dataclasses import dataclass

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

from align.chat import install_format
from align.testing.tiny import build_tokenizer, corpus_text
from rewards.charter import load_charter
from rewards.judge import ConstitutionalJudge
from rewards.judge_backends import TransformersJudgeBackend
from rewards.reward_model import RewardModel


@dataclass
class BenchConfig:
    """Sizes of the two measurements (defaults: the figures in bench/README.md)."""

    # reward model: Llama classifier, heads of 64, MLP 3x hidden
    rm_hidden: int = 256
    rm_layers: int = 4
    rm_items: int = 64  # completions, lengths log-uniform in [rm_min_tokens, rm_max_tokens]
    rm_min_tokens: int = 24
    rm_max_tokens: int = 1536
    rm_batch: int = 8
    # judge: wider and shallower. Real judges are wide (Qwen3-32B: hidden 5,120), so at a
    # ~2.6k-token context the projections dominate; at hidden 256 attention would cost
    # ~1.7x the projections per token and misstate what prefix reuse saves.
    judge_hidden: int = 768
    judge_layers: int = 2
    judge_items: int = 16  # completions of 60-240 tokens
    judge_batch: int = 8
    vocab: int = 4096
    repeats: int = 2  # timed runs per side, alternating; the fastest counts
    seed: int = 0


def build_bench_tokenizer(vocab: int):
    """A BPE tokenizer that knows the charter's words, in the Apertus chat format."""
    charter_lines = load_charter().text().splitlines()
    tok = build_tokenizer(vocab_size=vocab, extra_text=charter_lines * 4)
    install_format(tok, chat_format="apertus")
    return tok


def llama_config(tok, hidden: int, layers: int, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
        max_position_embeddings=8192, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, **extra,
    )


def random_text(words: list[str], tok, target_tokens: int, rng: random.Random) -> str:
    """Words from the shipped corpus until the text is about `target_tokens` long."""
    out: list[str] = []
    while True:
        out += rng.sample(words, 16)
        text = " ".join(out)
        if len(tok(text, add_special_tokens=False)["input_ids"]) >= target_tokens:
            return text


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def alternate(sides: dict, repeats: int) -> dict:
    """Run each side `repeats` times, alternating, and keep its fastest run and result.

    The machine is shared: alternating spreads background load over both sides, and the
    minimum is the run least disturbed by it.
    """
    best: dict = {}
    for _ in range(repeats):
        for name, run in sides.items():
            seconds, result = timed(run)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, result)
    return best


def bench_reward_model(tok, words, cfg: BenchConfig, rng: random.Random) -> dict:
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(cfg.seed)
    model = LlamaForSequenceClassification(llama_config(tok, cfg.rm_hidden, cfg.rm_layers, num_labels=1)).eval()
    lengths = [int(math.exp(rng.uniform(math.log(cfg.rm_min_tokens), math.log(cfg.rm_max_tokens)))) for _ in range(cfg.rm_items)]
    conversations = [[{"role": "user", "content": random_text(words, tok, 20, rng)}] for _ in lengths]
    completions = [random_text(words, tok, n, rng) for n in lengths]
    runs = {}
    for name, sort in (("fixed order", False), ("length-sorted", True)):
        rm = RewardModel("bench-rm", model=model, tokenizer=tok, batch_size=cfg.rm_batch, sort_by_length=sort, max_length=4096)
        rm.score(conversations[:2], completions[:2])  # warm-up
        runs[name] = lambda rm=rm: rm.score(conversations, completions)
    sides = alternate(runs, cfg.repeats)
    fixed_s, fixed = sides["fixed order"]
    sorted_s, sorted_ = sides["length-sorted"]
    tokens = [s.details["num_tokens"] for s in sorted_]
    return {
        "fixed_s": fixed_s, "sorted_s": sorted_s, "ratio": fixed_s / sorted_s,
        "max_diff": max(abs(a.value - b.value) for a, b in zip(fixed, sorted_)),
        "tokens": sum(tokens), "min_len": min(tokens), "max_len": max(tokens),
        "padded_fixed": sum(max(tokens[i : i + cfg.rm_batch]) * len(tokens[i : i + cfg.rm_batch])
                            for i in range(0, len(tokens), cfg.rm_batch)),
    }


def bench_judge(tok, words, cfg: BenchConfig, rng: random.Random) -> dict:
    from transformers import LlamaForCausalLM

    torch.manual_seed(cfg.seed + 1)
    model = LlamaForCausalLM(llama_config(tok, cfg.judge_hidden, cfg.judge_layers)).eval()
    conversations = [[{"role": "user", "content": random_text(words, tok, rng.randint(15, 40), rng)}] for _ in range(cfg.judge_items)]
    completions = [random_text(words, tok, rng.randint(60, 240), rng) for _ in range(cfg.judge_items)]

    def run(reuse: bool):
        # a fresh backend per run: the prefix forward is paid inside every timed run
        backend = TransformersJudgeBackend(model, tok, batch_size=cfg.judge_batch, reuse_prefix=reuse)
        return ConstitutionalJudge(backend, top_k_pairwise=0).score(conversations, completions)

    sides = alternate({"full prompts": lambda: run(False), "prefix reused": lambda: run(True)}, cfg.repeats)
    prefix = ConstitutionalJudge(TransformersJudgeBackend(model, tok), top_k_pairwise=0)
    prompt_tokens = [len(tok(prefix.pointwise_prompt(c, r), add_special_tokens=False)["input_ids"])
                     for c, r in zip(conversations, completions)]
    full_s, full = sides["full prompts"]
    reuse_s, reused = sides["prefix reused"]
    return {
        "full_s": full_s, "reuse_s": reuse_s, "ratio": full_s / reuse_s,
        "max_diff": max(abs(a.value - b.value) for a, b in zip(full, reused)),
        "charter_tokens": len(tok(load_charter().text(), add_special_tokens=False)["input_ids"]),
        "prefix_tokens": len(tok(prefix.shared_prefix("pointwise"), add_special_tokens=False)["input_ids"]),
        "prompt_min": min(prompt_tokens), "prompt_max": max(prompt_tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run, ratios not meaningful)")
    parser.add_argument("--only", choices=["rm", "judge"], help="run one of the two measurements")
    args = parser.parse_args()
    cfg = BenchConfig()
    if args.quick:
        cfg = BenchConfig(rm_hidden=128, rm_layers=2, rm_items=16, rm_max_tokens=256, judge_hidden=128, judge_items=8, repeats=1)
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, fp32 on CPU")
    print(f"random-init Llama models (heads of 64, MLP 3x hidden): reward model hidden {cfg.rm_hidden} x {cfg.rm_layers} "
          f"layers, judge hidden {cfg.judge_hidden} x {cfg.judge_layers} layers; best of {cfg.repeats} alternating runs per side")
    rng = random.Random(cfg.seed)
    tok = build_bench_tokenizer(cfg.vocab)
    words = sorted(set(corpus_text().split()))

    if args.only in (None, "rm"):
        rm = bench_reward_model(tok, words, cfg, rng)
        print(f"\n[reward model] {cfg.rm_items} completions, {rm['min_len']}-{rm['max_len']} tokens "
              f"({rm['tokens']:,} in all; fixed-order batches pad to {rm['padded_fixed']:,}), batch {cfg.rm_batch}")
        print(f"  fixed-order batches : {rm['fixed_s']:7.2f} s")
        print(f"  length-sorted       : {rm['sorted_s']:7.2f} s")
        print(f"  speed-up            : {rm['ratio']:7.2f}x   (goal >= 2x; max |score diff| {rm['max_diff']:.1e})")
    if args.only in (None, "judge"):
        judge = bench_judge(tok, words, cfg, rng)
        print(f"\n[judge] {cfg.judge_items} completions, pointwise, batch {cfg.judge_batch}; default charter "
              f"{judge['charter_tokens']:,} tokens, shared prefix {judge['prefix_tokens']:,}, prompts "
              f"{judge['prompt_min']:,}-{judge['prompt_max']:,} tokens")
        print(f"  every prompt in full: {judge['full_s']:7.2f} s")
        print(f"  charter prefix reused: {judge['reuse_s']:6.2f} s")
        print(f"  speed-up            : {judge['ratio']:7.2f}x   (goal >= 4x; max |score diff| {judge['max_diff']:.1e})")


if __name__ == "__main__":
    main()
