"""run_job / read_output / job_is_complete / sharding: behaviour on good and bad input."""

from __future__ import annotations

import json

import pytest

from align.data.records import RecordError
from align.errors import InputError
from align.io import job_is_complete, output_files, read_output, shard_name
from align.io.shards import ShardWriter
from align.jobs import done_ids, run_job, shard_from_env, shard_of


def _records(n: int) -> list[dict]:
    return [{"id": f"r{i}", "x": i} for i in range(n)]


def _square(batch: list[dict]) -> list[dict]:
    return [{**r, "y": r["x"] ** 2} for r in batch]


def test_writes_every_record_once_and_marks_done(tmp_path):
    result = run_job(_records(10), _square, tmp_path, batch_size=3)
    assert (result.num_records, result.num_already_done, result.num_processed) == (10, 0, 10)
    assert result.complete
    rows = read_output(tmp_path, expect_ids=[f"r{i}" for i in range(10)])
    assert [r["y"] for r in rows] == [i * i for i in range(10)]
    marker = json.loads((tmp_path / "shard-00000-of-00001.done.json").read_text())
    assert marker["num_records"] == 10
    assert job_is_complete(tmp_path, _records(10), 1)


def test_resume_skips_done_ids_and_only_processes_the_rest(tmp_path):
    run_job(_records(4), _square, tmp_path)
    seen: list[str] = []

    def spy(batch):
        seen.extend(r["id"] for r in batch)
        return _square(batch)

    result = run_job(_records(7), spy, tmp_path)
    assert seen == ["r4", "r5", "r6"]
    assert (result.num_already_done, result.num_processed) == (4, 3)
    assert len(read_output(tmp_path, expect_ids=[f"r{i}" for i in range(7)])) == 7


def test_progress_bar_counts_already_done_records(tmp_path, capsys):
    run_job(_records(6), _square, tmp_path)
    capsys.readouterr()
    run_job(_records(10), _square, tmp_path, desc="annotate")
    err = capsys.readouterr().err
    assert "annotate" in err and "6/10" in err and "10/10" in err


def test_torn_trailing_line_is_ignored_by_readers_and_redone_by_the_writer(tmp_path):
    run_job(_records(3), _square, tmp_path)
    path = tmp_path / shard_name(0, 1)
    good = path.read_bytes()
    lines = good.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2]) + lines[2][:7])  # killed in the middle of r2
    assert [r["id"] for r in read_output(tmp_path)] == ["r0", "r1"]
    assert done_ids(path) == {"r0", "r1"}
    result = run_job(_records(3), _square, tmp_path)
    assert result.num_processed == 1
    assert path.read_bytes() == good


def test_corrupt_complete_line_is_an_error_naming_file_and_line(tmp_path):
    run_job(_records(2), _square, tmp_path)
    path = tmp_path / shard_name(0, 1)
    path.write_bytes(path.read_bytes() + b"{not json\n")
    with pytest.raises(ValueError, match=r"shard-00000-of-00001.jsonl:3"):
        read_output(tmp_path)


def test_sort_key_orders_pending_records_before_batching(tmp_path):
    records = [{"id": f"r{i}", "n": n} for i, n in enumerate([5, 1, 4, 2, 3])]
    batches: list[list[int]] = []

    def record_batches(batch):
        batches.append([r["n"] for r in batch])
        return batch

    run_job(records, record_batches, tmp_path, batch_size=2, sort_key=lambda r: r["n"])
    assert batches == [[1, 2], [3, 4], [5]]
    # read_output with expect_ids restores input order whatever the processing order
    assert [r["n"] for r in read_output(tmp_path, expect_ids=[r["id"] for r in records])] == [5, 1, 4, 2, 3]


def test_duplicate_input_ids_are_an_error_naming_them(tmp_path):
    records = _records(3) + [{"id": "r1", "x": 9}]
    with pytest.raises(ValueError, match=r"duplicate ids.*'r1' \(rows \[1, 3\]\)"):
        run_job(records, _square, tmp_path)


def test_missing_id_is_a_record_error_naming_row_and_field(tmp_path):
    with pytest.raises(RecordError, match=r"<row 1>.*'uid'"):
        run_job([{"uid": "a"}, {"uid": ""}], _square, tmp_path, id_field="uid")


