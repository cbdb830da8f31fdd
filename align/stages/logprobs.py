"""One offline pass of reference log-probs for the pairs (docs/method.md, QRPO).

For each pair row it adds ``ref_chosen_logps``, ``ref_rejected_logps`` (sums of
completion-token log-probs under the reference policy) and ``chosen_length``,
``rejected_length`` (completion tokens, end-of-turn included), with the tokenization the
trainer uses. Batches are sorted by length; the pass resumes after a kill; under
``accelerate launch`` each process takes a shard.

Example: ``accelerate launch --num_processes 8 -m align logprobs recipes/apertus-8b/logprobs.yaml``.
"""

from __future__ import annotations

from align.logprobs import LogprobsConfig as Config
from align.stages.common import (
    check_input_exists,
    check_model_path,
    check_output_dir,
    check_stage_input,
    finish,
)

__all__ = ["Config", "run"]


def run(config: Config) -> dict:
    """Compute (or reuse) reference log-probs; mark the output complete when all rows are in."""
    from align.io import is_complete
    from align.logprobs import load_records, missing_ids
    from align.logprobs import run as run_pass

    if config.output_dir is not None and is_complete(config.output_dir):
        print(f"[align logprobs] {config.output_dir} is already complete; skipping")
        return {}
    check_input_exists(config.dataset, "logprobs", "dataset")
    check_stage_input(config.dataset, "logprobs", "dataset")
    check_model_path(config.model_name_or_path, "logprobs", "model_name_or_path")
    if config.output_dir is not None:
        check_output_dir(config.output_dir, "logprobs")
    records = load_records(config.dataset)
    if not records:
        raise ValueError(f"logprobs: dataset={config.dataset!r} holds no rows (a directory is read as job "
                         "shards, shard-*.jsonl; for the pairs stage's output name the file: .../pairs.jsonl)")
    output_dir = run_pass(config)
    missing = missing_ids(output_dir, records)
    if missing:  # another shard (SLURM array task) has not finished yet
        print(f"[align logprobs] this shard is done; {len(missing)} rows wait for other shards in {output_dir}")
        return {"missing": len(missing)}
    return finish("logprobs", config, output_dir, {"rows": len(records)})
