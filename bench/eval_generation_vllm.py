"""What the evaluation's generation costs on vLLM: one call or two, per-request seeds or not.

    python bench/eval_generation_vllm.py --model PATH --prompts held_out.jsonl \
        [--num-prompts 256] [--n 4] [--max-tokens 1024] [--chat-format apertus]

Needs a GPU node with the official ``vllm`` (``pip install align[vllm]``). One engine is
built (a `VLLMSampler`, so prompts are rendered and tokenized as ``align evaluate`` does)
and the same job batch is generated three ways, each run twice (the first run also warms
the engine and the prefix cache, so compare the second):

- ``two calls``: the greedy requests in one ``generate`` call, then the sampled ones (what
  the evaluation did before ``sample_many``);
- ``one call``: greedy and sampled requests in one call, per-request seeds (what
  ``align evaluate`` does now);
- ``one call, unseeded``: the same requests with ``seed=None`` on the sampled ones, so the
  engine draws from its own generator (no per-row sampling path; not reproducible).

Compare generated tokens per second: ``one call`` against ``two calls`` is the gain of
scheduling both groups together; ``one call, unseeded`` against ``one call`` is the cost of
per-request seeds. Wall times alone mislead for the unseeded run, whose completions (and
so their lengths) differ. See docs/environment.md, "Evaluation generation on vLLM".
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="prompt records (id, messages), JSONL or a stage output")
    parser.add_argument("--num-prompts", type=int, default=256, help="one job batch (the evaluation's batch_size)")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--chat-format", default="apertus")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args = parser.parse_args()

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from align.io import read_records
    from align.sampling.base import SampleRequest, derive_seed, stream_seed
    from align.sampling.vllm_backend import VLLMSampler

    records = list(read_records(args.prompts))[: args.num_prompts]
    sampler = VLLMSampler(args.model, chat_format=args.chat_format, chat_date="2026-01-01",
                          tensor_parallel_size=args.tensor_parallel_size)
    convs = [r["messages"] for r in records]
    tools = [r.get("tools") for r in records]
    seeds = [derive_seed(0, r["id"]) for r in records]
    greedy = SampleRequest(convs, 1, temperature=0.0, max_tokens=args.max_tokens, seed=seeds, tools=tools)
    sampled = SampleRequest(convs, args.n, temperature=1.0, max_tokens=args.max_tokens, seed=seeds, tools=tools)

    def unseeded() -> int:
        """Both groups in one call, the sampled requests without a seed."""
        inputs, params = [], []
        for request, seeded in ((greedy, True), (sampled, False)):
            for conv, tool, seed in zip(request.conversations, tools, seeds):
                ids = sampler.encoder.prompt_ids(conv, tool)
                inputs.append(TokensPrompt(prompt_token_ids=ids))
                params.append(SamplingParams(
                    n=request.n, temperature=request.temperature, top_p=1.0,
                    max_tokens=min(args.max_tokens, sampler.max_model_len - len(ids)),
                    seed=stream_seed(seed, ids) if seeded else None, stop_token_ids=sampler.encoder.stop_ids,
                    skip_special_tokens=False, detokenize=False))
        outputs = sampler.llm.generate(inputs, params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outputs for c in o.outputs)

    def tokens(groups) -> int:
        return sum(c.num_tokens for group in groups for row in group for c in row)

    ways = {
        "two calls": lambda: tokens([sampler.sample_many([greedy])[0], sampler.sample_many([sampled])[0]]),
        "one call": lambda: tokens(sampler.sample_many([greedy, sampled])),
        "one call, unseeded": unseeded,
    }
    print(f"{len(records)} prompts x (1 greedy + {args.n} samples), max_tokens {args.max_tokens}, {args.model}")
    for run in (1, 2):
        for name, way in ways.items():
            start = time.perf_counter()
            count = way()
            seconds = time.perf_counter() - start
            print(f"run {run}  {name:<20} {seconds:8.1f} s  {count:9d} tokens  {count / seconds:9.0f} tokens/s")


if __name__ == "__main__":
    main()
