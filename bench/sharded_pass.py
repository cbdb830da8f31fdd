"""Scoring with the model whole per process or partitioned over the ranks (ZeRO-3): the same numbers? memory? speed?

    torchrun --nproc_per_node N bench/sharded_pass.py --model DIR
    torchrun --nproc_per_node N bench/sharded_pass.py --random-llama 1b     # a random-weight Llama, built here
    torchrun --nproc_per_node 8 bench/sharded_pass.py --model runs/apertus-70b/sft --layouts zero3

Each rank scores its own random token sequences (rank r gets ``rows + r`` of them, so the
shards are unequal and the partitioned model's ranks run dummy forwards to stay in step)
with ``align.scoring.completion_logps``: first the model loaded whole on each GPU
(``replicate``), then partitioned (``zero3``, ``align.scoring.sharded``). Rank 0 prints per
layout the GPU memory held right after loading and at the peak of the pass, the memory
left after releasing the model, sequences per second, and the largest difference of the
partitioned log-probs from the whole model's. Needs GPUs (nccl); on one GPU it checks the
code path and the numbers, not the memory saving (a partition of one rank is the model).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time

import torch


def random_llama(size: str, directory: str, dtype: torch.dtype) -> str:
    """A random-weight Llama of about ``size`` parameters (1b, 8b shapes), saved to ``directory``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shapes = {"tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,  # a smoke run on CPU
                       "num_attention_heads": 2, "num_key_value_heads": 2},
              "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
                     "num_attention_heads": 16, "num_key_value_heads": 4},
              "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8}}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=32000, max_position_embeddings=4096, **shapes[size])
        LlamaForCausalLM(config).to(dtype).save_pretrained(directory)
    torch.distributed.barrier()
    return directory


def sequences(rank: int, rows: int, tokens: int, vocab: int) -> list[tuple[list[int], list[int]]]:
    generator = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(rows + rank):
        ids = torch.randint(3, vocab, (tokens,), generator=generator).tolist()
        out.append((ids[: tokens // 4], ids[tokens // 4 :]))
    return out


def score(model: torch.nn.Module, seqs: list, batch_size: int) -> tuple[list[float], float]:
    from align.scoring import SequenceCollator, completion_logps
    from align.scoring.sharded import finish_forwards

    device = next(model.parameters()).device
    collator = SequenceCollator(pad_token_id=0)
    out: list[float] = []
    _sync()
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(seqs), batch_size):
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                     for k, v in collator.collate(seqs[i : i + batch_size]).items()}
            out.extend(completion_logps(model, batch).tolist())
    finish_forwards(model)
    _sync()
    return out, time.perf_counter() - start


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _allocated(peak: bool = False) -> int:
    """GPU memory allocated now (or at its peak since the last reset); 0 on CPU."""
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--random-llama", choices=["tiny", "1b", "8b"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layouts", nargs="+", choices=["replicate", "zero3"], default=["replicate", "zero3"],
                        help="zero3 alone for a model no GPU holds whole")
    parser.add_argument("--json", default=None, help="also write rank 0's report to this file")
    cli = parser.parse_args()

    from transformers import AutoConfig

    from align.scoring.sharded import (
        init_distributed,
        load_scoring_model,
        parameter_bytes,
        release_model,
        this_process_device,
    )

    init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    path = cli.model or random_llama(cli.random_llama, os.path.join(tempfile.gettempdir(), f"llama-{cli.random_llama}"),
                                     getattr(torch, cli.dtype))
    seqs = sequences(rank, cli.rows, cli.tokens, AutoConfig.from_pretrained(path).vocab_size)
    results, logps = {}, {}
    for sharding in cli.layouts:
        _free()
        before = _allocated()
        model = load_scoring_model(path, dtype=cli.dtype, sharding=sharding, device=this_process_device())
        loaded = _allocated() - before
        peak_load = _allocated(peak=True) - before
        held, whole = parameter_bytes(model)
        score(model, seqs[: cli.batch_size], cli.batch_size)  # warm-up (kernels, ZeRO-3's trace)
        _free()
        logps[sharding], seconds = score(model, seqs, cli.batch_size)
        peak = _allocated(peak=True) - before
        counts = {"real": getattr(model, "real_forwards", None), "dummy": getattr(model, "dummy_forwards", None)}
        release_model(model)  # a partitioned model lets its partitions go (align.scoring.sharded)
        del model
        _free()
        left = _allocated() - before
        results[sharding] = {"GiB_after_load": loaded / 2**30, "GiB_peak_while_loading": peak_load / 2**30,
                             "GiB_peak_in_pass": peak / 2**30, "GiB_left_after_release": left / 2**30,
                             "param_GiB_held": held / 2**30, "param_GiB_whole": whole / 2**30,
                             "sequences_per_s": len(seqs) / seconds, "forwards": counts}
    both = len(logps) == 2
    diff = max(abs(a - b) for a, b in zip(logps["replicate"], logps["zero3"])) if both else None
    scale = max(abs(a) for a in next(iter(logps.values())))
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, {"rank": rank, "max_abs_diff": diff, "max_abs_logp": scale,
                                                   **results})
    if rank == 0:
        text = json.dumps({"world_size": world, "model": path, "dtype": cli.dtype, "tokens": cli.tokens,
                           "ranks": gathered}, indent=1)
        print(text)
        if cli.json:
            with open(cli.json, "w") as f:
                f.write(text)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