def test_process_batch_returning_wrong_ids_or_counts_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="returned 1 outputs for a batch of 2"):
        run_job(_records(2), lambda b: b[:1], tmp_path / "a")
    with pytest.raises(ValueError, match=r"missing \['r1'\], unexpected \['zzz'\]"):
        run_job(_records(2), lambda b: [b[0], {"id": "zzz"}], tmp_path / "b")
    with pytest.raises(TypeError, match="not a dict"):
        run_job(_records(1), lambda b: ["r0"], tmp_path / "c")


def test_unserialisable_output_names_the_record_and_writes_nothing_of_the_batch(tmp_path):
    def nan_for_r1(batch):
        return [{**r, "reward": float("nan") if r["id"] == "r1" else 1.0} for r in batch]

    with pytest.raises(ValueError, match="record 'r1'"):
        run_job(_records(3), nan_for_r1, tmp_path, batch_size=3)
    assert read_output(tmp_path) == []


def test_datasets_input_and_load_dataset_over_the_output(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(_records(9))
    for shard in range(2):
        run_job(ds, _square, tmp_path, shard_index=shard, num_shards=2, batch_size=4)
    assert job_is_complete(tmp_path, ds, 2)
    loaded = datasets.load_dataset("json", data_files=output_files(tmp_path), split="train")
    assert sorted(zip(loaded["id"], loaded["y"])) == sorted((f"r{i}", i * i) for i in range(9))


def test_job_is_complete_is_false_until_every_shard_is_done(tmp_path):
    records = _records(30)
    run_job(records, _square, tmp_path, shard_index=0, num_shards=3)
    assert not job_is_complete(tmp_path, records, 3)
    run_job(records, _square, tmp_path, shard_index=1, num_shards=3)
    run_job(records, _square, tmp_path, shard_index=2, num_shards=3)
    assert job_is_complete(tmp_path, records, 3)
    assert not job_is_complete(tmp_path, _records(31), 3)


def test_resuming_with_another_shard_count_is_refused(tmp_path):
    run_job(_records(5), _square, tmp_path, shard_index=0, num_shards=2)
    with pytest.raises(ValueError, match="different shard counts"):
        run_job(_records(5), _square, tmp_path, shard_index=0, num_shards=3)


def test_resuming_with_other_settings_is_refused(tmp_path):
    run_job(_records(2), _square, tmp_path, fingerprint={"model": "a", "temperature": 1.0})
    run_job(_records(2), _square, tmp_path, fingerprint={"model": "a", "temperature": 1.0})
    with pytest.raises(ValueError, match=r"other settings \(differs in \['temperature'\]"):
        run_job(_records(2), _square, tmp_path, fingerprint={"model": "a", "temperature": 0.7})


def test_a_shard_cannot_be_written_by_two_processes_at_once(tmp_path):
    path = tmp_path / shard_name(0, 1)
    with ShardWriter(path), pytest.raises(InputError, match="another process"):
        run_job(_records(1), _square, tmp_path)


def test_read_output_reports_missing_and_unexpected_ids(tmp_path):
    run_job(_records(3), _square, tmp_path)
    with pytest.raises(ValueError, match=r"1 missing \['r9'\], 1 unexpected \['r2'\]"):
        read_output(tmp_path, expect_ids=["r0", "r1", "r9"])


def test_shard_of_is_stable_and_covers_all_shards():
    ids = [f"id-{i}" for i in range(300)]
    shards = [shard_of(i, 4) for i in ids]
    assert shards == [shard_of(i, 4) for i in ids]
    assert set(shards) == {0, 1, 2, 3}
    assert shard_of("prompt-0001", 1) == 0


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (0, 1)),
        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),
        ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, (3, 4)),
        ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),
    ],
)
def test_shard_from_env(env, expected):
    assert shard_from_env(env) == expected


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4"}, "shard_index must be in 0..3"),
        ({"SLURM_ARRAY_TASK_ID": "1"}, "SLURM_ARRAY_TASK_COUNT is not"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "0"}, "both RANK and WORLD_SIZE"),
    ],
)
def test_shard_from_env_rejects_bad_values(env, message):
    with pytest.raises(ValueError, match=message):
        shard_from_env(env)
