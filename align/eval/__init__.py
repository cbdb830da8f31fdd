"""Evaluation: did the alignment run work, and by how much?

- `align.eval.stats`: win rates and verdicts (the bootstrap intervals it re-exports live in
  `align.bootstrap`).
- `align.eval.kl`: KL(π‖π_ref) estimated from the policy's own samples.
- `align.eval.evaluate`: generate with several policies, score, compare to a baseline,
  and write ``eval.jsonl``, ``report.json``, ``report.md`` and plots.
- `align.eval.callback`: the same comparison during training, every ``eval_steps``.
"""
