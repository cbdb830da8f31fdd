"""Preference training throughput and memory: align's PreferenceTrainer vs TRL's DPOTrainer.

    python bench/preference_throughput.py              # ~23M-parameter Llama, completions 16..512 tokens
    python bench/preference_throughput.py --size 5m --prompt-max 300 --min-len 4 --max-len 600 --pass-rows 256
    python bench/preference_throughput.py --quick      # smaller model and lengths: a few minutes on 2 cores
    python bench/preference_throughput.py --device cuda --size 1b   # ~1B Llama, bf16, with MFU

Side by side, on the same locally built random-init Llama (saved once, loaded by every
contender), the same pair rows (mixed lengths) and the same batches (sequential order):

* training: align (precomputed reference log-probs, padding-free, DPO loss to match TRL)
  vs TRL's DPOTrainer with its defaults (reference model run on the fly, padded batches,
  gradient checkpointing); align is run with gradient checkpointing on (as TRL) and off;
* the reference log-prob pass: ``align.logprobs.compute_ref_logprobs`` vs TRL's
  ``precompute_ref_log_probs`` (its ``_precompute_ref_logps``, timed by wrapping it);
* align in two batch layouts: each pair's prompt once before its two completions
  (``prefix_sharing``, the default) and the layout before it (``prefix_sharing=false``:
  the prompt in each completion's sequence).

The run first measures the machine's matrix-multiply peak (a timed fp32 ``torch.mm`` large
enough to keep every core busy, or bf16 on CUDA) and reports each contender's model FLOPs
(6·N per trained token, 2·N per scored token; attention not counted) as a fraction of it.

Each contender runs in its own subprocess, so peak memory is its own: on CPU the peak
resident set (``VmHWM``) above the process's resident set after imports and data
(``VmRSS``); on CUDA ``torch.cuda.max_memory_allocated``. Throughput counts the same
useful tokens for everyone (prompt + completion, no padding, align's tokenization) over
the timed steps (the first step is a warm-up and not timed). Prints a table with ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DATE = "2025-09-01"

SIZES = {
    # name: hidden, layers, heads, kv heads, intermediate, vocab
    "5m": {"hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4,
           "intermediate_size": 384, "vocab_size": 32000},
    "quick": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
                  "intermediate_size": 704, "vocab_size": 32000},
    "23m": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 6,
                "intermediate_size": 1024, "vocab_size": 32000},
    # body-dominated, a real model's proportions (the head is 4M of 30M parameters, not 4M of 5M as in 5m)
    "body": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
             "intermediate_size": 1408, "vocab_size": 8000},
    "1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8,
               "intermediate_size": 5632, "vocab_size": 32000},
}


# --------------------------------------------------------------------------- shared setup


def build_tokenizer():
    from align.testing.tiny import build_tokenizer as tiny

    return tiny()


def make_rows(tokenizer, count: int, min_len: int, max_len: int, seed: int,
              prompt_range: tuple[int, int] = (10, 60)) -> list[dict]:
    """Pair rows whose completions are ``min_len``..``max_len`` tokens (uniform), end-of-turn included,
    and whose user turns are ``prompt_range`` tokens."""
    from align.testing.tiny import corpus_text

    rng = random.Random(seed)
    words = corpus_text().split()

    def text_of(tokens: int) -> str:
        ids: list[int] = []
        while len(ids) < tokens + 8:
            ids = tokenizer(" ".join(rng.choice(words) for _ in range(2 * tokens + 16)),
                            add_special_tokens=False)["input_ids"]
        return tokenizer.decode(ids[: tokens - 1]).strip() or "ok"

    return [{"id": f"b{i}", "messages": [{"role": "system", "content": "Answer well."},
                                         {"role": "user", "content": text_of(rng.randint(*prompt_range))}],
             "chosen": text_of(rng.randint(min_len, max_len)), "rejected": text_of(rng.randint(min_len, max_len)),
             "chosen_quantile": 1.0, "rejected_quantile": 0.0} for i in range(count)]


def encoded_tokens(tokenizer, rows: list[dict], max_length: int) -> list[int]:
    """Useful tokens per pair: prompt + chosen + prompt + rejected (align's tokenization, no padding)."""
    from align.scoring import encode_record

    out = []
    for row in rows:
        e = encode_record(tokenizer, row, max_length=max_length, chat_date=DATE)
        out.append(2 * len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"]))
    return out


def save_model(tokenizer, size: str, path: Path, device: str = "cpu") -> int:
    """Build the random-init Llama once; every contender loads these weights. Returns #params.

    Saved in bf16 for a CUDA run (the dtype every contender trains in there): half the bytes to load.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **SIZES[size])
    model = LlamaForCausalLM(config)
    if device == "cuda":
        model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def matmul_peak_flops(device: str) -> float:
    """The machine's measured matrix-multiply rate, FLOP/s: the best of timed square ``torch.mm``s.

    fp32 on CPU (the size, 2048, keeps every core busy for ~0.1 s per product), bf16 on CUDA.
    """
    import torch

    size = 2048 if device == "cpu" else 8192
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(6):
        StepTimer._sync()
        start = time.perf_counter()
        torch.mm(a, b)
        StepTimer._sync()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def memory_status() -> dict[str, float]:
    """Current and peak resident set of this process, MiB (Linux /proc)."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values


class StepTimer:
    """Trainer callback: wall time of each optimizer step."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer._sync()
                timer.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                timer._sync()
                timer.times.append(time.perf_counter() - timer.start)

        self.times: list[float] = []
        self.start = 0.0
        self.callback = _Callback()

    @staticmethod
    def _sync() -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


# --------------------------------------------------------------------------- workers (one per subprocess)


def _load(settings: dict):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if settings["device"] == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(settings["model_dir"], dtype=dtype,
                                                 attn_implementation=settings.get("attn", "sdpa"))
    return model.to(settings["device"])


def attention_label(settings: dict) -> str:
    """How a contender's attention runs, for its name: the masked grid unless it says otherwise."""
    attn = settings.get("attn", "sdpa")
    return {"sdpa": "", "flex_attention": ", FlexAttention", "flash_attention_2": ", FlashAttention-2"}.get(
        attn, f", {attn}")


def _finish(result: dict, baseline: dict, settings: dict) -> dict:
    import torch

    memory = memory_status()
    result.update(peak_rss_mib=memory["VmHWM"], rss_increment_mib=memory["VmHWM"] - baseline["VmRSS"])
    if settings["device"] == "cuda":
        result["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def _train_result(name: str, timer: StepTimer, step_tokens: list[int], baseline: dict, settings: dict) -> dict:
    warmup = settings.get("warmup", 1)
    timed = timer.times[warmup:]
    tokens = sum(step_tokens[warmup : len(timer.times)])
    result = {"name": name, "step_seconds": timer.times, "timed_tokens": tokens, "warmup_steps": warmup,
              "tokens_per_s": tokens / sum(timed) if timed else float("nan")}
    return _finish(result, baseline, settings)


def _step_tokens(settings: dict, tokenizer, rows: list[dict]) -> list[int]:
    per_pair = encoded_tokens(tokenizer, rows, settings["max_length"])
    b = settings["batch_size"]
    return [sum(per_pair[i : i + b]) for i in range(0, len(per_pair), b)]


def worker_logps_align(settings: dict) -> dict:
    from transformers import AutoTokenizer

    from align.logprobs import compute_ref_logprobs

    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    rows = json.loads(Path(settings["rows"]).read_text())
    tokens = sum(encoded_tokens(tokenizer, rows, settings["max_length"]))
    baseline = memory_status()
    model = _load(settings)
    start = time.perf_counter()
    shared = settings.get("prefix_sharing", "auto")
    blocks = settings.get("block_attention", False)
    output_dir = settings["ref_dir"] + f"-{shared}" + ("-blocks" if blocks else "") + settings.get("ref_suffix", "")
    budget = settings.get("max_batch_tokens")  # a token budget: rows up to it, at most 8x the row batch
    compute_ref_logprobs(rows, model, tokenizer, chat_format="apertus",
                         batch_size=settings["batch_size"] * (8 if budget else 1), max_batch_tokens=budget,
                         max_length=settings["max_length"], output_dir=output_dir,
                         chat_date=DATE, model_fingerprint="bench", prefix_sharing=shared, block_attention=blocks)
    StepTimer._sync()
    seconds = time.perf_counter() - start
    name = "align log-prob pass" + (" (prompt per sequence)" if shared is False else " (prefix-shared)")
    name += ", block attention" if blocks else ""
    name += f", {budget:,} tokens a batch" if budget else ""
    name += attention_label(settings)
    return _finish({"name": name, "seconds": seconds, "tokens_per_s": tokens / seconds, "kind": "pass"},
                   baseline, settings)


def _trl_config(settings: dict, **overrides):
    from trl import DPOConfig

    cuda = settings["device"] == "cuda"
    kwargs = {"output_dir": settings["work"] + "/trl", "per_device_train_batch_size": settings["batch_size"],
                  "max_steps": settings["steps"], "report_to": "none", "logging_steps": 1, "save_strategy": "no",
                  "disable_tqdm": True, "train_sampling_strategy": "sequential", "use_cpu": not cuda, "bf16": cuda,
                  "max_length": settings["max_length"]}
    kwargs.update(overrides)
    return DPOConfig(**kwargs)


def _trl_rows(rows: list[dict]) -> list[dict]:
    """The same pairs as TRL's standard (non-conversational) format: rendered prompt + completion text."""
    from align.chat import render

    return [{"prompt": render(r["messages"], add_generation_prompt=True, chat_date=DATE), "chosen": r["chosen"],
             "rejected": r["rejected"]} for r in rows]


def worker_logps_trl(settings: dict) -> dict:
    import datasets
    from transformers import AutoTokenizer
    from trl import DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    rows = json.loads(Path(settings["rows"]).read_text())
    tokens = sum(encoded_tokens(tokenizer, rows, settings["max_length"]))
    dataset = datasets.Dataset.from_list(_trl_rows(rows))
    baseline = memory_status()
    seconds: list[float] = []
    original = DPOTrainer._precompute_ref_logps

    def timed(self, *args, **kwargs):
        StepTimer._sync()
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        StepTimer._sync()
        seconds.append(time.perf_counter() - start)
        return out

    DPOTrainer._precompute_ref_logps = timed
    DPOTrainer(model=_load(settings), args=_trl_config(settings, precompute_ref_log_probs=True,
                                                       precompute_ref_batch_size=settings["batch_size"]),
               train_dataset=dataset, processing_class=tokenizer)
    return _finish({"name": "TRL precompute_ref_log_probs", "seconds": seconds[0],
                    "tokens_per_s": tokens / seconds[0], "kind": "pass"}, baseline, settings)


def worker_train_align(settings: dict) -> dict:
    from transformers import AutoTokenizer

    from align.logprobs import load_ref_logprobs
    from align.trainers import PreferenceConfig, PreferenceTrainer

    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    rows = json.loads(Path(settings["rows"]).read_text())[: settings["batch_size"] * settings["steps"]]
    data = load_ref_logprobs(settings["ref_dir"] + "-auto", rows)
    step_tokens = _step_tokens(settings, tokenizer, rows)
    baseline = memory_status()
    cuda = settings["device"] == "cuda"
    liger = {}
    if settings.get("liger"):  # Liger's RMSNorm, SwiGLU and RoPE kernels; align's own tiled LM head stays
        import liger_kernel  # noqa: F401  (an ImportError names the missing package in the report)

        liger = {"use_liger_kernel": True, "liger_kernel_config": {"rms_norm": True, "swiglu": True, "rope": True,
                                                                   "fused_linear_cross_entropy": False,
                                                                   "cross_entropy": False}}
    config = PreferenceConfig(
        **liger, output_dir=settings["work"] + "/align", per_device_train_batch_size=settings["batch_size"],
        max_steps=settings["steps"], report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        train_sampling_strategy="sequential", use_cpu=not cuda, bf16=cuda, max_length=settings["max_length"],
        chat_date=DATE, loss_type="dpo", length_normalize=False, beta=0.1, optimizer="adamw",
        learning_rate=1e-6, padding_free=True, gradient_checkpointing=settings["checkpointing"],
        checkpoint_modules=settings.get("checkpoint_modules", "layer"),
        prefix_sharing=settings.get("prefix_sharing", "auto"), block_attention=settings.get("block_attention", False))
    timer = StepTimer()
    trainer = PreferenceTrainer(_load(settings), config, train_dataset=data, processing_class=tokenizer,
                                callbacks=[timer.callback])
    trainer.train()
    layout = ", prompt per sequence" if settings.get("prefix_sharing") is False else ", prefix-shared"
    part = settings.get("checkpoint_modules", "layer")
    name = "align (precomputed ref, padding-free" + layout + (
        (", checkpointing" + ("" if part == "layer" else f" ({part} only)")) if settings["checkpointing"] else "")
    name += (", block attention" if settings.get("block_attention") else "") + (", Liger kernels" if liger else "")
    name += attention_label(settings) + ")"
    return _train_result(name, timer, step_tokens, baseline, settings)


def worker_train_trl(settings: dict) -> dict:
    import datasets
    from transformers import AutoTokenizer
    from trl import DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    rows = json.loads(Path(settings["rows"]).read_text())[: settings["batch_size"] * settings["steps"]]
    step_tokens = _step_tokens(settings, tokenizer, rows)
    dataset = datasets.Dataset.from_list(_trl_rows(rows))
    baseline = memory_status()
    timer = StepTimer()
    variant = settings.get("trl_variant", "defaults")
    overrides, name = {
        "defaults": ({}, "TRL DPOTrainer (defaults: live ref model, padded, checkpointing)"),
        "precomputed": ({"precompute_ref_log_probs": True, "precompute_ref_batch_size": settings["batch_size"]},
                        "TRL DPOTrainer (precomputed ref, padded, checkpointing)"),
        "liger": ({"use_liger_kernel": True}, "TRL DPOTrainer (Liger fused loss, live ref model, padded, checkpointing)"),
    }[variant]
    if variant == "liger":
        import liger_kernel  # noqa: F401  (an ImportError names the missing package in the report)
    trainer = DPOTrainer(model=_load(settings), args=_trl_config(settings, **overrides), train_dataset=dataset,
                         processing_class=tokenizer, callbacks=[timer.callback])
    trainer.train()
    return _train_result(name, timer, step_tokens, baseline, settings)


WORKERS = {"logps_align": worker_logps_align, "logps_trl": worker_logps_trl,
           "train_align": worker_train_align, "train_trl": worker_train_trl}


# --------------------------------------------------------------------------- driver


def run_worker(name: str, settings: dict) -> dict:
    """Run one contender in a fresh interpreter; its last stdout line is its JSON result."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
           "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, __file__, "--worker", name, "--settings", json.dumps(settings)],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_fraction(result: dict, params: int, peak_flops: float) -> float:
    """Model FLOPs (6·N per trained token, 2·N per scored one; attention not counted) over the measured peak."""
    per_token = 2 if result.get("kind") == "pass" else 6
    return per_token * params * result["tokens_per_s"] / peak_flops


CONTENDERS = (  # key, worker, settings (align's defaults unless named: prefix-shared, the masked grid)
    ("logps_trl", "logps_trl", {}),
    ("logps_align_per_sequence", "logps_align", {"prefix_sharing": False}),
    ("logps_align", "logps_align", {"prefix_sharing": "auto"}),
    ("logps_align_blocks", "logps_align", {"prefix_sharing": "auto", "block_attention": True}),
    ("train_trl", "train_trl", {}),
    ("train_align_per_sequence", "train_align", {"prefix_sharing": False, "checkpointing": False}),
    ("train_align", "train_align", {"prefix_sharing": "auto", "checkpointing": False}),
    ("train_align_ckpt", "train_align", {"prefix_sharing": "auto", "checkpointing": True}),
    ("train_align_ckpt_mlp", "train_align", {"prefix_sharing": "auto", "checkpointing": True,
                                             "checkpoint_modules": "mlp"}),
    ("train_align_blocks", "train_align", {"prefix_sharing": "auto", "checkpointing": False,
                                           "block_attention": True}),
)


GPU_CONTENDERS = (  # the GPU check (bench/gpu_check.sh): attention kernels and TRL's variants, most important first
    ("logps_trl", "logps_trl", {}),
    ("logps_align", "logps_align", {"prefix_sharing": "auto"}),
    ("logps_align_tokens", "logps_align", {"prefix_sharing": "auto", "max_batch_tokens": 32768, "ref_suffix": "-tokens"}),
    ("train_trl", "train_trl", {}),
    ("train_align_flex_ckpt_mlp", "train_align", {"prefix_sharing": "auto", "checkpointing": True,
                                                  "checkpoint_modules": "mlp", "attn": "flex_attention"}),
    ("train_align_flex_ckpt", "train_align", {"prefix_sharing": "auto", "checkpointing": True,
                                              "attn": "flex_attention"}),
    ("train_align_flex", "train_align", {"prefix_sharing": "auto", "checkpointing": False, "attn": "flex_attention"}),
    ("train_trl_precomputed", "train_trl", {"trl_variant": "precomputed"}),
    ("train_trl_liger", "train_trl", {"trl_variant": "liger"}),
    ("train_align_flex_ckpt_mlp_liger", "train_align", {"prefix_sharing": "auto", "checkpointing": True,
                                                        "checkpoint_modules": "mlp", "attn": "flex_attention",
                                                        "liger": True}),
    ("train_align_flex_ckpt_attention", "train_align", {"prefix_sharing": "auto", "checkpointing": True,
                                                        "checkpoint_modules": "attention", "attn": "flex_attention"}),
    ("logps_align_flex_tokens", "logps_align", {"prefix_sharing": "auto", "attn": "flex_attention",
                                                "max_batch_tokens": 32768, "ref_suffix": "-flex-tokens"}),
    ("train_align_ckpt", "train_align", {"prefix_sharing": "auto", "checkpointing": True}),
    ("train_align_ckpt_mlp", "train_align", {"prefix_sharing": "auto", "checkpointing": True,
                                             "checkpoint_modules": "mlp"}),
    ("train_align", "train_align", {"prefix_sharing": "auto", "checkpointing": False}),
    ("logps_align_flex", "logps_align", {"prefix_sharing": "auto", "attn": "flex_attention", "ref_suffix": "-flex"}),
    ("train_align_flash", "train_align", {"prefix_sharing": "auto", "checkpointing": False,
                                          "attn": "flash_attention_2"}),
)
CONTENDER_SETS = {"default": CONTENDERS, "gpu": GPU_CONTENDERS}


def gpu_report(results: dict[str, dict], settings: dict, params: int, peak_flops: float) -> str:
    """The GPU check's table: every contender that ran, its ratios against TRL's DPOTrainer and precompute."""
    memory_key = "cuda_peak_mib" if settings["device"] == "cuda" else "rss_increment_mib"
    trl, trl_pass = results.get("train_trl"), results.get("logps_trl")
    lines = ["| contender | tokens/s | MFU (of measured matmul peak) | peak memory (MiB) | vs TRL tokens/s | "
             "vs TRL memory |", "|---|---|---|---|---|---|"]
    for key, result in results.items():
        if "error" in result:
            lines.append(f"| {key} | not run: {result['error']} | | | | |")
            continue
        base = trl_pass if result.get("kind") == "pass" else trl
        ratio = memory = ""
        if base is not None and "error" not in base and base is not result:
            ratio = f"{result['tokens_per_s'] / base['tokens_per_s']:.2f}x"
            memory = f"{result[memory_key] / base[memory_key]:.2f}x"
        lines.append(f"| {result['name']} | {result['tokens_per_s']:,.0f} | "
                     f"{peak_fraction(result, params, peak_flops):.1%} | {result[memory_key]:,.0f} | {ratio} | "
                     f"{memory} |")
    return "\n".join(lines)


def report(results: dict[str, dict], settings: dict, params: int, peak_flops: float) -> str:
    memory_key = "cuda_peak_mib" if settings["device"] == "cuda" else "rss_increment_mib"
    lines = [(f"model: Llama {params / 1e6:.1f}M params ({settings['size']}), device {settings['device']}, "
              f"batch {settings['batch_size']} pairs, {settings['steps']} steps (first untimed), "
              f"prompts {settings['prompt_min']}..{settings['prompt_max']} tokens, "
              f"completions {settings['min_len']}..{settings['max_len']} tokens; "
              f"measured matmul peak {peak_flops / 1e9:.1f} GFLOP/s"),
             "", (f"| contender | tokens/s | fraction of matmul peak | peak memory (MiB, {memory_key}) | "
                  "peak RSS (MiB) |"), "|---|---|---|---|---|"]
    for result in results.values():
        lines.append(f"| {result['name']} | {result['tokens_per_s']:.0f} | "
                     f"{peak_fraction(result, params, peak_flops):.1%} | {result[memory_key]:.0f} | "
                     f"{result['peak_rss_mib']:.0f} |")
    trl, trl_pass = results["train_trl"], results["logps_trl"]
    lines.append("")
    for key in ("train_align_per_sequence", "train_align", "train_align_ckpt", "train_align_blocks"):
        ours = results[key]
        lines.append(f"{ours['name']} vs TRL DPOTrainer: {ours['tokens_per_s'] / trl['tokens_per_s']:.2f}x tokens/s, "
                     f"{ours[memory_key] / trl[memory_key]:.2f}x peak memory (targets >= 4x, <= 0.35x)")
    for key in ("logps_align_per_sequence", "logps_align", "logps_align_blocks"):
        ours = results[key]
        lines.append(f"{ours['name']} vs TRL precompute: {ours['tokens_per_s'] / trl_pass['tokens_per_s']:.2f}x "
                     f"tokens/s, {ours[memory_key] / trl_pass[memory_key]:.2f}x peak memory (target >= 2.5x)")

    def seconds_per_token(train: dict, logps: dict) -> float:  # one pass over the data and one epoch on it
        return 1 / train["tokens_per_s"] + 1 / logps["tokens_per_s"]

    for train_key, pass_key in (("train_align_per_sequence", "logps_align_per_sequence"),
                                ("train_align", "logps_align"), ("train_align_blocks", "logps_align_blocks")):
        ratio = seconds_per_token(trl, trl_pass) / seconds_per_token(results[train_key], results[pass_key])
        lines.append(f"pass + train, {results[pass_key]['name'].removeprefix('align log-prob pass ')} vs TRL "
                     f"precompute + train (TRL's train step with its live reference): {ratio:.2f}x (target >= 3x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller model, shorter completions, fewer steps")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--size", default=None, choices=sorted(SIZES), help="model size (default: 23m, quick: quick)")
    parser.add_argument("--batch-size", type=int, default=None, help="pairs per step (default 8, quick 4)")
    parser.add_argument("--steps", type=int, default=None, help="training steps, the first untimed (default 4)")
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=None, help="longest completion (default 512, quick 256)")
    parser.add_argument("--prompt-min", type=int, default=10, help="shortest user turn, tokens")
    parser.add_argument("--prompt-max", type=int, default=60, help="longest user turn, tokens")
    parser.add_argument("--pass-rows", type=int, default=None, help="pairs in the log-prob pass (default 64)")
    parser.add_argument("--only", default=None, help="comma-separated contender keys to run (default: all)")
    parser.add_argument("--contenders", default="default", choices=sorted(CONTENDER_SETS),
                        help="default: the CPU comparison; gpu: attention kernels and TRL's variants")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first training steps (compiles, caches)")
    parser.add_argument("--out-json", default=None, help="write the results here after every contender")
    parser.add_argument("--out-md", default=None, help="write the results table (markdown) here as it grows")
    parser.add_argument("--keep-going", action="store_true",
                        help="record a contender that fails (a missing package, a kernel) and go on")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.loads(args.settings))))
        return

    quick = args.quick
    settings: dict[str, Any] = {
        "device": args.device, "size": args.size or ("quick" if quick else "23m"),
        "batch_size": args.batch_size or (4 if quick else 8), "steps": args.steps or (3 if quick else 4),
        "min_len": args.min_len, "max_len": args.max_len or (256 if quick else 512), "max_length": 4096,
        "prompt_min": args.prompt_min, "prompt_max": args.prompt_max, "warmup": args.warmup,
    }
    peak = matmul_peak_flops(args.device)
    work = Path(tempfile.mkdtemp(prefix="bench_pref_"))
    tokenizer = build_tokenizer()
    pass_rows = args.pass_rows or (16 if quick else 64)
    rows = make_rows(tokenizer, max(pass_rows, settings["batch_size"] * settings["steps"]), settings["min_len"],
                     settings["max_len"], seed=0, prompt_range=(args.prompt_min, args.prompt_max))
    (work / "rows.json").write_text(json.dumps(rows))
    params = save_model(tokenizer, settings["size"], work / "model", args.device)
    settings.update(work=str(work), model_dir=str(work / "model"), rows=str(work / "rows.json"),
                    ref_dir=str(work / "ref"), checkpointing=True)
    print(f"workdir {work}; {len(rows)} pairs; model {params / 1e6:.1f}M params; "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s", flush=True)
    wanted = set(args.only.split(",")) if args.only else None
    results: dict[str, dict] = {}
    for key, worker, extra in CONTENDER_SETS[args.contenders]:
        if wanted is not None and key not in wanted and key != "logps_align":  # training reads the pass's output
            continue
        start = time.perf_counter()
        try:
            results[key] = run_worker(worker, {**settings, **extra})
        except RuntimeError as exc:
            if not args.keep_going:
                raise
            last = [line for line in str(exc).splitlines() if line.strip()][-1:]
            results[key] = {"error": last[0][:300] if last else "failed"}
            print(f"  {key}: failed: {results[key]['error']}", flush=True)
            continue
        print(f"  {results[key]['name']}: {results[key]['tokens_per_s']:.0f} tokens/s "
              f"({time.perf_counter() - start:.0f} s wall)", flush=True)
        write_outputs(args, results, settings, params, peak)
    print()
    if args.contenders == "gpu":
        print(gpu_report(results, settings, params, peak))
    elif wanted is None:
        print(report(results, settings, params, peak))
    write_outputs(args, results, settings, params, peak)
    print(json.dumps({"matmul_peak_flops": peak, "params": params, "results": results}))


def write_outputs(args: argparse.Namespace, results: dict[str, dict], settings: dict, params: int,
                  peak: float) -> None:
    """The JSON and markdown outputs, rewritten after each contender (a run cut short keeps what it measured)."""
    if args.out_json:
        Path(args.out_json).write_text(json.dumps({"matmul_peak_flops": peak, "params": params,
                                                   "settings": settings, "results": results}, indent=1))
    if args.out_md:
        Path(args.out_md).write_text(gpu_report(results, settings, params, peak) + "\n")


if __name__ == "__main__":
    main()
