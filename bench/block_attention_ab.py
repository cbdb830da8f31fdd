"""Block attention against the masked grid, alternating in one process on the same batches.

    python bench/block_attention_ab.py            # 5.4M Llama, 64 pairs (8 batches of 8), 3 rounds

The preference bench runs its contenders one after another, each in its own process, and
on a shared machine the speed of the cores drifts between them by more than the difference
between these two attention paths. Here one model scores the same prefix-shared batches
(forward and backward of ``completion_logps``, no optimizer), switching between ``sdpa`` on
the row's 4D mask and ``sdpa_blocks`` (``align.scoring.block_attention``) every round, the
order alternating, so drift falls on both sides. Prints each round's seconds and the
medians; the log-probs of both sides must agree (it prints the largest difference).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import preference_throughput as bench  # the same rows, tokenizer and model shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="5m", choices=sorted(bench.SIZES))
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from align.scoring import completion_logps, encode_record
    from align.scoring.block_attention import use_block_attention
    from align.scoring.collators import PreferenceCollator

    tokenizer = bench.build_tokenizer()
    rows = bench.make_rows(tokenizer, args.pairs, 4, 600, seed=0, prompt_range=(8, 300))
    features = [encode_record(tokenizer, row, max_length=4096, chat_date=bench.DATE) for row in rows]
    work = Path(tempfile.mkdtemp(prefix="bench_blocks_"))
    bench.save_model(tokenizer, args.size, work / "model")
    model = bench._load({"model_dir": str(work / "model"), "device": "cpu"})
    seconds: dict[str, list[float]] = {"masked grid": [], "blocks": []}
    scores: dict[str, torch.Tensor] = {}
    for round_ in range(args.rounds):
        for mode in ("masked grid", "blocks") if round_ % 2 == 0 else ("blocks", "masked grid"):
            if mode == "blocks":
                use_block_attention(model)
            else:
                model.set_attn_implementation("sdpa")
            collator = PreferenceCollator(pad_token_id=tokenizer.pad_token_id, padding_free=True, prefix_sharing=True,
                                          attention_blocks=mode == "blocks", mask_dtype=torch.float32)
            start, found = time.perf_counter(), []
            for first in range(0, len(features), args.batch_size):
                model.zero_grad()
                logps = completion_logps(model, collator(features[first:first + args.batch_size]))
                logps.sum().backward()
                found.append(logps.detach())
            seconds[mode].append(time.perf_counter() - start)
            scores[mode] = torch.cat(found)
            print(f"round {round_}: {mode}: {seconds[mode][-1]:.2f} s", flush=True)
    grid, blocks = (statistics.median(seconds[m]) for m in ("masked grid", "blocks"))
    print(f"median: masked grid {grid:.2f} s, blocks {blocks:.2f} s: blocks {grid / blocks:.2f}x as fast; "
          f"largest log-prob difference {(scores['blocks'] - scores['masked grid']).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
