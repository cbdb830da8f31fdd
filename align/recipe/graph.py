"""A recipe's steps: what each runs, what it reads from which earlier step, its config.

A ``Step`` holds its keys (defaults applied, ``@NAME`` references replaced by paths) and
the names of the steps it reads (``needs``): the steps whose output directory one of its
values names, by reference or by path. The ``Recipe`` builds each step's config once, when
it is first asked for.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.config import apply_defaults, default_keys, deferred_device_checks, from_dict, renamed_key_hint
from align.errors import ConfigError
from align.recipe.settings import PipelineSettings
from align.stage_table import STAGES, phase

# Keys that say which work a step does (its model, its data, where it writes, how much it
# holds at once): a value in ``defaults`` would reach every step and nested section with the
# key (the judge's model becoming the policy's sampler, two steps writing one directory).
IDENTITY_KEYS = frozenset({"model", "model_name_or_path", "ref_model_name_or_path", "input", "prompts",
                           "completions", "policies", "output_dir", "cache_dir", "tokenizer", "base_url",
                           "initial_policy", "kl_reference_model", "resume_from_checkpoint"})

ConfigClass = Callable[[str], type]


def is_identity_key(key: str) -> bool:
    """A key ``defaults`` may not hold (``IDENTITY_KEYS``, or any batch size)."""
    return key in IDENTITY_KEYS or key.endswith("batch_size")


@dataclass
class Step:
    """One run of a stage in a recipe: ``name`` (``sample_refs``; ``round-2.sample`` in round 2)."""

    name: str
    stage: str
    keys: dict[str, Any]
    round: int | None = None
    needs: tuple[str, ...] = ()
    what: str = ""  # what the step does in its round, for the log and ``align status``
    phase: str | None = None  # evaluate under kl_sharding=zero3: None (generate, score), kl, report
    base: str = ""  # the step's name in the recipe (``sample`` for ``round-2.sample``)

    @property
    def output_dir(self) -> str | None:
        value = self.keys.get("output_dir")
        return None if value is None else str(value)

    def job_kind(self) -> str:
        """How the step runs as a SLURM job: ``array``, ``launch`` or ``single`` (a phase has its own)."""
        if self.phase:
            return phase(self.stage, self.phase).job
        return STAGES[self.stage].job


@dataclass
class Recipe:
    """Every step of a recipe, in the order they run (up to ``stop_after``), and its settings."""

    settings: PipelineSettings
    steps: list[Step]
    config_class: ConfigClass
    source: str | None = None
    kind: str = "pipeline"  # pipeline | stage (a stage file: one step)
    devices: str = "check"  # check | defer: see align.config.deferred_device_checks
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # the recipe as read: overrides and from: merged
    _configs: dict[str, Any] = field(default_factory=dict, repr=False)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise ConfigError(f"no step {name!r} in {self.source or 'the recipe'}; steps: "
                          f"{[s.name for s in self.steps]}")

    def config(self, step: Step) -> Any:
        """The step's config, built the first time it is asked for (``config_builds`` counts builds)."""
        if step.name not in self._configs:
            self._configs[step.name] = build_config(self.config_class, step, self.settings.defaults, self.devices,
                                                    alone=self.kind == "stage")
        return self._configs[step.name]

    def build_all(self) -> None:
        """Every step's config, so a mistake in the last step stops the run before the first."""
        for step in self.steps:
            self.config(step)


BUILDS: list[str] = []  # step names, one per config built (tests count them)


def build_config(config_class: ConfigClass, step: Step, defaults: Mapping[str, Any], devices: str, *,
                 alone: bool) -> Any:
    """A step's config from its keys over the defaults its stage knows (``alone``: a stage file, whose
    errors name the keys as the file has them)."""
    cls = config_class(step.stage)
    where = f"step {step.name!r} ({step.stage})" if step.name != step.base or step.base != step.stage \
        else f"pipeline section {step.stage!r}"
    prefix = "" if alone else f"{step.base or step.name}."
    try:
        values = apply_defaults(cls, defaults, step.keys)
        if devices == "defer":
            with deferred_device_checks():
                config = from_dict(cls, values, where=prefix)
        else:
            config = from_dict(cls, values, where=prefix)
    except ConfigError as exc:
        if alone:
            raise
        raise ConfigError(f"{where}: {exc}") from exc
    BUILDS.append(step.name)
    return config


