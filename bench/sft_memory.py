"""Peak host memory of reading an SFT mixture, per rank: align's streamed read against reading it as rows.

    python bench/sft_memory.py --size-mb 600

Generates a JSONL mixture of at least ``--size-mb`` MB (conversations of 2-6 turns, some with
tool calls, as the SFT data the Apertus recipes read), then measures, each in a fresh process
(``ru_maxrss``, so the interpreter and its imports count too):

- ``rows``: what the SFT stage did before, and what a script that reads the file as records
  does: every row as a Python dict, JSON-encoded again, digested as one string, written, then
  loaded with ``datasets`` (every rank did all of it);
- ``main``: align now, on the main process: ``normalize_sft_input`` streams the file once
  into the rows SFT trains on (a line at a time), then ``load_sft_dataset`` maps it (Arrow);
- ``rank``: every other rank: the file is made, it only maps it.

Prints the file size, each peak and its ratio to the file size; the goal is at most 1.5x on
every rank (`tests/test_sft_memory.py` checks ``main`` and ``rank`` at 520 MB in CI).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the model answers every question about the weather in Bern and Zurich with care and numbers "
         "while checking each tool call result before it replies to the user in plain words").split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(rng: random.Random, index: int) -> dict:
    messages = []
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": sentence(rng, rng.randint(20, 120))})
        if rng.random() < 0.2:
            messages.append({"role": "assistant", "content": {"blocks": [
                {"type": "tool_calls", "calls": [{"name": "get_weather", "arguments": {"city": "Bern"}}]},
                {"type": "tool_outputs", "outputs": [{"output": str(rng.randint(0, 30))}]},
                {"type": "response", "text": sentence(rng, rng.randint(20, 200))}]}})
        else:
            messages.append({"role": "assistant", "content": sentence(rng, rng.randint(40, 400))})
    return {"id": f"row-{index}", "messages": messages}


def generate(path: Path, size_mb: int, seed: int = 0) -> int:
    """A mixture of at least ``size_mb`` MB; its size in bytes."""
    rng = random.Random(seed)
    target, written, index = size_mb * 1_000_000, 0, 0
    with path.open("w", encoding="utf-8") as handle:
        while written < target:
            line = json.dumps(conversation(rng, index)) + "\n"
            handle.write(line)
            written += len(line.encode())
            index += 1
    return path.stat().st_size


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(mode: str, source: str, cache: str) -> None:
    """One measurement, in this (fresh) process; prints a JSON line."""
    import datasets

    datasets.disable_progress_bars()
    from align.trainers.sft_data import load_sft_dataset, normalize_sft_input

    start = time.perf_counter()
    if mode == "rows":
        from align.io import read_records
        from align.io.fingerprint import json_digest
        from align.trainers.sft_data import sft_json_rows
        from align.io import write_jsonl

        rows = read_records(source)
        encoded = sft_json_rows(rows)
        path = Path(cache) / f"rows-{json_digest(encoded)[:16]}.jsonl"
        write_jsonl(path, encoded)
        dataset = load_sft_dataset(path)
    else:
        rows = normalize_sft_input(source, cache, chat_format="apertus", key="bench-sft-memory")
        dataset = load_sft_dataset(rows.path)
    print(json.dumps({"mode": mode, "rows": len(dataset), "peak_mib": peak_mib(),
                      "seconds": time.perf_counter() - start}))


def measure(mode: str, source: Path, cache: Path) -> dict:
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache / "hf")}  # main and rank share it, as ranks do
    done = subprocess.run([sys.executable, __file__, "--child", mode, str(source), str(cache)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=600)
    parser.add_argument("--modes", default="rows,main,rank")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "SOURCE", "CACHE"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="align-sft-memory-") as tmp:
        root = Path(tmp)
        source = root / "mixture.jsonl"
        size = generate(source, args.size_mb)
        size_mib = size / 2**20
        print(f"mixture: {size_mib:,.0f} MiB ({size:,} bytes)")
        results = {}
        for mode in args.modes.split(","):
            cache = root / ("cache" if mode != "rows" else "cache-rows")
            cache.mkdir(exist_ok=True)
            if mode == "rank":  # the file is made by the main process; the rank maps it with its own cache
                measure("main", source, cache) if "main" not in results else None
            results[mode] = result = measure(mode, source, cache)
            print(f"{mode:>5}: peak {result['peak_mib']:,.0f} MiB = {result['peak_mib'] / size_mib:.2f}x the file, "
                  f"{result['seconds']:.0f} s, {result['rows']:,} rows")
        print(json.dumps({"file_mib": size_mib, **{m: r["peak_mib"] / size_mib for m, r in results.items()}}))


if __name__ == "__main__":
    main()
