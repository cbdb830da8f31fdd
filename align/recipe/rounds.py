"""Rounds: the steps that depend on the policy, K times, each round from the policy of the one before.

Notation: π₀ is the initial policy, π_{k−1} the policy round k starts from (π₀ for k = 1),
π_ref of round k is π_{k−1} (``reference: previous``) or π₀ (``reference: initial``).
Round k's steps are named ``round-k.NAME`` and write under ``output_dir/round-k/NAME``.

**A step graph** names the policies with three references: ``@policy`` (π_{k−1}),
``@reference`` (π_ref of the round) and ``@initial`` (π₀). A step runs every round when it
reads ``@policy``, or ``@reference`` under ``reference: previous``, or the output of a step
that runs every round; the other steps run once, before the rounds. ``policy_step`` (by
default the one train step that runs every round) is the step whose output is the next
round's policy.

**A recipe of sections** keeps its fixed wiring (docs/rounds.md): round k samples π_{k−1},
annotates, pairs, runs the reference pass under π_ref and trains from π_{k−1}; with
``reference: initial`` π₀'s samples are joined in as the references; with ``round_prompts:
split`` each round samples its part of the prompts. The pipeline sets those keys, so a
recipe of sections leaves them out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.config import merge
from align.errors import ConfigError
from align.recipe.graph import ConfigClass, Step, references_in, resolve_references
from align.recipe.settings import PipelineSettings
from align.stage_table import STAGES, round_stages

INITIAL_NAME = "sft"  # π₀'s name among the policies each round evaluates (recipes of sections)
# With rounds: the sections each round runs (decontaminate and sft run once, before the rounds), and the
# keys a rounds pipeline of sections sets in every round, which the recipe leaves out (the stage table's).
ROUND_SECTIONS = round_stages()
ROUND_KEYS: dict[str, tuple[str, ...]] = {name: STAGES[name].round_keys or () for name in ROUND_SECTIONS}
POLICY_TOKENS = ("policy", "reference", "initial")


def _given(section: Mapping[str, Any], dotted: str) -> bool:
    """Whether a section sets ``a`` or ``a.b`` (``sampler.model``)."""
    head, _, leaf = dotted.partition(".")
    if not leaf:
        return head in section
    nested = section.get(head)
    return isinstance(nested, Mapping) and leaf in nested


def _default(config_class: ConfigClass, stage: str, key: str) -> Any:
    """A stage config field's declared default."""
    for f in dataclasses.fields(config_class(stage)):
        if f.name == key:
            return f.default if f.default is not dataclasses.MISSING else None
    return None


# --------------------------------------------------------------------------- recipes of sections