def check_defaults(defaults: Mapping[str, Any], steps: list[Step], config_class: ConfigClass) -> None:
    """Refuse a default that names a step's own work, and one no step knows."""
    reach: dict[str, list[str]] = {}
    known: set[str] = set()
    for step in steps:
        keys = default_keys(config_class(step.stage))
        known |= keys
        for key in defaults:
            if key in keys:
                reach.setdefault(key, []).append(step.base or step.name)
    for key in sorted(defaults):
        if is_identity_key(key):
            where = sorted(set(reach.get(key, [])))
            raise ConfigError(f"defaults: {key!r} names one step's own work (its model, data, output or batch "
                              f"size) and would reach {where or 'no step'}; set it in each step that needs it")
        value = defaults[key]
        if isinstance(value, Mapping):
            for inner in _leaf_keys(value):
                if is_identity_key(inner):
                    raise ConfigError(f"defaults.{key}: {inner!r} names one step's own work; set it in each "
                                      "step that needs it")
    unused = set(defaults) - known
    if unused:
        hints = [h for k in sorted(unused) if (h := renamed_key_hint(k, sorted(known)))]
        raise ConfigError(f"defaults: keys {sorted(unused)} are known to no step in this recipe"
                          + "".join(f". {h}" for h in hints))


def _leaf_keys(value: Mapping[str, Any]) -> Iterator[str]:
    for key, inner in value.items():
        yield str(key)
        if isinstance(inner, Mapping):
            yield from _leaf_keys(inner)


def path_key(value: str) -> str:
    """One spelling per path: absolute, ``..`` and ``.`` resolved and symbolic links followed (two steps that
    name one directory through a link are caught), for matching outputs to inputs."""
    found = _REAL.get(value)
    if found is None:
        found = _REAL[value] = os.path.realpath(os.path.expanduser(value))
    return found


_REAL: dict[str, str] = {}  # path as written -> its real path (a recipe names the same paths many times)


def clear_path_cache() -> None:
    """Forget the real paths seen (a link may point elsewhere by the time the next recipe is read)."""
    _REAL.clear()


