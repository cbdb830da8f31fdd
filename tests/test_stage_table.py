"""align.stage_table: the one table of what a stage is, and every other table a read of it.

A new stage is its module and one entry: ``test_a_new_stage_needs_one_entry`` adds a toy
stage (tests/toy_stage.py) to the table in a fresh process, and the CLI, a step graph, a
recipe of sections, ``align status``, ``align submit`` and ``align plan`` all take it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from align import stage_table
from align.stage_table import STAGES

ROOT = Path(__file__).resolve().parents[1]


def test_the_other_tables_are_reads_of_the_stage_table():
    from align.manifests.settings import STAGE_NEUTRAL_KEYS
    from align.plan.recipe_plan import PLANNED_STAGES
    from align.recipe.rounds import ROUND_KEYS, ROUND_SECTIONS
    from align.recipe.settings import EXTRA_SECTIONS, SECTIONS
    from align.slurm.config import ARRAY_STAGES, LAUNCH_STAGES, SINGLE_STAGES, STEP_STAGES

    assert SECTIONS == ("decontaminate", "sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")
    assert EXTRA_SECTIONS == ("judge-validate", "sweep", "split", "join")
    assert ROUND_SECTIONS == ("sample", "annotate", "pairs", "logprobs", "train", "evaluate")
    assert ROUND_KEYS["logprobs"] == ("input", "model_name_or_path", "output_dir", "cache_dir")
    assert (ARRAY_STAGES, LAUNCH_STAGES) == (("sample", "annotate", "evaluate"), ("sft", "logprobs", "train"))
    assert set(SINGLE_STAGES) == {"decontaminate", "pairs", "judge-validate", "sweep", "split", "join"}
    assert set(STEP_STAGES) == set(STAGES)
    assert STAGE_NEUTRAL_KEYS["logprobs"] == {"batch_size", "padding_free", "max_row_tokens", "sharding"}
    assert STAGE_NEUTRAL_KEYS["train"] == {"target_margin"}  # a warning's threshold, not the model
    assert "sweep" not in STAGE_NEUTRAL_KEYS and "pairs" not in STAGE_NEUTRAL_KEYS
    assert set(PLANNED_STAGES) == {"decontaminate", "sft", "sample", "annotate", "pairs", "logprobs", "train",
                                   "evaluate", "judge-validate"}
    assert stage_table.data_file_of("pairs") == "pairs.jsonl" and stage_table.data_file_of("sweep-point") is None


def test_every_entry_names_a_module_with_a_config_and_run():
    for name, entry in STAGES.items():
        module = entry.load()
        assert hasattr(module, "Config") and callable(module.run), name
        for key in entry.reads:
            head = key.split(".")[0]
            assert head in {f.name for f in __import__("dataclasses").fields(module.Config)}, (name, key)


def test_the_row_contract_reads_each_kind_where_it_extends_another():
    assert stage_table.reads_as(stage_table.SCORED, (stage_table.PROMPTS,))
    assert stage_table.reads_as(stage_table.REF_PAIRS, (stage_table.PAIRS,))
    assert not stage_table.reads_as(stage_table.PAIRS, (stage_table.REF_PAIRS,))
    assert not stage_table.reads_as(stage_table.MODEL, (stage_table.PROMPTS,))
    assert STAGES["annotate"].writes_for({"provider": "classifier"}) == stage_table.LABELLED
    assert STAGES["annotate"].writes_for({"provider": "judge"}) == stage_table.SCORED
    assert STAGES["train"].reads["input"].kinds_for({"reference": "model"}) == (stage_table.PAIRS,)


TOY = textwrap.dedent("""
    import sys
    from align import stage_table
    from align.stage_table import PROMPTS, Reads, StageSpec

    stage_table.STAGES["toy"] = StageSpec("toy", "toy_stage", "count the words of each prompt", "single",
                                          reads={"input": Reads((PROMPTS,), what="prompt rows")}, writes=PROMPTS,
                                          keeps="input", data_file="words.jsonl", plan="rows")
    from align.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def align_with_toy(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", TOY, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_new_stage_needs_one_entry(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": "a b c"[: 2 * i + 1]}]})
                               + "\n" for i in range(3)))
    usage = align_with_toy(["--help"], tmp_path)
    assert "toy" in usage.stdout and "count the words of each prompt" in usage.stdout

    alone = align_with_toy(["toy", f"input={prompts}", "output_dir=alone"], tmp_path)
    assert alone.returncode == 0, alone.stderr
    assert [json.loads(line)["words"] for line in (tmp_path / "alone" / "words.jsonl").read_text().splitlines()] \
        == [1, 2, 3]

    (tmp_path / "graph.yaml").write_text(textwrap.dedent(f"""
        output_dir: g
        steps:
          count: {{stage: toy, input: {prompts}}}
          part: {{stage: split, input: "@count/words.jsonl", part: 1, parts: 2}}
        slurm: {{log_dir: g/slurm, gpus_per_task: 0}}
    """))
    ran = align_with_toy(["pipeline", "graph.yaml"], tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "step count (toy)" in ran.stdout and (tmp_path / "g" / "part" / "prompts.jsonl").exists()
    status = align_with_toy(["status", "graph.yaml"], tmp_path)
    assert status.returncode == 0, status.stderr
    assert [line.split()[:2] for line in status.stdout.splitlines()[:2]] == [["count", "done"], ["part", "done"]]
    refused = align_with_toy(["status", "graph.yaml", "steps.part.input=@count"], tmp_path)
    assert "name its data file: input=@count/words.jsonl" in refused.stderr, refused.stderr

    submitted = align_with_toy(["submit", "graph.yaml", "output_dir=g2", "slurm.log_dir=g2/slurm", "dry_run=true"],
                               tmp_path)  # not done there: submit writes every job
    assert submitted.returncode == 0, submitted.stderr
    script = (tmp_path / "g2" / "slurm" / "1-count.sbatch").read_text()
    assert "align step" in script and "count" in script and "--array" not in script  # one task: the table's job

    planned = align_with_toy(["plan", "graph.yaml", "--json"], tmp_path)
    assert planned.returncode == 0, planned.stderr
    jobs = json.loads(planned.stdout)["jobs"]
    assert [(j["step"], j["reason"]) for j in jobs] == [("count", "uses no GPU"), ("part", "uses no GPU")]

    (tmp_path / "sections.yaml").write_text(f"toy: {{input: {prompts}, output_dir: sections}}\n")
    section = align_with_toy(["pipeline", "sections.yaml"], tmp_path)
    assert section.returncode == 0, section.stderr
    assert (tmp_path / "sections" / "words.jsonl").exists()