def section_rounds(settings: PipelineSettings, once: list[Step], config_class: ConfigClass) -> list[Step]:
    """Every round's steps of a recipe of sections, each wired to the round's prompts, policy and π_ref."""
    missing = [name for name in ROUND_SECTIONS[:-1] if getattr(settings, name) is None]
    if missing:
        raise ConfigError(f"rounds: the recipe needs the sections {missing} (each round samples, annotates, "
                          "pairs, runs the reference pass and trains)")
    if (settings.sft is None) == (settings.initial_policy is None):
        raise ConfigError("rounds: π₀ is the sft section's output; without an sft section set initial_policy "
                          "(the model round 1 starts from), and with one leave initial_policy out")
    for name, keys in ROUND_KEYS.items():
        for key in keys:
            if _given(getattr(settings, name) or {}, key):
                raise ConfigError(f"{name}.{key}: set by the pipeline in each round (docs/rounds.md); leave it "
                                  "out of a rounds recipe")
    evaluate = settings.evaluate
    baseline = (evaluate or {}).get("baseline", INITIAL_NAME)
    if baseline not in (INITIAL_NAME, "previous"):
        raise ConfigError(f"evaluate.baseline: {baseline!r}; with rounds, {INITIAL_NAME} (π₀) or previous "
                          "(the policy of the round before)")
    sample = settings.sample or {}
    mode = sample.get("mode", _default(config_class, "sample", "mode"))
    if mode != "reference":
        raise ConfigError(f"sample.mode: {mode!r}; with rounds, reference (each round draws n completions per "
                          "prompt from a policy at the section's temperature, docs/rounds.md)")
    if not sample.get("prompts"):
        raise ConfigError("sample.prompts: set the prompts the rounds sample")
    reference = (settings.train or {}).get("reference", _default(config_class, "train", "reference"))
    if reference != "precomputed":
        raise ConfigError(f"train.reference: {reference!r}; with rounds, precomputed (each round's reference "
                          "pass, align logprobs, scores the pairs under π_ref)")
    initial = next((s.output_dir for s in once if s.stage == "sft"), None) or str(settings.initial_policy)
    root = Path(settings.output_dir or "runs")
    source = str(sample["prompts"])
    models, names = {0: initial}, {0: INITIAL_NAME}
    out: list[Step] = []
    for k in range(1, int(settings.rounds or 0) + 1):
        here = root / f"round-{k}"
        policy, ref = k - 1, (k - 1 if settings.reference == "previous" else 0)

        def add(key: str, stage: str, wiring: dict[str, Any], what: str, k: int = k) -> None:
            section = dict(getattr(settings, stage, None) or {})  # split and join: no section
            out.append(Step(f"round-{k}.{key}", stage, merge(section, wiring), k, (), what, base=stage))

        prompts = source
        if settings.round_prompts == "split":
            prompts = str(here / "prompts")
            add("split", "split", {"input": source, "part": k, "parts": settings.rounds, "output_dir": prompts},
                f"part {k} of {settings.rounds} of the prompts")
        samples = str(here / "sample")
        if ref == policy:  # π_ref is the policy the round samples: its samples are the references
            references = samples
        elif settings.round_prompts == "split":  # π₀ on this round's prompts
            references = str(here / "references")
            add("references", "sample", {"prompts": prompts, "output_dir": references,
                                         "sampler": {"model": models[0]}},
                f"reference samples from {names[0]} (π_ref)")
        else:  # π₀ on every prompt: round 1 drew them
            references = str(root / "round-1" / "sample")
        add("sample", "sample", {"prompts": prompts, "output_dir": samples, "sampler": {"model": models[policy]}},
            f"samples from {names[policy]}" + (" (π_ref too)" if ref == policy else ""))
        annotated = samples
        if references != samples:
            annotated = str(here / "join")
            add("join", "join", {"input": references, "completions": samples, "output_dir": annotated},
                f"{names[policy]}'s samples beside {names[ref]}'s reference samples")
        add("annotate", "annotate", {"input": annotated, "output_dir": str(here / "annotate")}, "rewards")
        add("pairs", "pairs", {"input": str(here / "annotate"), "output_dir": str(here / "pairs")},
            f"quantile rewards against {names[ref]}'s samples, pairs")
        add("logprobs", "logprobs", {"input": str(here / "pairs" / "pairs.jsonl"), "model_name_or_path": models[ref],
                                     "output_dir": str(here / "logprobs")}, f"log-probs under {names[ref]} (π_ref)")
        add("train", "train", {"input": str(here / "logprobs"), "model_name_or_path": models[policy],
                               "ref_model_name_or_path": models[ref], "output_dir": str(here / "train")},
            f"from {names[policy]}")
        models[k], names[k] = str(here / "train"), f"round-{k}"
        if evaluate is not None:
            chosen = sorted({0, k - 1, k})
            base = policy if evaluate.get("baseline") == "previous" else 0
            add("evaluate", "evaluate", {
                "policies": [{"name": names[j], "model": models[j]} for j in chosen],
                "baseline": names[base], "kl_reference": names[ref], "output_dir": str(here / "evaluate")},
                f"{', '.join(names[j] for j in chosen)} against {names[base]}")
    return out