def string_values(value: Any) -> Iterator[str]:
    """Every string anywhere in a step's keys."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for inner in value.values():
            yield from string_values(inner)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            yield from string_values(inner)


def _could_be_path(text: str) -> bool:
    return bool(text) and "\n" not in text and len(text) <= 4096 and not text.startswith("@")


class OutputIndex:
    """Which step writes a path: every step's output directory by its real path, so that finding the step
    behind a path costs one lookup per directory above it (reading a recipe is linear in its steps)."""

    def __init__(self, steps: list[Step]):
        self.owners: dict[str, str] = {}
        for step in steps:
            if step.output_dir is not None:
                self.owners.setdefault(path_key(step.output_dir), _owner(step))

    def owner(self, text: str) -> tuple[str, str] | None:
        """(the step whose output ``text`` is or lies in, that output's real path), or None."""
        if not _could_be_path(text):
            return None
        key = path_key(text)
        while True:
            if key in self.owners:
                return self.owners[key], key
            parent = os.path.dirname(key)
            if parent == key:
                return None
            key = parent


def _owner(step: Step) -> str:
    """The step an output belongs to: the phases of one evaluate step share its directory."""
    return step.name.removesuffix(f".{step.phase}") if step.phase else step.name


def reads_from(keys: Mapping[str, Any], index: OutputIndex, itself: str) -> list[str]:
    """The steps (other than ``itself``) whose output one of ``keys``' values names, in the order found."""
    found: dict[str, None] = {}
    for text in string_values({k: v for k, v in keys.items() if k != "output_dir"}):
        hit = index.owner(text)
        if hit is not None and hit[0] != itself:
            found[hit[0]] = None
    return list(found)


def check_outputs(steps: list[Step]) -> None:
    """No two steps write one directory (compared by real path: a symbolic link or ``..`` does not hide it; the
    phases of one evaluate step are one step), and no step writes inside another's output."""
    seen: dict[str, tuple[str, str]] = {}  # real path -> (owner, the output_dir as written)
    for step in steps:
        if step.output_dir is None:
            continue
        key, owner = path_key(step.output_dir), _owner(step)
        if key in seen and seen[key][0] != owner:
            other, written = seen[key]
            same = "" if written == step.output_dir else f" ({written} and {step.output_dir} are one directory: " \
                f"{key})"
            raise ConfigError(f"steps {other!r} and {step.name!r} both write {step.output_dir}{same}: give each "
                              "its own output_dir")
        seen.setdefault(key, (owner, step.output_dir))
    for key, (owner, written) in seen.items():
        parent = os.path.dirname(key)
        while parent != key:
            if parent in seen and seen[parent][0] != owner:
                raise ConfigError(f"step {owner!r} writes {written}, inside (or around) step {seen[parent][0]!r}'s "
                                  "output: give each a directory of its own")
            key, parent = parent, os.path.dirname(parent)


def in_order(steps: list[Step]) -> list[Step]:
    """The steps in an order where each runs after every step it reads (its ``needs``), keeping the order
    they were written in wherever the reads allow; a cycle is an error naming its steps."""
    by_name = {step.name: step for step in steps}
    position = {step.name: i for i, step in enumerate(steps)}
    waiting = {step.name: {n for n in step.needs if n in by_name and n != step.name} for step in steps}
    readers: dict[str, list[str]] = {}
    for name, needs in waiting.items():
        for need in needs:
            readers.setdefault(need, []).append(name)
    ready = [position[name] for name, needs in waiting.items() if not needs]
    heapq.heapify(ready)
    out: list[Step] = []
    while ready:
        step = steps[heapq.heappop(ready)]
        out.append(step)
        for reader in readers.get(step.name, ()):
            waiting[reader].discard(step.name)
            if not waiting[reader]:
                heapq.heappush(ready, position[reader])
    if len(out) < len(steps):
        left = [s.name for s in steps if waiting[s.name]]
        cycle = _a_cycle(left, waiting)
        raise ConfigError(f"steps read each other's outputs in a cycle ({' reads '.join(cycle)}): no order runs "
                          "each after the steps it reads; give one of them another input")
    return out


def _a_cycle(names: list[str], waiting: Mapping[str, set[str]]) -> list[str]:
    """One cycle among steps that all still wait, as a path that returns to its start."""
    path, seen = [names[0]], {names[0]: 0}
    while True:
        nxt = sorted(waiting[path[-1]])[0]
        if nxt in seen:
            return [*path[seen[nxt]:], nxt]
        seen[nxt] = len(path)
        path.append(nxt)


def expand_phases(step: Step) -> list[Step]:
    """An evaluate step whose KL models are partitioned (``kl_sharding: zero3``) is three jobs: generate
    and score (an array), the KL step (a launch, ``kl_only``), then the report (one task)."""
    if step.stage != "evaluate" or step.keys.get("kl_sharding") != "zero3" or step.keys.get("kl") is False \
            or step.keys.get("kl_only"):
        return [step]
    kl = Step(f"{step.name}.kl", step.stage, {**step.keys, "kl_only": True}, step.round, (*step.needs, step.name),
              phase(step.stage, "kl").what, "kl", step.base)
    report = Step(f"{step.name}.report", step.stage, dict(step.keys), step.round, (*step.needs, kl.name),
                  phase(step.stage, "report").what, "report", step.base)
    return [step, kl, report]


def resolve_references(value: Any, outputs: Mapping[str, str | None], where: str,
                       tokens: Mapping[str, str] | None = None) -> Any:
    """``@NAME`` (or ``@NAME/file``) replaced by step NAME's output directory (or that file); ``tokens``
    give more names (``@policy`` in a round)."""
    if isinstance(value, str) and value.startswith("@"):
        head, _, rest = value[1:].partition("/")
        if tokens and head in tokens:
            base = tokens[head]
        elif head in outputs:
            base = outputs[head]
            if base is None:
                raise ConfigError(f"{where}: {value!r} names step {head!r}, which writes no output_dir of its own "
                                  "(set one)")
        else:
            known = sorted([*outputs, *(tokens or {})])
            raise ConfigError(f"{where}: {value!r} names no earlier step (earlier steps: {known})")
        return str(Path(base) / rest) if rest else base
    if isinstance(value, Mapping):
        return {k: resolve_references(v, outputs, f"{where}.{k}", tokens) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_references(v, outputs, f"{where}[{i}]", tokens) for i, v in enumerate(value)]
    return value


def references_in(value: Any) -> set[str]:
    """The step names (and tokens) ``@...`` values name."""
    return {text[1:].partition("/")[0] for text in string_values(value) if text.startswith("@")}
