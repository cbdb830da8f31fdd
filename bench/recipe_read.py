"""How long a recipe takes to read as its rounds grow: the Apertus graph with ``rounds: K``.

    python bench/recipe_read.py                 # K = 25, 100, 400
    python bench/recipe_read.py --rounds 50 800

The graph is recipes/apertus-8b/pipeline.yaml's, made iterative: the SFT step and the
classifier run once; reference and offline sampling, both annotations (split by the
classifier's label), pairs, the reference pass, QRPO and the evaluation run every round,
each from the policy the round before trained. For each K it times what a login node does
before anything runs: ``read`` (the recipe into its steps, every rule between steps checked:
align.recipe), ``configs`` (every step's config built, as ``align pipeline`` and ``align
status`` do), and ``status`` (``align status``: each step's state from its output, here none
made yet). Reading is linear in the steps when the seconds per step stay flat as K grows;
the last column says by how much the time grew against the steps.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGE_FILES = {"sft": "sft", "classify": "annotate_classifier", "sample": "sample", "sample_offline": "sample_offline",
               "annotate_rm": "annotate_rm", "annotate_judge": "annotate_judge", "pairs": "pairs",
               "logprobs": "logprobs", "qrpo": "qrpo", "evaluate": "evaluate"}
STAGES = {"sft": "sft", "classify": "annotate", "sample": "sample", "sample_offline": "sample",
          "annotate_rm": "annotate", "annotate_judge": "annotate", "pairs": "pairs", "logprobs": "logprobs",
          "qrpo": "train", "evaluate": "evaluate"}
# How each step is wired in a round: @policy is the policy the round starts from, @reference its π_ref.
WIRING = {
    "sample": {"prompts": "@classify", "sampler": {"model": "@policy"}},
    "sample_offline": {"prompts": "@sample"},
    "annotate_rm": {"input": "@sample_offline"},
    "annotate_judge": {"input": "@sample_offline"},
    "pairs": {"input": ["@annotate_rm", "@annotate_judge"]},
    "logprobs": {"input": "@pairs/pairs.jsonl", "model_name_or_path": "@reference"},
    "qrpo": {"input": "@logprobs", "model_name_or_path": "@policy"},
    "evaluate": {"policies": [{"name": "sft", "model": "@initial"}, {"name": "qrpo", "model": "@qrpo"}]},
}


def apertus_rounds(rounds: int, output_dir: str) -> dict:
    """The Apertus graph as a recipe of ``rounds`` rounds (a mapping, as a YAML file would hold it)."""
    from align.config import merge, read_yaml

    steps = {}
    for name, stem in STAGE_FILES.items():
        keys = read_yaml(ROOT / "recipes" / "apertus-8b" / f"{stem}.yaml")
        if name in WIRING:
            keys = {k: v for k, v in keys.items() if k not in ("output_dir", "input", "prompts", "policies")}
        steps[name] = merge({"stage": STAGES[name], **keys}, WIRING.get(name, {}))
    steps["sft"]["output_dir"] = f"{output_dir}/sft"
    steps["classify"]["output_dir"] = f"{output_dir}/classify"
    return {"rounds": rounds, "reference": "previous", "initial_policy": "@sft", "output_dir": output_dir,
            "policy_step": "qrpo", "steps": steps, "slurm": read_yaml(ROOT / "recipes/apertus-8b/pipeline.yaml")["slurm"]}


def timed(rounds: int, workdir: Path) -> dict[str, float]:
    from align.drivers import load_recipe
    from align.drivers.status import run as status

    data = apertus_rounds(rounds, str(workdir / f"r{rounds}"))
    start = time.perf_counter()
    recipe = load_recipe(data, devices="defer")
    read = time.perf_counter() - start
    recipe.build_all()
    configs = time.perf_counter() - start - read
    with contextlib.redirect_stdout(io.StringIO()):
        status(recipe)
    total = time.perf_counter() - start
    return {"steps": len(recipe.steps), "read": read, "configs": configs, "status": total - read - configs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[25, 100, 400])
    args = parser.parse_args()
    os.chdir(ROOT)  # the recipe's scripts_dir and accelerate configs are relative to the repository
    with tempfile.TemporaryDirectory() as tmp:
        timed(1, Path(tmp))  # imports and first-use costs, not counted
        rows = [(k, timed(k, Path(tmp))) for k in args.rounds]
    print(f"{'rounds':>6} {'steps':>6} {'read s':>8} {'configs s':>10} {'status s':>9} {'ms/step':>8} "
          f"{'time growth / step growth':>26}")
    first = rows[0][1]
    for k, r in rows:
        total = r["read"] + r["configs"] + r["status"]
        growth = (total / (first["read"] + first["configs"] + first["status"])) / (r["steps"] / first["steps"])
        print(f"{k:>6} {r['steps']:>6} {r['read']:>8.2f} {r['configs']:>10.2f} {r['status']:>9.2f} "
              f"{1000 * total / r['steps']:>8.2f} {growth:>26.2f}")


if __name__ == "__main__":
    main()
