"""Remove training prompts that overlap benchmark prompts (Apertus §E.1.2; docs/method.md, Decontamination).

An 8-gram prefilter over an inverted index, then Ratcliff-Obershelp matching blocks of at
least 5 tokens; a prompt is contaminated when its blocks cover more than half of a
benchmark prompt. Writes ``kept.jsonl``, ``removed.jsonl`` (each with the benchmark items
it matched and the overlap ratio) and ``summary.json`` (per benchmark).

Example: ``align decontaminate recipes/decontaminate.yaml num_workers=8``.
"""

from __future__ import annotations

from align.data.decontaminate import DecontaminationConfig as Config
from align.data.decontaminate import decontaminate_files
from align.stages.common import already_done, finish

__all__ = ["Config", "run"]


def run(config: Config) -> dict:
    """Decontaminate the training file against every benchmark in the recipe."""
    if config.output_dir is None:
        raise ValueError("decontaminate: output_dir is required (where kept.jsonl and removed.jsonl go)")
    if already_done(config.output_dir, "decontaminate"):
        return {}
    summary = decontaminate_files(config)
    return finish("decontaminate", config, config.output_dir, summary)
