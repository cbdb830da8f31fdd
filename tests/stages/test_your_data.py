"""docs/your-data.md: each minimal example row runs through the stage that reads it, with
the optional fields left out (their defaults filled in), and a row missing several required
fields is refused with one error naming all of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from stage_helpers import TINY_RECIPE, run_cli

from align.data.records import validate_completions
from align.errors import RecordError
from align.io import read_output, read_records

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "your-data.md"
_EXAMPLE = re.compile(r"<!-- example: ([\w-]+) -->\n```json\n(.*?)\n```", re.DOTALL)


def examples() -> dict[str, dict]:
    return {name: json.loads(body) for name, body in _EXAMPLE.findall(PAGE.read_text())}


def _file(tmp_path: Path, name: str, row: dict) -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def test_the_page_gives_one_row_per_input():
    assert sorted(examples()) == ["pairs", "prompts", "qrpo-pairs", "scored", "sft"]


def test_the_conversation_trains(tmp_path, stage_models):
    data = _file(tmp_path, "sft", examples()["sft"])
    printed = run_cli(["sft", TINY_RECIPE, f"model_name_or_path={stage_models['policy']}", f"input={data}",
                       f"output_dir={tmp_path / 'sft'}", "max_steps=1"])
    assert (tmp_path / "sft" / "config.json").is_file(), printed


def test_the_prompt_samples(tmp_path, sft_run):
    data = _file(tmp_path, "prompts", examples()["prompts"])
    run_cli(["sample", TINY_RECIPE, f"prompts={data}", f"output_dir={tmp_path / 'sample'}",
             f"sampler.model={sft_run[0]}", "n=2"])
    (row,) = read_output(tmp_path / "sample")
    assert row["id"] == "p1" and len(row["completions"]) == 2


def test_completions_scored_elsewhere_pair_with_the_optional_fields_filled_in(tmp_path):
    data = _file(tmp_path, "scored", examples()["scored"])
    run_cli(["pairs", TINY_RECIPE, f"input={data}", f"output_dir={tmp_path / 'pairs'}", "num_ref_rewards=4"])
    (pair,) = read_records(tmp_path / "pairs" / "pairs.jsonl")
    # "no" (0.9) is the top quantile; "yes" (0.1, quantile 1/4) the only one in the low bucket
    assert (pair["chosen"], pair["rejected"]) == ("no", "yes")
    assert pair["chosen_finish_reason"] == pair["rejected_finish_reason"] == "stop"
    assert (pair["chosen_quantile"], pair["rejected_quantile"]) == (1.0, 0.25)


@pytest.mark.parametrize(("example", "loss"), [("pairs", "dpo"), ("qrpo-pairs", "qrpo")])
def test_the_pair_goes_through_the_pass_and_trains(tmp_path, sft_run, example, loss):
    data = _file(tmp_path, example, examples()[example])
    run_cli(["logprobs", TINY_RECIPE, f"model_name_or_path={sft_run[0]}", f"input={data}",
             f"output_dir={tmp_path / 'logprobs'}"])
    extra = ["num_ref_rewards=4"] if loss == "qrpo" else ["num_ref_rewards=null"]
    run_cli(["train", TINY_RECIPE, f"model_name_or_path={sft_run[0]}", f"input={tmp_path / 'logprobs'}",
             f"output_dir={tmp_path / loss}", f"loss_type={loss}", "max_steps=1", "per_device_train_batch_size=1",
             *extra])
    assert (tmp_path / loss / "config.json").is_file()


def test_one_error_names_every_missing_and_mistyped_field():
    row = {"id": "p1", "messages": [{"role": "user", "content": "hi"}],
           "completions": [{"text": "a"}, {"text": "b", "is_reference": True, "num_tokens": "3"}, {"text": "c"},
                           {"is_reference": False}]}
    with pytest.raises(RecordError) as caught:
        validate_completions(row)
    message = str(caught.value)
    assert "record 'p1'" in message
    assert "is_reference missing in completions 0, 2" in message
    assert "text missing in completion 3" in message
    assert "completions[1].num_tokens: expected int, got '3'" in message
    assert "docs/your-data.md" in message


def test_the_pairs_stage_says_what_its_counts_mean(tmp_path):
    """Fallbacks, completions left out for their text and prompts without a pair are each
    explained where they are counted, with where to look."""
    row = examples()["scored"]
    tricky = {**row, "id": "p2", "completions": [*row["completions"][:3],
                                                 {"text": "no<|assistant_end|>", "is_reference": True}]}
    flat = {**row, "id": "p3", "rewards": [0.5] * 4}
    data = tmp_path / "scored.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (row, tricky, flat)))
    printed = run_cli(["pairs", TINY_RECIPE, f"input={data}", f"output_dir={tmp_path / 'pairs'}",
                       "num_ref_rewards=4"])
    assert "1 completions were never paired because their text holds a token the apertus format reads as " \
           "structure" in printed
    assert "1 prompts gave no pair (all rewards equal, or too few scored completions)" in printed


def _page_commands() -> list[str]:
    """The commands of the page's `bash` blocks, in order, comments after `  #` removed."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), flags=re.DOTALL | re.MULTILINE):
        for line in block.splitlines():
            command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


@pytest.mark.slow
def test_every_command_of_the_page_runs_as_written_on_the_cpu_install(tmp_path, say):
    """Each command exactly as the page prints it, in order, in a directory holding the examples under the
    file names the commands read (the QRPO pair as my_pairs.jsonl): no recipe, no key added."""
    import os
    import subprocess
    import sys

    rows = examples()
    for name, example in (("my_conversations", "sft"), ("my_prompts", "prompts"), ("my_scored", "scored"),
                          ("my_pairs", "qrpo-pairs")):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(rows[example]) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    commands = _page_commands()
    assert commands[0] == "align tiny-models" and len(commands) == 9
    printed = {}
    for command in commands:
        say(command)
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        printed[command] = done.stdout
    for out in ("my_sft", "my_samples", "my_rewards", "my_pairs", "my_logprobs", "my_qrpo", "my_own_sft", "my_own_last"):
        assert (tmp_path / "runs" / out / "_COMPLETE.json").is_file(), out
    import torch

    if torch.cuda.is_available():  # the CPU install's defaults below; a GPU machine trains in bf16
        return
    assert "[align sft] no GPU here: training on the CPU in float32" in printed[commands[1]]
    assert "[align train] no GPU here: training on the CPU in float32" in printed[commands[6]]
    for out in ("my_sft", "my_qrpo"):  # float32 weights, as the note says
        assert json.loads((tmp_path / "runs" / out / "config.json").read_text())["dtype"] == "float32", out
