"""What each stage is, in one table: adding a stage is its module and one entry here.

Every part of align that treats stages alike reads this table, never a list of its own:
the CLI (its commands and their summaries), recipes (which stages have a section, which
run every round and what the pipeline wires in each round, the phases a step becomes),
SLURM (the kind of job a step is), the manifests (the keys that change no result, the data
file of an output holding more than one kind of row), the lifecycle (what a stage reads
before it starts, whether it writes job shards, whether it starts a process group), the
memory plan (how a stage is planned) and the checks between steps (the row contract: what
kind of rows each input key takes and what kind the stage writes, skip rows included).

The module imports nothing heavy, so the CLI lists commands and a login node reads
recipes without loading torch.

Row kinds (``Kind``) name what the rows of a file mean, from a prompt to a trained model.
A kind may be read wherever one of the kinds it extends is (``EXTENDS``): a sampled row is
still a prompt row (offline sampling reads the reference samples). A **skip row** is a row
a stage could not do its work for: it keeps its ``id`` and its prompt and carries the reason
in ``skip_reason``; each stage that reads one passes it on, as a skip row or in its file of
skips, with the reason it came with, and counts it (``SKIP_FIELD``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

# --------------------------------------------------------------------------- row kinds

PROMPTS = "prompts"              # id, messages ending in a user turn (answer, tools, language... kept)
CONVERSATIONS = "conversations"  # id, a whole conversation to train on (SFT)
LABELLED = "labelled prompts"    # prompts with the controversy classifier's label
SAMPLES = "samples"              # prompts with completions (a skip row: skip_reason, no new completion)
SCORED = "scored samples"        # samples with rewards (a skip row passed on as it came)
PAIRS = "pairs"                  # one chosen and one rejected completion per row, with quantile rewards
REF_PAIRS = "pairs with reference log-probs"  # pairs with ref_*_logps (ref_skip: a row the pass did not score)
MODEL = "model"                  # a saved model directory (config.json, weights, tokenizer)
REPORT = "report"                # a report for people (evaluation, judge validation, a sweep): read by no stage
ANY_ROWS = "rows"                # whatever rows a stage keeps as they are (split, decontaminate)

# A kind is read wherever a kind it extends is: (kind -> the kinds it extends, transitively).
EXTENDS: dict[str, tuple[str, ...]] = {
    LABELLED: (PROMPTS,),
    SAMPLES: (PROMPTS,),
    SCORED: (SAMPLES, PROMPTS),
    REF_PAIRS: (PAIRS,),
}
SKIP_FIELD = "skip_reason"  # the field of a skip row: why the stage that wrote it could not do its work


def reads_as(kind: str, wanted: tuple[str, ...]) -> bool:
    """Whether rows of ``kind`` may be read where one of ``wanted`` is."""
    return ANY_ROWS in wanted or kind in wanted or any(k in wanted for k in EXTENDS.get(kind, ()))


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Reads:
    """One input key of a stage: the kinds of rows it takes (``when``: other kinds under a setting), and
    how the lifecycle reads it before the stage starts: ``rows`` (every row, checked), ``stream`` (checked,
    the stage streams it itself: too large to hold) or ``model`` (a model directory, or a hub name)."""

    kinds: tuple[str, ...]
    how: str = "rows"  # rows | stream | model | none (read by the stage itself; checked by the graph only)
    when: tuple[tuple[str, Any, tuple[str, ...]], ...] = ()  # ((setting, value, kinds instead), ...)
    what: str = ""  # what the key takes, for "set KEY" errors

    def kinds_for(self, config: Any) -> tuple[str, ...]:
        for name, value, kinds in self.when:
            if _setting(config, name) == value:
                return kinds
        return self.kinds


@dataclass(frozen=True)
class Phase:
    """A job of its own that a step becomes under a setting (``evaluate`` with ``kl_sharding: zero3``)."""

    name: str
    job: str  # array | launch | single
    what: str


@dataclass(frozen=True)
class StageSpec:
    """One stage: its module (a ``Config`` and ``run(config)``) and everything the rest of align needs to know
    about it without importing that module."""

    name: str
    module: str
    summary: str
    job: str  # how a step of it runs as a SLURM job: array (shards) | launch (accelerate, per node) | single
    reads: Mapping[str, Reads] = field(default_factory=dict)  # input key -> what it takes
    writes: str = ANY_ROWS  # the kind of its output (ANY_ROWS: the kind its main input had)
    writes_when: tuple[tuple[str, Any, str], ...] = ()  # ((setting, value, kind instead), ...)
    section: str = "main"  # in a recipe of sections: main (runs in the table's order) | extra (after them, once)
    round_keys: tuple[str, ...] | None = None  # runs every round in a recipe of sections: the keys set per round
    neutral: frozenset[str] = frozenset()  # keys that group work without changing any result
    data_file: str | None = None  # the file to read of an output that holds more than one kind of row
    skips_file: str | None = None  # where it records rows it could not use (else: skip rows in its output)
    labels: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # field -> every value it can write
    labels_when: tuple[str, Any] | None = None  # the setting under which it writes ``labels``
    keeps: str | None = None  # the input key whose rows' fields its output rows keep (a prompt's answer, a label)
    phases: tuple[Phase, ...] = ()
    plan: str | None = None  # how align plan sizes it (align.plan.recipe_plan), None: not planned
    launches: bool = False  # a distributed launch: the process group starts before the lifecycle decides

    @property
    def shards(self) -> bool:
        """Writes job shards (its tasks share the output directory, each locking its own shard)."""
        return self.job == "array" or self.name == "logprobs"

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def writes_for(self, config: Any) -> str:
        for name, value, kind in self.writes_when:
            if _setting(config, name) == value:
                return kind
        return self.writes

    def labels_for(self, config: Any) -> Mapping[str, tuple[Any, ...]]:
        if self.labels_when is None or _setting(config, self.labels_when[0]) == self.labels_when[1]:
            return self.labels
        return {}


def _setting(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


_PROMPT_ROWS = (PROMPTS,)
STAGES: dict[str, StageSpec] = {spec.name: spec for spec in (
    StageSpec("decontaminate", "align.stages.decontaminate", "remove training prompts that overlap benchmarks",
              "single", reads={"input": Reads((ANY_ROWS,), "none", what="the training rows to check")},
              data_file="kept.jsonl", skips_file="removed.jsonl", keeps="input", plan="rows"),
    StageSpec("sft", "align.stages.sft", "supervised fine-tuning on chat data with assistant-only masks", "launch",
              reads={"input": Reads((CONVERSATIONS, ANY_ROWS), "stream", what="the conversation rows to train on"),
                     "model_name_or_path": Reads((MODEL,), "model", what="the base model")},
              writes=MODEL, skips_file="skipped_rows.jsonl", plan="training", launches=True),
    StageSpec("sample", "align.stages.sample", "sample n reference completions per prompt from the policy", "array",
              reads={"prompts": Reads(_PROMPT_ROWS, what="prompt records (id, messages)"),
                     "sampler.model": Reads((MODEL,), "none")},
              writes=SAMPLES, round_keys=("output_dir", "sampler.model"), neutral=frozenset({"batch_size"}),
              keeps="prompts", plan="sampler"),
    StageSpec("annotate", "align.stages.annotate",
              "score completions: reward model, judge, verifiable, classifier", "array",
              reads={"input": Reads((SAMPLES,), when=(("provider", "classifier", _PROMPT_ROWS),),
                                    what="records with completions (an `align sample` output)")},
              writes=SCORED, writes_when=(("provider", "classifier", LABELLED),), round_keys=("input", "output_dir"),
              neutral=frozenset({"batch_size", "where_rest"}),
              labels={"controversial": (True, False, None)}, labels_when=("provider", "classifier"), keeps="input",
              plan="provider"),
    StageSpec("pairs", "align.stages.pairs",
              "quantile rewards against the references, then chosen/rejected pairs", "single",
              reads={"input": Reads((SCORED,), what="annotated records (an `align annotate` output)")},
              writes=PAIRS, round_keys=("input", "output_dir"), data_file="pairs.jsonl", skips_file="skipped.jsonl",
              plan="rows"),
    StageSpec("logprobs", "align.stages.logprobs", "one offline pass of reference log-probs for the pairs", "launch",
              reads={"input": Reads((PAIRS,), what="pair rows (an `align pairs` output: .../pairs.jsonl)"),
                     "model_name_or_path": Reads((MODEL,), "model", what="the reference policy (π_ref)")},
              writes=REF_PAIRS, round_keys=("input", "model_name_or_path", "output_dir", "cache_dir"),
              neutral=frozenset({"batch_size", "padding_free", "max_row_tokens", "sharding"}), plan="pass",
              launches=True),
    StageSpec("train", "align.stages.train", "QRPO or DPO preference training", "launch",
              reads={"input": Reads((REF_PAIRS,), when=(("reference", "model", (PAIRS,)),),
                                    what="pair rows with reference log-probs (an `align logprobs` output)"),
                     "model_name_or_path": Reads((MODEL,), "model", what="the policy to train from"),
                     "ref_model_name_or_path": Reads((MODEL,), "none")},
              writes=MODEL, round_keys=("input", "model_name_or_path", "ref_model_name_or_path", "output_dir"),
              neutral=frozenset({"target_margin"}), plan="training", launches=True),
    StageSpec("evaluate", "align.stages.evaluate",
              "rewards, win rates against a baseline and KL, with confidence intervals", "array",
              reads={"prompts": Reads(_PROMPT_ROWS, what="held-out prompt records (id, messages)"),
                     "policies": Reads((MODEL, SAMPLES), "none")},
              writes=REPORT, round_keys=("policies", "kl_reference", "output_dir"),
              neutral=frozenset({"batch_size", "kl_sharding", "kl_only"}),
              phases=(Phase("kl", "launch", "KL of every policy, the models partitioned over the launch's ranks"),
                      Phase("report", "single", "the report, once the KL step is done")),
              plan="evaluate"),
    StageSpec("judge-validate", "align.stages.judge_validate",
              "qualify a judge on degradation ladders (rank correlation, bias)", "single",
              reads={"input": Reads(_PROMPT_ROWS, what="prompts with good answers")}, writes=REPORT,
              section="extra", neutral=frozenset({"batch_size"}), plan="judge"),
    StageSpec("sweep", "align.stages.sweep",
              "tune training settings on a grid: every point from the same start, chosen on validation prompts",
              "single", reads={"input": Reads((REF_PAIRS, PAIRS), "none")}, writes=REPORT, section="extra"),
    StageSpec("split", "align.stages.split",
              "one part of a prompt file (the prompts of one round: round_prompts=split)", "single",
              reads={"input": Reads((ANY_ROWS,), what="the rows to split")}, section="extra", keeps="input"),
    StageSpec("join", "align.stages.join",
              "a policy's samples beside π_ref's reference samples (rounds, reference=initial)", "single",
              reads={"input": Reads((SAMPLES,), what="π_ref's reference samples (an `align sample` output)"),
                     "completions": Reads((SAMPLES,), what="the policy's samples (an `align sample` output)")},
              writes=SAMPLES, section="extra", keeps="input"),
)}

@dataclass(frozen=True)
class Command:
    """A command that is not a stage of a recipe: a driver (its input is a whole recipe) or a tool."""

    module: str
    summary: str
    driver: bool = False  # reads a whole recipe: parses its own arguments (config_from_args)
    own_args: bool = False  # a tool that parses its own arguments (else key=value into its Config)


COMMANDS: dict[str, Command] = {
    "plan": Command("align.drivers.plan", "memory per GPU of each stage of a recipe, whether it fits, the smallest "
                    "change that does", driver=True),
    "pipeline": Command("align.drivers.pipeline", "every step of a recipe, skipping those whose output is current",
                        driver=True),
    "step": Command("align.drivers.step", "one named step of a pipeline recipe (what a submitted job runs)",
                    driver=True),
    "status": Command("align.drivers.status", "each step of a recipe: done, stale (why), partial or not started",
                      driver=True),
    "submit": Command("align.drivers.submit", "a recipe's steps as SLURM jobs, each after the steps it reads",
                      driver=True),
    "demo": Command("align.stages.demo", "the whole method on a tiny model on CPU, in minutes"),
    "card": Command("align.card", "a Hugging Face model card for a trained policy, from its manifests and evaluation",
                    own_args=True),
    "tiny-models": Command("align.stages.tiny_models", "random-weight tiny models for the recipes in recipes/tiny/ "
                           "(CPU)", own_args=True),
}


def spec(name: str) -> StageSpec:
    """A stage's entry; an unknown name lists the stages."""
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return STAGES[name]


