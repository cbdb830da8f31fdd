"""The GPU check's report: the device it ran on, then each part's figures against the goals.

    python bench/gpu_check_report.py --env OUT/env.json      # what the node has (first part of gpu_check.sh)
    python bench/gpu_check_report.py --assemble OUT          # OUT/gpu_check.json and OUT/gpu_check.md

Goals (one H100-class GPU, 1B bf16): align's training step at 40% MFU or more; at least 2×
TRL DPOTrainer's tokens/s at no more than 0.6× its peak memory; the pass at least 2× TRL's
precompute; the tiny Apertus pipeline on CUDA equal to CPU within tolerance.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "triton", "transformers", "trl", "accelerate", "datasets", "deepspeed", "liger-kernel",
            "flash-attn", "peft")
GOALS = {"mfu": 0.40, "speed": 2.0, "memory": 0.6, "pass": 2.0}


def environment() -> dict[str, Any]:
    """Device, driver and package versions of this node."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    info: dict[str, Any] = {"date": datetime.date.today().isoformat(), "versions": versions,
                            "cuda_available": torch.cuda.is_available(),
                            "flex_attention": importlib.util.find_spec("torch.nn.attention.flex_attention") is not None,
                            "flash_attn_importable": importlib.util.find_spec("flash_attn") is not None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), memory_gib=props.total_memory / 2**30,
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda,
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))))
    return info


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def goal_lines(preference: dict | None) -> list[str]:
    """Each goal with the measured figure and whether it is met (or why it cannot be read)."""
    if not preference:
        return ["- preference bench: no results (see preference.log)"]
    results, peak, params = preference["results"], preference["matmul_peak_flops"], preference["params"]
    memory_key = "cuda_peak_mib" if preference["settings"]["device"] == "cuda" else "rss_increment_mib"
    ran = {k: r for k, r in results.items() if "error" not in r}
    lines = []
    training = {k: r for k, r in ran.items() if k.startswith("train_align")}
    if training:
        key, best = max(training.items(), key=lambda item: item[1]["tokens_per_s"])
        mfu = 6 * params * best["tokens_per_s"] / peak
        lines.append(f"- align training MFU: {mfu:.1%} ({best['name']}; goal >= {GOALS['mfu']:.0%}): "
                     f"{'met' if mfu >= GOALS['mfu'] else 'not met'}")
    trl = ran.get("train_trl")
    for ours in training.values() if trl is not None else ():
        speed = ours["tokens_per_s"] / trl["tokens_per_s"]
        memory = ours[memory_key] / trl[memory_key]
        met = speed >= GOALS["speed"] and memory <= GOALS["memory"]
        lines.append(f"- {ours['name']} vs TRL DPOTrainer (defaults): {speed:.2f}x tokens/s at {memory:.2f}x peak "
                     f"memory (goal >= {GOALS['speed']}x at <= {GOALS['memory']}x): {'met' if met else 'not met'}")
    trl_pass = ran.get("logps_trl")
    for key, ours in ran.items() if trl_pass is not None else ():
        if key.startswith("logps_align"):
            speed = ours["tokens_per_s"] / trl_pass["tokens_per_s"]
            lines.append(f"- {ours['name']} vs TRL precompute: {speed:.2f}x tokens/s (goal >= {GOALS['pass']}x): "
                         f"{'met' if speed >= GOALS['pass'] else 'not met'}")
    for key, result in results.items():
        if "error" in result:
            lines.append(f"- {key}: not run: {result['error']}")
    return lines


def tiny_lines(tiny: dict | None) -> list[str]:
    if not tiny:
        return ["- tiny Apertus: no results (see tiny_apertus.log)"]
    lines = []
    for name, result in tiny["variants"].items():
        if "error" in result:
            lines.append(f"- tiny Apertus {name}: failed: {result['error']}")
    for name, comparison in tiny["comparisons"].items():
        parts = ", ".join(f"{k} max |diff| {v['max_abs_diff']:.2e}" for k, v in comparison.items()
                          if isinstance(v, dict) and "max_abs_diff" in v)
        lines.append(f"- tiny Apertus {name} vs CPU: {'equal' if comparison['all_within'] else 'NOT equal'} "
                     f"within rtol {comparison['tolerance']['rtol']}, atol {comparison['tolerance']['atol']} "
                     f"({parts})")
    return lines


def sharded_lines(sharded: dict | None) -> list[str]:
    if not sharded:
        return ["- sharded pass: no results (see sharded_pass.log)"]
    rank = sharded["ranks"][0]
    lines = [f"- sharded pass, world size {sharded['world_size']}, {sharded['dtype']}: max |logp difference| "
             f"zero3 vs whole {rank.get('max_abs_diff')} (largest |logp| {rank.get('max_abs_logp'):.1f})"]
    for layout in ("replicate", "zero3"):
        if layout in rank:
            r = rank[layout]
            lines.append(f"  - {layout}: {r['sequences_per_s']:.1f} sequences/s, {r['GiB_after_load']:.2f} GiB after "
                         f"load, {r['GiB_peak_in_pass']:.2f} GiB peak in the pass")
    return lines


def assemble(out: Path) -> None:
    env = _read(out / "env.json") or {}
    preference, tiny, sharded = (_read(out / name) for name in ("preference.json", "tiny_apertus.json",
                                                                "sharded_pass.json"))
    parts = [json.loads(line) for line in (out / "parts.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "parts.jsonl").exists() else []
    table = (out / "preference.md").read_text() if (out / "preference.md").exists() else ""
    versions = env.get("versions", {})
    head = (f"Device: {env.get('device', 'no GPU')} ({env.get('memory_gib', 0):.0f} GiB, CUDA {env.get('cuda')}), "
            f"{env.get('date')}; torch {versions.get('torch')}, Triton {versions.get('triton')}, transformers "
            f"{versions.get('transformers')}, TRL {versions.get('trl')}, Liger {versions.get('liger-kernel')}, "
            f"flash-attn {versions.get('flash-attn') or 'not installed'}.")
    settings = (preference or {}).get("settings", {})
    dtype = "bf16" if settings.get("device") == "cuda" else "fp32"
    shape = (f"Preference bench: Llama {preference['params'] / 1e6:.0f}M {dtype}, {settings.get('batch_size')} pairs per "
             f"step, {settings.get('steps')} steps ({settings.get('warmup')} untimed), completions "
             f"{settings.get('min_len')}..{settings.get('max_len')} tokens; measured {dtype} matmul peak "
             f"{preference['matmul_peak_flops'] / 1e12:.1f} TFLOP/s.") if preference else ""
    timing = ", ".join(f"{p['part']} {p['seconds']} s (rc {p['rc']})" for p in parts)
    lines = ["# GPU check", "", head, "", f"Parts: {timing}.", "", shape, "", table, "## Goals", "",
             *goal_lines(preference), "", "## Correctness", "", *tiny_lines(tiny), *sharded_lines(sharded), ""]
    (out / "gpu_check.md").write_text("\n".join(lines))
    (out / "gpu_check.json").write_text(json.dumps({"environment": env, "parts": parts, "preference": preference,
                                                    "tiny_apertus": tiny, "sharded_pass": sharded}, indent=1))
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", help="write this node's environment here")
    parser.add_argument("--assemble", help="the GPU check's output folder")
    args = parser.parse_args(argv)
    if args.env:
        info = environment()
        Path(args.env).write_text(json.dumps(info, indent=1))
        print(json.dumps(info))
    if args.assemble:
        assemble(Path(args.assemble))


if __name__ == "__main__":
    main()
