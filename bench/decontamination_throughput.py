"""Throughput of `align.data.decontaminate` and its speed-up over all-pairs matching.

    python bench/decontamination_throughput.py                  # 100k train × 10k bench
    python bench/decontamination_throughput.py --train 10000    # a quicker look

Synthetic text from a seeded word generator (Zipf-distributed made-up words, some
punctuation). Benchmarks get shared subject headers, as MMLU-style prompts do, so the
index also meets candidates that share only boilerplate. Known contaminated training
prompts are planted: exact copies, copies with one word changed, and copies wrapped in
an instruction; the script prints recall on them and how many other records were removed.

The all-pairs baseline runs SequenceMatcher on every (train, bench) pair for a few
training prompts and is extrapolated to the subsample; the indexed path runs on the
same subsample in one process, so both sides are single-core.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time

from align.data.decontaminate import MatchSettings, decontaminate
from align.data.ngram_index import NgramIndex, build_tokenizer, is_contaminated

CONSONANTS = "bcdfghjklmnprstvz"
VOWELS = "aeiou"


def make_vocab(rng: random.Random, size: int) -> list[str]:
    """Distinct pronounceable made-up words of one to four syllables."""
    words: set[str] = set()
    while len(words) < size:
        syllables = rng.randint(1, 4)
        words.add("".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables)))
    return sorted(words)


class TextGen:
    """Seeded Zipf word sequences with occasional commas and a closing mark."""

    def __init__(self, rng: random.Random, vocab_size: int = 30000):
        self.rng = rng
        self.vocab = make_vocab(rng, vocab_size)
        self.cum = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(vocab_size)))

    def words(self, n: int) -> list[str]:
        return self.rng.choices(self.vocab, cum_weights=self.cum, k=n)

    def sentence(self, low: int, high: int) -> str:
        words = self.words(self.rng.randint(low, high))
        for i in range(3, len(words) - 1, 9):
            words[i] += ","
        return " ".join(words) + self.rng.choice(".?")


def make_benchmark(
    gen: TextGen, size: int, headers: int, per_header: int
) -> tuple[list[str], list[str]]:
    """Benchmark prompts of 20–80 words; ``headers × per_header`` of them share a header."""
    heads = [gen.sentence(10, 14) for _ in range(headers)]
    prompts = [gen.sentence(20, 80) for _ in range(size)]
    for h, head in enumerate(heads):
        for j in range(per_header):
            prompts[h * per_header + j] = head + " " + prompts[h * per_header + j]
    return prompts, heads


def one_word_changed(gen: TextGen, text: str) -> str:
    words = text.split(" ")
    i = gen.rng.randrange(len(words))
    words[i] = gen.words(1)[0]
    return " ".join(words)


def make_train(
    gen: TextGen, bench: list[str], heads: list[str], size: int, planted: int, headed: int
) -> tuple[list[dict], set[int]]:
    """Training records (messages schema) with ``planted`` known copies at random rows."""
    rng = gen.rng
    texts = [gen.sentence(15, 120) for _ in range(size)]
    for i in rng.sample(range(size), headed):  # shares a header only: must be kept
        texts[i] = rng.choice(heads) + " " + texts[i]
    rows = rng.sample(range(size), planted)
    for k, i in enumerate(rows):
        source = rng.choice(bench)
        kind = k % 3
        if kind == 0:
            texts[i] = source
        elif kind == 1:
            texts[i] = one_word_changed(gen, source)
        else:
            texts[i] = f"{gen.sentence(3, 8)} {source} {gen.sentence(3, 8)}"
    records = [
        {
            "id": f"t{i}",
            "messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}],
        }
        for i, t in enumerate(texts)
    ]
    return records, set(rows)


def all_pairs_seconds(train: list[list[int]], bench: list[list[int]], config) -> tuple[float, list]:
    """Time of the unindexed rule on every pair, and the items each prompt matched."""
    start = time.perf_counter()
    found = [
        [j for j, b in enumerate(bench) if is_contaminated(t, b, config.min_block, config.ratio)]
        for t in train
    ]
    return time.perf_counter() - start, found


def indexed_seconds(texts: list[str], index: NgramIndex, tokenize) -> tuple[float, list]:
    start = time.perf_counter()
    found = [[m.bench for m in index.match(tokenize(t))] for t in texts]
    return time.perf_counter() - start, found


def subsample_rows(size: int, planted: set[int], args) -> list[int]:
    """A quarter planted rows; the all-pairs prompts (first ones) are half planted."""
    k = args.all_pairs_prompts
    hits = sorted(planted)[: max(args.subsample // 4, k // 2)]
    misses = [i for i in range(size) if i not in planted][: args.subsample - len(hits)]
    return hits[: k // 2] + misses[: k - k // 2] + hits[k // 2 :] + misses[k - k // 2 :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--bench", type=int, default=10_000)
    parser.add_argument("--planted", type=int, default=1_500)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--subsample", type=int, default=200)
    parser.add_argument("--all-pairs-prompts", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    gen = TextGen(rng)
    bench, heads = make_benchmark(gen, args.bench, headers=50, per_header=40)
    records, planted = make_train(
        gen, bench, heads, args.train, args.planted, headed=args.train // 50
    )
    config = MatchSettings(num_workers=args.workers)
    print(
        f"train {len(records)} records, bench {len(bench)} prompts, planted {len(planted)}, "
        f"workers {config.workers()}"
    )

    start = time.perf_counter()
    _, removed, summary = decontaminate(records, {"synthetic": bench}, config)
    seconds = time.perf_counter() - start
    removed_rows = {row["index"] for row in removed}
    print(
        f"full run: {seconds:.1f} s, {len(records) / seconds:,.0f} prompts/s "
        f"(index: {summary['index_grams']:,} grams)"
    )
    print(
        f"recall on planted copies: {len(removed_rows & planted)}/{len(planted)}; "
        f"other records removed: {len(removed_rows - planted)}"
    )

    tokenize = build_tokenizer(config.tokenizer)
    bench_ids = [tokenize(b) for b in bench]
    index = NgramIndex(
        bench_ids, ngram=config.ngram, min_block=config.min_block, ratio=config.ratio
    )
    sub = [
        records[i]["messages"][0]["content"] for i in subsample_rows(len(records), planted, args)
    ]
    sub_ids = [tokenize(t) for t in sub[: args.all_pairs_prompts]]
    pair_s, pair_found = all_pairs_seconds(sub_ids, bench_ids, config)
    pair_total = pair_s / len(sub_ids) * len(sub)
    idx_s, idx_found = indexed_seconds(sub, index, tokenize)
    agree = pair_found == idx_found[: len(sub_ids)]
    print(
        f"all-pairs: {pair_s:.1f} s for {len(sub_ids)} × {len(bench)} pairs, "
        f"extrapolated {pair_total:.0f} s for {len(sub)} prompts"
    )
    print(
        f"indexed on the same {len(sub)} prompts: {idx_s * 1000:.1f} ms "
        f"(speed-up ×{pair_total / idx_s:,.0f}; decisions agree on the all-pairs prompts: {agree})"
    )


if __name__ == "__main__":
    main()