def command_module(name: str) -> ModuleType:
    """The module of a stage or a command, by its CLI name."""
    if name in STAGES:
        return STAGES[name].load()
    if name not in COMMANDS:
        raise KeyError(f"unknown command {name!r}; commands: {', '.join([*STAGES, *COMMANDS])}")
    return importlib.import_module(COMMANDS[name].module)


def parses_own_args(name: str) -> bool:
    """A driver or a tool that reads its own arguments; a stage (or the demo) takes a recipe and key=value."""
    return name in COMMANDS and (COMMANDS[name].driver or COMMANDS[name].own_args)


def summaries() -> dict[str, str]:
    """Every command's one-line summary, stages first, in the table's order."""
    return {**{name: s.summary for name, s in STAGES.items()}, **{name: c.summary for name, c in COMMANDS.items()}}


def sections(kind: str = "main") -> tuple[str, ...]:
    """The stages a recipe of sections runs in the table's order (``main``), or once after them (``extra``)."""
    return tuple(name for name, s in STAGES.items() if s.section == kind)


def round_stages() -> tuple[str, ...]:
    """The stages that run every round in a recipe of sections, in the order they run."""
    return tuple(name for name, s in STAGES.items() if s.round_keys is not None)


def stages_of_job(kind: str) -> tuple[str, ...]:
    return tuple(name for name, s in STAGES.items() if s.job == kind)


def data_file_of(stage: str | None) -> str | None:
    """The file to read of a stage's output that holds more than one kind of row (None: read the directory)."""
    found = STAGES.get(stage or "")
    return found.data_file if found else None


def neutral_keys() -> dict[str, frozenset[str]]:
    """Per stage, the keys that group its work without changing any result (a manifest leaves them out)."""
    return {name: s.neutral for name, s in STAGES.items() if s.neutral}


def phase(stage: str, name: str) -> Phase:
    for found in STAGES[stage].phases:
        if found.name == name:
            return found
    raise KeyError(f"stage {stage!r} has no phase {name!r}")
