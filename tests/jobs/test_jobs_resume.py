"""Acceptance: a job killed with SIGKILL at random points and restarted ends up exactly as
an uninterrupted run — same ids, no duplicates, no gaps, identical values."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from kill_points import KILL_SEED_ENV, kill_rng

from align.io import job_is_complete, read_output, shard_name

SCRIPT = Path(__file__).with_name("slow_job.py")
N = 120
IDS = [f"prompt-{i:04d}" for i in range(N)]


def _run(output_dir: Path, *shard: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), str(output_dir), str(N), *map(str, shard)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)


def _count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _run_with_kills(output_dir: Path, rng: random.Random, *shard: int, kills: int = 4) -> int:
    """SIGKILL the job at `kills` seeded random points of its progress, then let it finish.

    Each kill waits until the shard file has grown to a drawn line count, plus a drawn
    few milliseconds (so kills land inside batches too), whatever the machine's speed.
    Every kill point is printed (with the seed printed by ``kill_rng``, a failure replays).
    Returns how many kills hit a running process.
    """
    cmd = [sys.executable, str(SCRIPT), str(output_dir), str(N), *map(str, shard)]
    path = output_dir / shard_name(*(shard or (0, 1)))
    hits = 0
    for k in range(kills):
        target = _count_lines(path) + rng.randint(1, 12)
        delay = rng.uniform(0.0, 0.04)
        print(f"[kill points] shard {shard or (0, 1)} kill {k}: at {target} lines + {delay * 1000:.1f} ms", flush=True)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and _count_lines(path) < target:
            time.sleep(0.005)
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            hits += 1
        proc.wait()
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return hits


def _lines(output_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(output_dir.glob("shard-*.jsonl")) for line in p.read_text().splitlines()]


def test_sigkilled_job_resumes_to_the_uninterrupted_output(tmp_path):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    _run(clean)
    rng, seed = kill_rng(1234, "slow job")
    hits = _run_with_kills(killed, rng)
    assert hits >= 2, f"the job was hardly interrupted; the test proved little (replay: {KILL_SEED_ENV}={seed})"

    expected = read_output(clean, expect_ids=IDS)
    got = read_output(killed, expect_ids=IDS)  # raises on gaps and duplicates
    assert got == expected
    raw = _lines(killed)
    assert len(raw) == N and len({r["id"] for r in raw}) == N
    assert job_is_complete(killed, IDS, 1)


def test_three_killed_shards_union_is_the_whole_set(tmp_path):
    clean, sharded = tmp_path / "clean", tmp_path / "sharded"
    _run(clean)
    rng, seed = kill_rng(99, "slow job, 3 shards")
    for shard in range(3):
        assert _run_with_kills(sharded, rng, shard, 3, kills=2) >= 1, f"shard {shard} never killed ({KILL_SEED_ENV}={seed})"
        assert (sharded / shard_name(shard, 3)).exists()

    per_shard = [{r["id"] for r in _lines_of(sharded / shard_name(s, 3))} for s in range(3)]
    assert sum(map(len, per_shard)) == N
    assert set().union(*per_shard) == set(IDS)
    assert all(per_shard), "hash sharding left a shard empty for 120 ids"
    assert read_output(sharded, expect_ids=IDS) == read_output(clean, expect_ids=IDS)
    assert job_is_complete(sharded, IDS, 3)


def _lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_restart_after_completion_does_no_work(tmp_path):
    _run(tmp_path)
    before = (tmp_path / shard_name(0, 1)).read_bytes()
    _run(tmp_path)
    assert (tmp_path / shard_name(0, 1)).read_bytes() == before
