"""align.manifests.lifecycle.run_stage: the lifecycle wrapped around a stage's work, read off the stage table.

A toy stage is entered in the table for each test (``StageSpec``: what it reads and how), so
each rule of the wrapper is seen as a user of a stage sees it: a key left empty, an input
read and checked before anything is removed, a model path looked at, a job's shards
sharing the directory, a launch's process group up before rank 0 decides, an unfinished
shard left unmarked, a failed run leaving its lock free, a keyed output with no directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from align import ranks, stage_table
from align.errors import ConfigError, InputError, MissingInputError
from align.manifests import lifecycle
from align.manifests.lifecycle import Unfinished, mark_complete_unmanaged, run_stage
from align.manifests.state import WRITER_LOCK
from align.stage_table import MODEL, PROMPTS, Reads, StageSpec


@dataclass
class Toy:
    input: str = ""
    output_dir: str | None = "out"
    model: str = ""
    sampler: dict = field(default_factory=dict)
    seed: int = 0
    overwrite: bool = False


def enter(monkeypatch, job: str = "single", launches: bool = False, **reads: Reads) -> None:
    spec = StageSpec("toy", "tests.toy", "a toy stage", job,
                     reads=reads or {"input": Reads((PROMPTS,), what="prompt rows")}, launches=launches)
    monkeypatch.setitem(stage_table.STAGES, "toy", spec)


@pytest.fixture()
def rows(tmp_path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": "q"}]}) + "\n"
                            for i in range(3)))
    return path


def written(run) -> dict[str, Any]:
    Path(run.output_dir, "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.rows["input"]))
    return {"rows": len(run.rows["input"])}


def test_the_rows_of_each_input_are_read_before_the_work_and_the_output_is_marked(monkeypatch, tmp_path, rows):
    enter(monkeypatch)
    out = tmp_path / "out"
    assert run_stage("toy", Toy(str(rows), str(out)), written) == {"rows": 3}
    info = json.loads((out / "_COMPLETE.json").read_text())
    assert info["stage"] == "toy" and info["summary"] == {"rows": 3}
    assert run_stage("toy", Toy(str(rows), str(out)), written) == {}  # complete and current: skipped


def test_an_empty_input_key_is_refused_naming_what_it_takes(monkeypatch, tmp_path):
    enter(monkeypatch)
    with pytest.raises(ConfigError, match=r"^toy: set input \(prompt rows; an empty path is never read as the "
                                          r"current directory\)$"):
        run_stage("toy", Toy("", str(tmp_path / "out")), written)


def test_a_key_the_stage_reads_itself_may_be_empty(monkeypatch, tmp_path):
    enter(monkeypatch, input=Reads((PROMPTS,), "none"))
    assert run_stage("toy", Toy("", str(tmp_path / "out")), lambda run: {"read": sorted(run.rows)}) == {"read": []}


def test_a_streamed_input_is_checked_not_read(monkeypatch, tmp_path, rows):
    enter(monkeypatch, input=Reads((PROMPTS,), "stream"))
    assert run_stage("toy", Toy(str(rows), str(tmp_path / "out")), lambda run: {"read": sorted(run.rows)}) == \
        {"read": []}
    with pytest.raises(MissingInputError, match=r"^toy: input='.*missing.jsonl' does not exist$"):
        run_stage("toy", Toy(str(tmp_path / "missing.jsonl"), str(tmp_path / "out2")), written)


def test_a_model_key_is_looked_at_before_anything_is_removed(monkeypatch, tmp_path, rows):
    enter(monkeypatch, input=Reads((PROMPTS,)), model=Reads((MODEL,), "model", what="the model"))
    (tmp_path / "not_a_model").mkdir()
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^toy: model='.*not_a_model' has no config.json \(not a saved model\)$"):
        run_stage("toy", Toy(str(rows), str(out), model=str(tmp_path / "not_a_model")), written)
    assert not (out / "_manifest.json").exists()


def test_a_dotted_key_reads_a_nested_section_of_a_mapping_or_an_object(monkeypatch, tmp_path, rows):
    enter(monkeypatch, **{"sampler.model": Reads((MODEL,), what="the sampler's model")})
    with pytest.raises(ConfigError, match=r"^toy: set sampler.model \(the sampler's model"):
        run_stage("toy", Toy(str(rows), str(tmp_path / "out"), sampler={"model": ""}), written)
    assert lifecycle.setting_at({"sampler": {"model": "m"}}, "sampler.model") == "m"
    assert lifecycle.setting_at(Toy(seed=3), "seed") == 3
    assert lifecycle.setting_at(Toy(), "absent") is None


def test_a_job_shares_its_directory_and_a_single_task_holds_it(monkeypatch, tmp_path, rows):
    seen = {}

    def lock_held(run) -> dict:
        seen[run.stage] = (run.output_dir / WRITER_LOCK).exists()
        return {}

    enter(monkeypatch, job="array")
    run_stage("toy", Toy(str(rows), str(tmp_path / "a")), lock_held)
    assert seen == {"toy": False}  # shards lock themselves: a writer lock would refuse the other tasks
    enter(monkeypatch, job="single")
    run_stage("toy", Toy(str(rows), str(tmp_path / "b")), lock_held)
    assert seen == {"toy": True}


def test_a_launch_brings_its_process_group_up_with_the_stages_config_first(monkeypatch, tmp_path, rows):
    started = []
    monkeypatch.setattr(ranks, "start_process_group", lambda config=None: started.append(config))
    config = Toy(str(rows), str(tmp_path / "out"))
    enter(monkeypatch, launches=True)
    run_stage("toy", config, written)
    assert started == [config]
    enter(monkeypatch, launches=False)
    run_stage("toy", Toy(str(rows), str(tmp_path / "out2")), written)
    assert started == [config]


def test_unfinished_work_leaves_the_output_unmarked_and_reports_its_summary(monkeypatch, tmp_path, rows):
    enter(monkeypatch)
    out = tmp_path / "out"
    assert run_stage("toy", Toy(str(rows), str(out)), lambda run: Unfinished({"shard": 1})) == {"shard": 1}
    assert not (out / "_COMPLETE.json").exists() and (out / "_manifest.json").exists()


def test_work_that_fails_leaves_the_output_unmarked_and_its_lock_free(monkeypatch, tmp_path, rows):
    import fcntl
    import os

    enter(monkeypatch)
    out = tmp_path / "out"

    def fails(run):
        raise RuntimeError("the work failed")

    with pytest.raises(RuntimeError, match="the work failed"):
        run_stage("toy", Toy(str(rows), str(out)), fails)
    assert not (out / "_COMPLETE.json").exists()
    fd = os.open(out / WRITER_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the failed run still held it
    finally:
        os.close(fd)


def test_prepare_runs_after_the_reads_and_before_anything_is_written(monkeypatch, tmp_path, rows):
    enter(monkeypatch)
    out = tmp_path / "out"
    order = []

    def prepare(run):
        order.append(("prepare", len(run.rows["input"]), (out / "_manifest.json").exists()))

    def work(run):
        order.append(("work", (out / "_manifest.json").exists()))
        return {}

    run_stage("toy", Toy(str(rows), str(out)), work, prepare=prepare)
    assert order == [("prepare", 3, False), ("work", True)]


def test_a_keyed_output_has_no_directory_of_its_own(monkeypatch, tmp_path, rows):
    """output_dir None (the log-prob pass keeps its output under its cache key): the inputs are read and
    checked, nothing is recorded, and the summary comes back."""
    enter(monkeypatch)
    assert run_stage("toy", Toy(str(rows), None), lambda run: {"rows": len(run.rows["input"]),
                                                               "dir": run.output_dir}) == {"rows": 3, "dir": None}
    assert not list(tmp_path.glob("**/_manifest.json"))


def test_an_output_dir_given_wins_over_the_configs(tmp_path, rows):
    from align.manifests import StageRun

    run = StageRun("toy", Toy(str(rows), str(tmp_path / "config")), output_dir=tmp_path / "given")
    assert run.output_dir == tmp_path / "given"
    assert StageRun("toy", Toy(str(rows), str(tmp_path / "config"))).output_dir == tmp_path / "config"
    assert StageRun("toy", Toy(str(rows), None)).output_dir is None


def test_an_output_of_parts_is_marked_complete_by_the_writer_alone(monkeypatch, tmp_path, capsys):
    """A sweep's directory: no manifest of its own (each point has one); the marker keeps no secret."""
    out = tmp_path / "sweep"
    out.mkdir()
    config = {"grid": {"beta": [1, 2]}, "hub_token": "hf_secret"}
    monkeypatch.setenv("RANK", "1")
    assert mark_complete_unmanaged("sweep", config, out, {"points": 2}) == {"points": 2}
    assert not (out / "_COMPLETE.json").exists()
    monkeypatch.setenv("RANK", "0")
    assert mark_complete_unmanaged("sweep", config, out, {"points": 2, "api_key": "k"}) == {"points": 2, "api_key": "k"}
    info = json.loads((out / "_COMPLETE.json").read_text())
    assert info["stage"] == "sweep" and info["summary"]["points"] == 2 and "k" not in json.dumps(info["summary"])
    assert info["config"]["grid"] == {"beta": [1, 2]} and "hf_secret" not in json.dumps(info)
    assert f"[align sweep] wrote {out}" in capsys.readouterr().out
