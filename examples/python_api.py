"""The align pipeline from Python, notebook style, on a tiny model (CPU, well under a minute).

    python examples/python_api.py [OUTPUT_DIR]      # default runs/python_api

Every step is a function on lists of records or a `datasets.Dataset`, the same functions
the `align <stage>` commands call; the recipe-driven equivalent of this file is
`align pipeline recipes/tiny/pipeline.yaml`. Each `# %%` block is a notebook cell. The
task (recipes/tiny/data/): "Is N even? Answer yes or no." A 100k-parameter model learns
the answer format, not parity, so its samples are a mix of right and wrong answers, which
is what quantile rewards and pairs need. Nothing here is meant to learn anything useful.
"""

# %% Setup: data, output directory, a pinned date for the Apertus default system text
import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from align.chat import install_format
from align.data.pairs import make_pairs
from align.io import read_records
from align.io import read_output
from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.sampling import TransformersSampler, sample_references
from align.testing.tiny import build_causal_lm, build_tokenizer
from align.trainers.preference_config import PreferenceConfig
from align.trainers.preference_trainer import train as train_preference
from align.trainers.sft_config import SFTConfig
from align.trainers.sft_trainer import train_sft
from rewards import VerifiableReward
from rewards.annotate import score_records

DATA = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "data"
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/python_api")
DATE = "2026-01-01"  # pin it: SFT, sampling, log-probs and QRPO must render the same prompts
N = 4                # reference completions per prompt (Apertus: 10)
CPU = {"use_cpu": True, "bf16": False, "report_to": [], "save_strategy": "no", "disable_tqdm": True, "seed": 0}

sft_rows = Dataset.from_list(read_records(DATA / "sft.jsonl"))  # {"id", "messages"}
prompts = read_records(DATA / "prompts.jsonl")                  # {"id", "messages", "answer"}
print(f"{len(sft_rows)} SFT conversations, {len(prompts)} prompts -> {OUT}")

# %% 1. A tiny tokenizer and Llama, with the Apertus chat format installed
tokenizer = build_tokenizer()
model = build_causal_lm(tokenizer)
install_format(tokenizer, model, chat_format="apertus")  # special tokens, template, EOS = <|assistant_end|>
print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters; eos {tokenizer.eos_token}")

# %% 2. SFT: assistant-only loss from align.chat's masks, on TRL's SFTTrainer
sft = train_sft(
    SFTConfig(output_dir=str(OUT / "sft"), max_steps=40, per_device_train_batch_size=16, learning_rate=3e-3,
              lr_scheduler_type="constant", optimizer="adamw", max_length=256, logging_steps=10,
              chat_date=DATE, **CPU),
    sft_rows, model, tokenizer,
)
print(f"SFT: {sft.state.global_step} steps, last loss {[h for h in sft.state.log_history if 'loss' in h][-1]['loss']:.3f}")

# %% 3. n reference completions per prompt at T = 1 (a resumable job: rerun it and it skips what is done)
sampler = TransformersSampler(model, tokenizer, chat_format="apertus", chat_date=DATE, batch_size=8, model_name="tiny-sft")
sample_references(prompts, sampler, output_dir=OUT / "sample", n=N, max_tokens=8, seed=0)
sampled = read_output(OUT / "sample", expect_ids=[p["id"] for p in prompts])
print("first prompt's samples:", [c["text"] for c in sampled[0]["completions"]], "answer:", sampled[0]["answer"])

# %% 4. Verifiable rewards: 1.0 when the answer matches the record's `answer`, else 0.0
annotated = score_records(sampled, VerifiableReward(answer_field="answer"))
scored = [r for row in annotated for r in row["rewards"] if r is not None]
print(f"rewards: {sum(scored):.0f} right of {len(scored)} scored completions")

# %% 5. Quantile rewards against the n references, then chosen / rejected per prompt
pairs, skipped = make_pairs(annotated, seed=0, num_ref_rewards=N)
print(f"pairs: {len(pairs)} (skipped {len(skipped)}: {sorted({s['reason'] for s in skipped})[:2]})")

# %% 6. Reference log-probs under the SFT policy, once, offline (no reference model during QRPO)
compute_ref_logprobs(pairs, model, tokenizer, chat_format="apertus", max_length=256, output_dir=OUT / "logprobs",
                     chat_date=DATE)
rows = load_ref_logprobs(OUT / "logprobs", pairs)
print(f"ref log-probs: chosen {rows[0]['ref_chosen_logps']:.3f} over {rows[0]['chosen_length']} tokens, ...")

# %% 7. Length-normalised QRPO on the pairs (reference log-probs read from the rows)
before = {k: v.clone() for k, v in model.state_dict().items()}
qrpo = train_preference(
    PreferenceConfig(output_dir=str(OUT / "qrpo"), loss_type="qrpo", beta=5.0, length_normalize=True,
                     num_ref_rewards=N, chat_format="apertus", chat_date=DATE, max_length=256, max_steps=4,
                     per_device_train_batch_size=4, learning_rate=1e-4, optimizer="adamw", logging_steps=1, **CPU),
    Dataset.from_list(rows), model, tokenizer=tokenizer,
)
moved = sum(not torch.equal(before[k], v) for k, v in model.state_dict().items())
print(f"QRPO: {qrpo.state.global_step} steps; {moved} of {len(before)} weight tensors moved; saved to {OUT / 'qrpo'}")

# %% Summary (one JSON line, which tests/stages/test_examples.py reads)
print("RESULT " + json.dumps({
    "sft_steps": sft.state.global_step, "prompts": len(sampled),
    "completions": sum(len(r["completions"]) for r in sampled), "scored": len(scored), "right": int(sum(scored)),
    "pairs": len(pairs), "skipped": len(skipped), "ref_rows": len(rows), "qrpo_steps": qrpo.state.global_step,
    "tensors_moved": moved,
}))
