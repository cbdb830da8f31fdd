"""The tiny Apertus pipeline (SFT → reference pass → QRPO) on CUDA against CPU: the same numbers?

    python bench/gpu_tiny_apertus.py --out DIR            # on a GPU node: CPU fp32 vs CUDA fp32/bf16/FlexAttention
    python bench/gpu_tiny_apertus.py --out DIR --variants cpu cpu   # a smoke run without a GPU

Each variant runs in its own process from the same random-init tiny Apertus (xIELU with
trainable scalars, QK-norm, untied head; ``align.testing.tiny.build_apertus_lm`` at hidden
128, head dimension 32; ``ALIGN_TINY_ARCH=llama`` or ``qwen3`` for the others): 3 SFT
steps, the reference log-prob pass over 8 pairs (prefix-shared, padding-free), 2 QRPO steps
from the SFT model on those log-probs. It records the SFT and QRPO losses, the pass's
log-probs and the final weights, and compares each variant with the first (CPU, fp32, sdpa):

- ``cuda``: fp32 on the GPU with sdpa (TF32 off): fp32 tolerance;
- ``cuda-flex``: fp32 on the GPU with ``attn_implementation: flex_attention`` (the block
  masks of ``align.scoring.flex``, forward and backward): fp32 tolerance;
- ``cuda-bf16``: bf16 mixed precision with sdpa: bf16 tolerance.

Writes ``DIR/tiny_apertus.json`` (every figure and whether each is within its tolerance).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DATE = "2025-09-01"
MAX_LENGTH = 128
VARIANTS = {
    "cpu": {"device": "cpu", "bf16": False, "attn": "sdpa"},
    "cuda": {"device": "cuda", "bf16": False, "attn": "sdpa"},
    "cuda-flex": {"device": "cuda", "bf16": False, "attn": "flex_attention"},
    "cuda-bf16": {"device": "cuda", "bf16": True, "attn": "sdpa"},
}
# |found - expected| <= rtol * |expected| + atol, per quantity: fp32 after 3 + 2 optimizer steps
# on another device's kernels, and bf16 (8 mantissa bits: about 4e-3 relative per value).
TOLERANCES = {False: {"rtol": 1e-3, "atol": 1e-3}, True: {"rtol": 5e-2, "atol": 5e-2}}


def sft_rows(count: int = 12) -> list[dict]:
    return [{"id": f"c{i}", "messages": [{"role": "user", "content": f"what is {i} plus {i}?"},
                                         {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]}
            for i in range(count)]


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def run_variant(name: str, work: Path) -> dict:
    """SFT → pass → QRPO on one device; the figures that the comparison reads."""
    import torch

    from align.logprobs import compute_ref_logprobs, load_ref_logprobs
    from align.testing.tiny import ARCHITECTURES, build_tokenizer, quantile_pair_rows
    from align.trainers import PreferenceConfig, train
    from align.trainers.sft_config import SFTConfig
    from align.trainers.sft_trainer import train_sft

    variant = VARIANTS[name]
    cpu = variant["device"] == "cpu"
    if not cpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    tokenizer = build_tokenizer()
    build = ARCHITECTURES[os.environ.get("ALIGN_TINY_ARCH", "apertus")]
    # head dimension 32 (hidden 128, 4 heads): at the tiny default of 16, torch 2.11's Triton kernel for
    # FlexAttention found no configuration in fp32 (NoValidChoicesError, one H200, 2026-11-27)
    model = build(tokenizer, seed=0, attn_implementation=variant["attn"], hidden_size=128, intermediate_size=256)
    common = {"use_cpu": cpu, "bf16": variant["bf16"], "report_to": [], "seed": 0, "logging_steps": 1,
              "save_strategy": "no", "chat_date": DATE, "max_length": MAX_LENGTH, "disable_tqdm": True,
              "learning_rate": 1e-3}
    sft = train_sft(SFTConfig(output_dir=str(work / "sft"), per_device_train_batch_size=4, max_steps=3, **common),
                    sft_rows(), model, tokenizer)
    policy = sft.model
    rows = quantile_pair_rows(8)
    compute_ref_logprobs(rows, policy, tokenizer, chat_format="apertus", batch_size=4, max_length=MAX_LENGTH,
                         output_dir=str(work / "ref"), chat_date=DATE, padding_free=True, prefix_sharing="auto")
    scored = load_ref_logprobs(str(work / "ref"), rows)
    qrpo = train(PreferenceConfig(output_dir=str(work / "qrpo"), per_device_train_batch_size=4, max_steps=2,
                                  loss_type="qrpo", optimizer="adamw", padding_free=True, prefix_sharing="auto",
                                  **common), scored, policy, tokenizer=tokenizer)
    weights = {n: p.detach().float().cpu() for n, p in qrpo.model.named_parameters()}
    torch.save(weights, work / "weights.pt")
    return {"variant": name, **variant, "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name() if not cpu else "cpu",
            "attn_used": getattr(qrpo.model.config, "_attn_implementation", None),
            "sft_losses": losses(sft), "qrpo_losses": losses(qrpo),
            "ref_logps": [[r["ref_chosen_logps"], r["ref_rejected_logps"]] for r in scored],
            "weights": str(work / "weights.pt"),
            "xielu_scalars": sorted(n for n in weights if "alpha" in n)[:4]}


def within(found, expected, rtol: float, atol: float) -> tuple[bool, float]:
    """Whether every value is within tolerance, and the largest absolute difference."""
    import torch

    a, b = torch.as_tensor(found, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64)
    if a.shape != b.shape:
        return False, float("inf")
    diff = (a - b).abs()
    return bool((diff <= rtol * b.abs() + atol).all()), float(diff.max()) if diff.numel() else 0.0


def compare(base: dict, other: dict) -> dict:
    import torch

    tolerance = TOLERANCES[other["bf16"]]
    out = {}
    for key in ("sft_losses", "ref_logps", "qrpo_losses"):
        ok, worst = within(other[key], base[key], **tolerance)
        out[key] = {"within": ok, "max_abs_diff": worst}
    a, b = torch.load(other["weights"]), torch.load(base["weights"])
    checks = [within(a[n], b[n], **tolerance) for n in b]
    out["weights"] = {"within": all(ok for ok, _ in checks), "max_abs_diff": max(w for _, w in checks),
                      "tensors": len(checks)}
    out["tolerance"] = tolerance
    out["all_within"] = all(v["within"] for k, v in out.items() if isinstance(v, dict) and "within" in v)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for tiny_apertus.json")
    parser.add_argument("--variants", nargs="+", default=["cpu", "cuda", "cuda-flex", "cuda-bf16"],
                        help="the first is the reference (default: cpu)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_variant(args.worker, Path(args.work))))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="tiny_apertus_"))
    runs, report = [], {"variants": {}, "comparisons": {}}
    for i, name in enumerate(args.variants):
        work = root / f"{i}-{name}"
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1",
               "CUDA_VISIBLE_DEVICES": "" if VARIANTS[name]["device"] == "cpu" else os.environ.get(
                   "CUDA_VISIBLE_DEVICES", "0")}
        done = subprocess.run([sys.executable, __file__, "--out", str(out), "--worker", name, "--work", str(work)],
                              capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "Error" in line or "error:" in line]
            report["variants"][name] = {"error": (errors[-1] if errors else done.stderr.strip()[-400:])[:400],
                                        "stderr_tail": done.stderr[-6000:]}
            print(f"{name}: failed: {report['variants'][name]['error']}", flush=True)
        else:
            result = json.loads(done.stdout.strip().splitlines()[-1])
            report["variants"][name] = result
            runs.append(result)
            print(f"{name}: SFT losses {[round(x, 4) for x in result['sft_losses']]}, QRPO losses "
                  f"{[round(x, 4) for x in result['qrpo_losses']]} ({result['device_name']}, {result['attn_used']})",
                  flush=True)
            if runs[0] is not result and runs[0]["variant"] == args.variants[0]:
                report["comparisons"][name] = compare(runs[0], result)
                print(f"  vs {args.variants[0]}: {json.dumps(report['comparisons'][name])}", flush=True)
        (out / "tiny_apertus.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
