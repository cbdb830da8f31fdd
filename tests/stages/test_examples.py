"""examples/python_api.py runs as a script, start to end, on tiny models."""

from __future__ import annotations

import json
import subprocess
import sys

from stage_helpers import REPO, subprocess_env


def test_python_api_example_runs_every_step(tmp_path):
    out = tmp_path / "python_api"
    done = subprocess.run([sys.executable, str(REPO / "examples" / "python_api.py"), str(out)], capture_output=True,
                          text=True, env=subprocess_env(), cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.rsplit("RESULT ", 1)[1])
    assert result["sft_steps"] == 40 and result["qrpo_steps"] == 4
    assert result["prompts"] == 24 and result["completions"] == 24 * 4
    assert 0 < result["right"] < result["scored"] <= result["completions"]
    assert result["pairs"] == result["ref_rows"] > 0 and result["pairs"] + result["skipped"] == 24
    assert result["tensors_moved"] > 0
    for name in ("sft", "qrpo"):
        assert (out / name / "model.safetensors").is_file()
    assert (out / "sample" / "shard-00000-of-00001.done.json").is_file()