# --------------------------------------------------------------------------- step graphs


def per_round(steps: dict[str, dict[str, Any]], reference: str) -> set[str]:
    """The steps that run every round: they read the policy (or π_ref, when it moves), or a step that does."""
    moving = {"policy"} | ({"reference"} if reference == "previous" else set())
    readers: dict[str, list[str]] = {}  # a name (a step, or a policy token) -> the steps that read it
    for name, keys in steps.items():
        for ref in references_in(keys):
            readers.setdefault(ref, []).append(name)
    found: set[str] = set()
    todo = [reader for token in moving for reader in readers.get(token, ())]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(readers.get(name, ()))
    return found


def graph_rounds(settings: PipelineSettings, raw: dict[str, dict[str, Any]], outputs: dict[str, str | None],
                 order: list[str]) -> tuple[list[str], str, list[tuple[int, str, dict[str, Any]]]]:
    """(the steps that run once, π₀, [(round, step name, keys with every reference resolved)] for every round).

    ``outputs`` holds each once-step's output directory; ``raw`` each step's keys as written.
    """
    rounds = int(settings.rounds or 0)
    repeated = per_round(raw, str(settings.reference))
    if not repeated:
        raise ConfigError("rounds: no step reads @policy (the policy a round starts from), so nothing would run "
                          "more than once; the round's sampling and training steps name it (docs/rounds.md)")
    written = str(settings.initial_policy)
    initial_step = written[1:].partition("/")[0] if written.startswith("@") else None
    if initial_step in repeated:
        raise ConfigError(f"initial_policy: @{initial_step} would run every round (it reads "
                          f"{sorted(references_in(raw[initial_step]))}, which depend on the policy): π₀ is made once, "
                          "before the rounds; give that step inputs that do not depend on the policy")
    once = [name for name in order if name not in repeated]  # none reads a repeated step: it would be one
    trainers = [name for name in order if name in repeated and raw[name].get("stage") == "train"]
    policy_step = settings.policy_step or (trainers[0] if len(trainers) == 1 else None)
    if policy_step is None:
        raise ConfigError(f"policy_step: the rounds train {len(trainers)} steps ({trainers}); name the one whose "
                          "output is the next round's policy")
    if policy_step not in repeated:
        raise ConfigError(f"policy_step: {policy_step!r} is not a step that runs every round ({sorted(repeated)})")
    if raw[policy_step].get("stage") not in ("train", "sft"):
        raise ConfigError(f"policy_step: {policy_step!r} is a {raw[policy_step].get('stage')} step; the next round's "
                          "policy is the model a train or sft step makes")
    for name in repeated:
        if "output_dir" in raw[name]:
            raise ConfigError(f"step {name!r}: runs every round, so its output_dir is output_dir/round-k/{name}; "
                              "leave output_dir out")
    if not settings.initial_policy:
        raise ConfigError("initial_policy: set π₀, the model round 1 starts from (a path, or @STEP for that step's "
                          "output, e.g. @sft)")
    initial = resolve_references(settings.initial_policy, outputs, "initial_policy")
    if not settings.output_dir:
        raise ConfigError("output_dir: set the directory the rounds write under (round k: output_dir/round-k/)")
    root = Path(settings.output_dir)
    result: list[tuple[int, str, dict[str, Any]]] = []
    policy = initial
    for k in range(1, rounds + 1):
        here = {name: str(root / f"round-{k}" / name) for name in repeated}
        tokens = {"policy": policy, "initial": initial,
                  "reference": policy if settings.reference == "previous" else initial}
        for name in order:
            if name not in repeated:
                continue
            keys = {key: value for key, value in raw[name].items() if key != "stage"}  # from: merged in
            keys = resolve_references(keys, {**outputs, **here}, f"step {name!r} (round {k})", tokens)
            keys["output_dir"] = here[name]
            result.append((k, name, keys))
        policy = here[policy_step]
    return once, initial, result
