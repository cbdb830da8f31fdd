"""`align pipeline recipes/tiny/rounds.yaml`: two rounds end to end, the reference switched, a kill in round 2.

The recipe runs once per module, in a workspace laid out as its header says (`recipes/` and
`runs/tiny_models/` under the working directory), with the documented command. The other
tests work on copies of that workspace: a copy keeps every output current (manifests bind
inputs by content and by the id of the output that made them, not by where they sit), so each
test starts from two finished rounds (or from round 1, with round 2 removed) and redoes only
what it changes. The plan tests read the recipe alone: which model each step of each round
uses, written out by hand from docs/rounds.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import signal
import sys
from pathlib import Path

import pytest
from kill_points import KILL_SEED_ENV, complete_lines, kill_once_written, kill_rng
from stage_helpers import RECIPES, TINY_DATA, make_workspace, run_cli, subprocess_env

import align
from align.errors import ConfigError, InputError, RecordError
from align.io import STAGE_COMPLETE_MARKER, read_records, stage_completion_info
from align.io.fingerprint import weights_fingerprint
from align.stages.join import join_records
from align.drivers import load_recipe
from align.stages.split import part_of

RECIPE = "recipes/tiny/rounds.yaml"
ROOT = Path("runs/tiny-rounds")
ROUND_STAGES = ("sample", "annotate", "pairs", "logprobs", "train", "evaluate")
PROMPT_IDS = {r["id"] for r in read_records(TINY_DATA / "prompts.jsonl")}


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative path -> digest)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def by_id(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["id"])


def plan(*overrides: str) -> dict[str, object]:
    """The recipe's steps (with the overrides), by key: each one's validated stage config."""
    recipe = load_recipe(RECIPES / "tiny" / "rounds.yaml", overrides)
    return {step.name: recipe.config(step) for step in recipe}


# ---------------------------------------------------------------------------------------------- the plan


def test_previous_reference_each_round_samples_scores_and_trains_from_the_policy_before():
    steps = plan()
    assert list(steps) == ["sft", *(f"round-{k}.{s}" for k in (1, 2) for s in ROUND_STAGES)]
    sft, one, two = "runs/tiny-rounds/sft", "runs/tiny-rounds/round-1/train", "runs/tiny-rounds/round-2/train"
    assert steps["sft"].output_dir == sft
    for k, policy in ((1, sft), (2, one)):
        here = f"runs/tiny-rounds/round-{k}"
        assert steps[f"round-{k}.sample"].sampler.model == policy
        assert steps[f"round-{k}.sample"].prompts == "recipes/tiny/data/prompts.jsonl"
        assert steps[f"round-{k}.annotate"].input == f"{here}/sample"
        assert steps[f"round-{k}.pairs"].input == f"{here}/annotate"
        assert steps[f"round-{k}.logprobs"].input == f"{here}/pairs/pairs.jsonl"
        assert steps[f"round-{k}.logprobs"].model_name_or_path == policy  # π_ref = π_{k-1}
        assert steps[f"round-{k}.train"].model_name_or_path == policy
        assert steps[f"round-{k}.train"].ref_model_name_or_path == policy
        assert steps[f"round-{k}.train"].output_dir == f"{here}/train"
    assert [(p.name, p.model) for p in steps["round-2.evaluate"].policies] == \
        [("sft", sft), ("round-1", one), ("round-2", two)]
    assert steps["round-2.evaluate"].baseline == "sft" and steps["round-2.evaluate"].kl_reference == "round-1"
    assert [p.name for p in steps["round-1.evaluate"].policies] == ["sft", "round-1"]


def test_initial_reference_keeps_the_sft_samples_as_references_and_scores_under_sft():
    steps = plan("reference=initial", "evaluate.baseline=previous")
    sft, one = "runs/tiny-rounds/sft", "runs/tiny-rounds/round-1/train"
    assert "round-1.join" not in steps  # round 1: π_ref = π₀ = the policy it samples
    assert steps["round-2.sample"].sampler.model == one
    assert steps["round-2.join"].input == "runs/tiny-rounds/round-1/sample"  # π₀ on every prompt: round 1's
    assert steps["round-2.join"].completions == "runs/tiny-rounds/round-2/sample"
    assert steps["round-2.annotate"].input == "runs/tiny-rounds/round-2/join"
    assert steps["round-2.logprobs"].model_name_or_path == sft
    assert (steps["round-2.train"].model_name_or_path, steps["round-2.train"].ref_model_name_or_path) == (one, sft)
    assert steps["round-2.evaluate"].baseline == "round-1" and steps["round-2.evaluate"].kl_reference == "sft"


def test_split_prompts_give_each_round_its_part_and_initial_samples_sft_on_it():
    steps = plan("rounds=3", "reference=initial", "round_prompts=split")
    for k in (1, 2, 3):
        split = steps[f"round-{k}.split"]
        assert (split.input, split.part, split.parts) == ("recipes/tiny/data/prompts.jsonl", k, 3)
        assert steps[f"round-{k}.sample"].prompts == split.output_dir == f"runs/tiny-rounds/round-{k}/prompts"
    assert "round-1.references" not in steps
    references = steps["round-3.references"]
    assert references.sampler.model == "runs/tiny-rounds/sft" and references.prompts.endswith("round-3/prompts")
    assert steps["round-3.join"].input == references.output_dir
    assert steps["round-3.sample"].sampler.model == "runs/tiny-rounds/round-2/train"


def test_previous_reference_with_split_prompts_needs_no_reference_samples():
    steps = plan("round_prompts=split")
    assert not [key for key in steps if key.endswith((".references", ".join"))]
    assert steps["round-2.logprobs"].model_name_or_path == "runs/tiny-rounds/round-1/train"


def test_more_rounds_keep_the_earlier_rounds_unless_the_prompts_are_split():
    from align.config import to_dict

    def settings(steps: dict, rounds: tuple[int, ...]) -> dict:
        return {key: to_dict(config) for key, config in steps.items() if key.split(".")[0] in
                ("sft", *(f"round-{k}" for k in rounds))}

    assert settings(plan("rounds=3"), (1, 2)) == settings(plan(), (1, 2))
    two, three = plan("round_prompts=split"), plan("round_prompts=split", "rounds=3")
    assert (two["round-1.split"].parts, three["round-1.split"].parts) == (2, 3)


@pytest.mark.parametrize(("overrides", "names"), [
    (["train.input=x"], ("train.input", "set by the pipeline")),
    (["sample.sampler.model=x"], ("sample.sampler.model", "set by the pipeline")),
    (["evaluate.policies=[{name: a, model: b}]"], ("evaluate.policies",)),
    (["reference=null"], ("reference", "previous", "initial")),
    (["round_prompts=null"], ("round_prompts", "all", "split")),
    (["reference=sft"], ("reference",)),
    (["rounds=0"], ("rounds=0",)),
    (["rounds=null"], ("reference", "set rounds")),
    (["sample.mode=offline"], ("sample.mode", "reference")),
    (["train.reference=model"], ("train.reference", "precomputed")),
    (["initial_policy=runs/x"], ("initial_policy", "sft")),
    (["evaluate.baseline=qrpo"], ("evaluate.baseline", "previous")),
    (["stop_after=round-3"], ("stop_after", "round-2.train")),
])
def test_a_rounds_recipe_that_cannot_run_is_refused_naming_the_key(overrides, names):
    with pytest.raises(ConfigError) as raised:
        plan(*overrides)
    for name in names:
        assert name in str(raised.value)


@pytest.mark.parametrize(("stop", "last"), [("round-1", "round-1.evaluate"), ("pairs", "round-1.pairs"),
                                            ("round-2.logprobs", "round-2.logprobs"), ("sft", "sft")])
def test_stop_after_a_round_a_stage_or_a_step(stop, last):
    assert list(plan(f"stop_after={stop}"))[-1] == last


def test_a_one_round_recipe_is_unchanged():
    recipe = load_recipe(RECIPES / "tiny" / "pipeline.yaml")
    assert [(s.name, s.stage, s.round) for s in recipe] == \
        [(name, name, None) for name in ("sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")]
    assert recipe.config(recipe.steps[-2]).output_dir == "runs/tiny/qrpo"


# ------------------------------------------------------------------------------ split and join, alone


def test_split_parts_are_disjoint_even_and_cover_every_row():
    assert [part_of(list(range(7)), k, 3) for k in (1, 2, 3)] == [[0, 3, 6], [1, 4], [2, 5]]
    for n in range(12):
        for parts in range(1, 5):
            chunks = [part_of(list(range(n)), k, parts) for k in range(1, parts + 1)]
            assert sorted(row for chunk in chunks for row in chunk) == list(range(n))
            assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_split_stage_writes_its_part(tmp_path):
    rows = read_records(TINY_DATA / "prompts.jsonl")
    run_cli(["split", f"input={TINY_DATA / 'prompts.jsonl'}", "part=2", "parts=5", f"output_dir={tmp_path / 'p'}"])
    assert read_records(tmp_path / "p") == rows[1::5]
    with pytest.raises(InputError, match="part 30 of 30 is empty"):
        run_cli(["split", f"input={TINY_DATA / 'prompts.jsonl'}", "part=30", "parts=30",
                 f"output_dir={tmp_path / 'q'}"])
    with pytest.raises(ConfigError, match="part=3"):
        run_cli(["split", "input=x.jsonl", "part=3", "parts=2"])


def _prompt(pid: str, texts: list[str], is_reference: bool) -> dict:
    return {"id": pid, "messages": [{"role": "user", "content": pid}],
            "completions": [{"text": t, "is_reference": is_reference} for t in texts], "num_overlong": 0}


def test_join_appends_the_policy_completions_as_candidates():
    refs = [_prompt("a", ["r1", "r2"], True), _prompt("b", ["r3", "r4"], True)]
    policy = [_prompt("b", ["p3"], True), _prompt("a", ["p1", "p2"], True)]
    joined = join_records(refs, policy)
    assert [r["id"] for r in joined] == ["a", "b"]
    assert [(c["text"], c["is_reference"]) for c in joined[0]["completions"]] == \
        [("r1", True), ("r2", True), ("p1", False), ("p2", False)]
    with pytest.raises(InputError, match=r"1 ids only in input \['b'\]"):
        join_records(refs, policy[1:])
    with pytest.raises(RecordError, match="'a'.*messages"):
        join_records(refs, [{**policy[1], "messages": [{"role": "user", "content": "other"}]}, policy[0]])


# --------------------------------------------------------------------------------- the recipe, run


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory) -> tuple[Path, str]:
    """`align pipeline recipes/tiny/rounds.yaml`, in-process, in a fresh workspace."""
    workspace = make_workspace(tmp_path_factory.mktemp("rounds"))
    with contextlib.chdir(workspace):
        printed = run_cli(["pipeline", RECIPE])
    return workspace, printed


def copy_of(workspace: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ws"
    shutil.copytree(workspace, target, symlinks=True)
    return target


def test_two_rounds_run_every_stage_of_every_round_from_the_policy_before(two_rounds):
    workspace, printed = two_rounds
    starts = [printed.index(f"[align pipeline] round {k} step round-{k}.{s}:") for k in (1, 2) for s in ROUND_STAGES]
    assert starts == sorted(starts) and printed.index("[align pipeline] step sft (sft)") < starts[0]
    for k in (1, 2):
        for stage in ROUND_STAGES:
            assert f"[align {stage}] wrote {ROOT}/round-{k}/{stage}\n" in printed
    out = workspace / ROOT
    # round 2 sampled from round 1's policy, and scored its pairs under it (π_ref = previous)
    sources = {c["source"].split()[0] for r in read_records(out / "round-2" / "sample") for c in r["completions"]}
    assert sources == {"model=runs/tiny-rounds/round-1/train"}
    assert {r["id"] for r in read_records(out / "round-2" / "sample")} == PROMPT_IDS
    for k, reference in ((1, out / "sft"), (2, out / "round-1" / "train")):
        rows = read_records(out / f"round-{k}" / "logprobs")
        assert {r["ref_model_fingerprint"] for r in rows} == {weights_fingerprint(reference)}
        config = stage_completion_info(out / f"round-{k}" / "train")["config"]
        assert config["model_name_or_path"] == str(ROOT / ("sft" if k == 1 else "round-1/train"))
        assert stage_completion_info(out / f"round-{k}" / "train")["summary"]["steps"] == 4
    assert weights_fingerprint(out / "round-2" / "train") != weights_fingerprint(out / "round-1" / "train")
    report = stage_completion_info(out / "round-2" / "evaluate")["summary"]
    assert report["prompts"] == 16
    assert {v.split(" − ")[0].split(" vs ")[0] for v in report["verdicts"]} == {"round-1", "round-2"}
    with contextlib.chdir(workspace):
        status = align_status()
    assert {key: v["state"] for key, v in status.items()} == {key: "done" for key in status}
    assert {"round-1", "round-2", "sft", "round-2.evaluate"} <= set(status)


def align_status(*overrides: str) -> dict:
    from align.drivers import status

    recipe = status.config_from_args([RECIPE, *overrides])
    with contextlib.redirect_stdout(None):
        return status.run(recipe)


def test_changing_the_reference_redoes_exactly_what_depends_on_it(two_rounds, tmp_path):
    workspace, _ = two_rounds
    ws = copy_of(workspace, tmp_path)
    kept = {d: tree_digest(ws / ROOT / d) for d in ("sft", "round-1", "round-2/sample")}
    depends = {f"round-2.{s}" for s in ("join", "annotate", "pairs", "logprobs", "train", "evaluate")}
    with contextlib.chdir(ws), contextlib.redirect_stdout(None):
        report = align.pipeline(RECIPE, "overwrite=true", reference="initial")
    assert {key for key, step in report.items() if step["outcome"] == "made"} == depends
    assert {key for key, step in report.items() if step["outcome"] == "skipped"} == set(report) - depends
    assert {d: tree_digest(ws / ROOT / d) for d in kept} == kept
    out = ws / ROOT / "round-2"
    # the quantiles are against π₀'s samples (round 1's, with round 1's rewards), the log-probs under π₀
    ref_rewards = {r["id"]: r["rewards"] for r in read_records(workspace / ROOT / "round-1" / "annotate")}
    sampled = {r["id"]: r["completions"] for r in read_records(workspace / ROOT / "round-2" / "sample")}
    for row in read_records(out / "annotate"):
        refs = [c for c in row["completions"] if c["is_reference"]]
        assert [c["text"] for c in refs] == [c["text"] for c in read_records_by_id(workspace, "round-1/sample")[row["id"]]]
        assert [c["text"] for c in row["completions"] if not c["is_reference"]] == [c["text"] for c in sampled[row["id"]]]
    for pair in read_records(out / "pairs" / "pairs.jsonl"):
        refs = ref_rewards[pair["id"]]
        assert pair["chosen_quantile"] == sum(r <= pair["chosen_reward"] for r in refs) / len(refs)
        assert pair["rejected_quantile"] == sum(r <= pair["rejected_reward"] for r in refs) / len(refs)
    assert {r["ref_model_fingerprint"] for r in read_records(out / "logprobs")} == {weights_fingerprint(ws / ROOT / "sft")}

    # and back: the same steps again, and the same round 2 as the first run's
    with contextlib.chdir(ws), contextlib.redirect_stdout(None):
        back = align.pipeline(RECIPE, "overwrite=true", reference="previous")
    assert {key for key, step in back.items() if step["outcome"] == "made"} == depends - {"round-2.join"}
    for stage in ("annotate", "logprobs"):
        assert by_id(read_records(out / stage)) == by_id(read_records(workspace / ROOT / "round-2" / stage))
    assert read_records(out / "pairs" / "pairs.jsonl") == read_records(workspace / ROOT / "round-2/pairs/pairs.jsonl")


def read_records_by_id(workspace: Path, where: str) -> dict[str, list]:
    return {r["id"]: r["completions"] for r in read_records(workspace / ROOT / where)}


@pytest.mark.slow
def test_a_kill_in_round_two_resumes_in_round_two(two_rounds, tmp_path):
    """SIGKILL while round 2 samples (after a seeded number of prompts), then the same command again."""
    workspace, _ = two_rounds
    ws = copy_of(workspace, tmp_path)
    shutil.rmtree(ws / ROOT / "round-2")
    round_one = tree_digest(ws / ROOT / "round-1") | {f"sft/{k}": v for k, v in tree_digest(ws / ROOT / "sft").items()}
    command = [sys.executable, "-m", "align", "pipeline", RECIPE, "sample.batch_size=1"]  # one prompt per append
    shard = ws / ROOT / "round-2" / "sample" / "shard-00000-of-00001.jsonl"
    rng, seed = kill_rng(21, "align pipeline, round 2")
    after = rng.randint(1, len(PROMPT_IDS) // 2)
    replay = f"(kill seed {seed}, aimed after {after} prompts; replay: {KILL_SEED_ENV}={seed})"
    log = tmp_path / "first.log"
    returncode = kill_once_written(command, shard, after, log, env=subprocess_env(), deadline_s=240, cwd=ws)
    assert returncode == -signal.SIGKILL, f"{replay}\n{log.read_text()[-3000:]}"
    written = complete_lines(shard)
    assert after <= written.count(b"\n") < len(PROMPT_IDS), f"the kill should land inside round 2's sampling {replay}"
    assert not (shard.parent / STAGE_COMPLETE_MARKER).exists()

    with contextlib.chdir(ws):
        status = align_status()
    assert status["round-1"]["state"] == "done" and status["round-2.sample"]["state"] == "partial"
    assert status["round-2"] == {"state": "in progress", "reasons": ["resumes at round-2.sample"]}

    with contextlib.chdir(ws):  # the same command again (in this process: it is the same code)
        again = run_cli(command[3:])
    for stage in ROUND_STAGES:
        assert f"[align {stage}] {ROOT}/round-1/{stage} is already complete; skipping" in again, replay
        assert f"[align {stage}] wrote {ROOT}/round-2/{stage}" in again, replay
    after_rerun = tree_digest(ws / ROOT / "round-1") | {f"sft/{k}": v for k, v in tree_digest(ws / ROOT / "sft").items()}
    assert after_rerun == round_one, "round 1 (or the SFT model) changed"
    assert shard.read_bytes().startswith(written), f"prompts sampled before the kill changed {replay}"
    for stage in ("sample", "annotate", "logprobs"):  # the same round 2 as the uninterrupted run
        assert by_id(read_records(ws / ROOT / "round-2" / stage)) == \
            by_id(read_records(workspace / ROOT / "round-2" / stage)), stage
    assert read_records(ws / ROOT / "round-2/pairs/pairs.jsonl") == \
        read_records(workspace / ROOT / "round-2/pairs/pairs.jsonl")
