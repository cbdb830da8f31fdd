"""The rules between a recipe's steps, checked on the whole graph when it is read, before anything runs.

Each step alone is checked by its own config; these rules need two steps at once:

- **what a key reads**: a key that names another step's output reads the kind of rows that
  step writes (``align.stage_table``: pairs from ``pairs``, reference log-probs from
  ``logprobs``, a model from ``sft`` or ``train``), and names the data file of an output
  that holds two kinds of row (``@pairs/pairs.jsonl``, not ``@pairs``);
- **splits by label** (``where:``): each value is one the upstream step can write in that
  field (the controversy classifier writes ``true``, ``false`` or ``null``: the text
  ``"false"`` is none of them), no row goes to two branches, and a row whose label no
  branch selects is refused unless a branch says ``where_rest: drop``;
- **the reference pass and training agree**: a train step that reads a logprobs step's
  output renders and cuts the rows as that pass did (``max_length``, ``chat_format``,
  ``chat_date``, ``enable_thinking``, ``truncated``, ``over_max_length``).

Everything here reads step keys and the stage table; no file is opened and no config is
built, so ``align status`` on a login node checks the graph in milliseconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from align.config import apply_defaults
from align.data.records import same_value
from align.errors import ConfigError
from align.recipe.graph import ConfigClass, OutputIndex, Step, path_key, string_values
from align.stage_table import STAGES, reads_as

# What the reference pass and the trainer must agree on, or the pass scores other tokens than training sees.
PASS_AND_TRAINING = ("max_length", "chat_format", "chat_date", "enable_thinking", "truncated", "over_max_length")


@dataclasses.dataclass
class Graph:
    """The steps with what the rules need: which step writes a path, each step's keys over the defaults."""

    steps: list[Step]
    defaults: Mapping[str, Any]
    config_class: ConfigClass

    def __post_init__(self) -> None:
        self.index = OutputIndex(self.steps)
        self.by_name = {step.name: step for step in self.steps if not step.phase}
        self._keys: dict[str, dict[str, Any]] = {}

    def keys(self, step: Step) -> dict[str, Any]:
        """The step's keys over the defaults its stage knows."""
        if step.name not in self._keys:
            self._keys[step.name] = apply_defaults(self.config_class(step.stage), self.defaults, step.keys)
        return self._keys[step.name]

    def setting(self, step: Step, key: str) -> Any:
        """A step's setting: given (or from defaults), else its config's declared default."""
        value = _get(self.keys(step), key)
        if value is not _MISSING:
            return value
        for f in dataclasses.fields(self.config_class(step.stage)):
            if f.name == key:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                    return f.default_factory()  # type: ignore[misc]
        return None

    def view(self, step: Step) -> dict[str, Any]:
        """The settings the stage table's conditions read (``provider``, ``reference``...)."""
        return _SettingsView(self, step)

    def producer(self, text: str) -> Step | None:
        hit = self.index.owner(text)
        return None if hit is None else self.by_name.get(hit[0])

    def kind(self, step: Step) -> str | None:
        """The kind of rows a step writes (following the steps that keep their input's kind); None: unknown."""
        entry = STAGES[step.stage]
        kind = entry.writes_for(self.view(step))
        if kind != "rows":
            return kind
        source = _get(self.keys(step), entry.keeps) if entry.keeps else _MISSING
        texts = list(string_values(source))  # [] when the key is not given
        upstream = self.producer(texts[0]) if len(texts) == 1 else None
        return None if upstream is None or upstream is step else self.kind(upstream)


class _SettingsView(dict):
    def __init__(self, graph: Graph, step: Step):
        super().__init__()
        self.graph, self.step = graph, step

    def get(self, key: str, default: Any = None) -> Any:
        return self.graph.setting(self.step, key)


_MISSING = object()


def _get(keys: Mapping[str, Any], dotted: str) -> Any:
    value: Any = keys
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def check_graph(steps: list[Step], defaults: Mapping[str, Any], config_class: ConfigClass) -> None:
    """Every rule between steps (module docstring); the first one broken is an error naming the steps."""
    graph = Graph(steps, defaults, config_class)
    for step in graph.by_name.values():
        check_reads(graph, step)
    check_splits(graph)
    check_pass_and_training(graph)


# --------------------------------------------------------------------------- what a key reads


def check_reads(graph: Graph, step: Step) -> None:
    """Each key that names another step's output reads a kind of rows that step writes, by its data file."""
    entry = STAGES[step.stage]
    for key, reads in entry.reads.items():
        value = _get(graph.keys(step), key)
        if value is _MISSING:
            continue
        for text in string_values(value):
            upstream = graph.producer(text)
            if upstream is None:
                continue
            if upstream.name == step.name:
                raise ConfigError(f"step {step.name!r}: {key}={text} is (or lies inside) the step's own output: a step "
                                  "reads what other steps or your files hold, never what it writes")
            kind = graph.kind(upstream)
            wanted = reads.kinds_for(graph.view(step))
            if kind is not None and not reads_as(kind, wanted):
                raise ConfigError(f"step {step.name!r}: {key}={text} is step {upstream.name!r}'s output "
                                  f"({upstream.stage}: {kind}), but {key} reads {' or '.join(wanted)}"
                                  + (f" ({reads.what})" if reads.what else ""))
            data_file = STAGES[upstream.stage].data_file
            if data_file and upstream.output_dir and path_key(text) == path_key(upstream.output_dir):
                raise ConfigError(f"step {step.name!r}: {key}={text} is step {upstream.name!r}'s output directory, "
                                  f"which holds more than one kind of row; name its data file: {key}=@"
                                  f"{upstream.base or upstream.name}/{data_file}")


# --------------------------------------------------------------------------- splits by label


def _has(values: Any, value: Any) -> bool:
    return any(same_value(value, v) for v in values)


def labels_of(graph: Graph, text: str, field: str) -> tuple[Step, tuple[Any, ...]] | None:
    """(the step that writes ``field`` into the rows ``text`` names, every value it can write there); None when
    the rows come from a file no step writes (its labels are not known before the run). The kinds of rows
    were checked first, so every step on the way keeps its input's fields or writes the field."""
    upstream = graph.producer(text)
    if upstream is None:
        return None
    entry = STAGES[upstream.stage]
    labels = entry.labels_for(graph.view(upstream))
    if field in labels:
        return upstream, labels[field]
    source = _get(graph.keys(upstream), entry.keeps) if entry.keeps else _MISSING
    texts = list(string_values(source))  # [] when the key is not given
    found = [labels_of(graph, t, field) for t in texts if graph.producer(t) is not upstream]
    if not found or any(f is None for f in found):
        return None
    return found[0]


def check_splits(graph: Graph) -> None:
    """``where:`` values are labels the upstream step writes; the branches of one split share no label and,
    unless one of them says ``where_rest: drop``, leave no label out."""
    branches: dict[tuple[str, str], list[tuple[Step, list[Any], Step, tuple[Any, ...]]]] = {}
    for step in graph.by_name.values():
        if step.stage != "annotate":
            continue
        where = graph.setting(step, "where") or {}
        source = graph.setting(step, "input")
        if not where or not isinstance(where, Mapping) or not isinstance(source, str):
            continue
        for field, wanted in where.items():
            allowed = list(wanted) if isinstance(wanted, list) else [wanted]
            found = labels_of(graph, source, str(field))
            if found is None:
                continue
            writer, labels = found
            bad = [v for v in allowed if not _has(labels, v)]
            if bad:
                quoted = isinstance(bad[0], str) and bad[0].lower() in ("true", "false", "null", "none")
                raise ConfigError(
                    f"step {step.name!r}: where.{field}: {bad[0]!r} is not a value step {writer.name!r} writes in "
                    f"{field!r}; it writes {_yaml_list(labels)}"
                    + (" (quoted, true/false/null are text: write them without quotes)" if quoted else ""))
            if len(where) == 1:
                branches.setdefault((path_key(source), str(field)), []).append((step, allowed, writer, labels))
    for (_, field), group in branches.items():
        _check_branches(graph, field, group)


def _check_branches(graph: Graph, field: str, group: list[tuple[Step, list[Any], Step, tuple[Any, ...]]]) -> None:
    writer, labels = group[0][2], group[0][3]
    for label in labels:
        taking = [step.name for step, allowed, _, _ in group if _has(allowed, label)]
        if len(taking) > 1:
            raise ConfigError(f"steps {taking} each select the rows with {field}: {_yaml(label)} from {writer.name!r}: "
                              "a row would be scored twice (and reach the next step twice); give each label one step")
    left = [label for label in labels if not any(_has(allowed, label) for _, allowed, _, _ in group)]
    if left and not any(graph.setting(step, "where_rest") == "drop" for step, _, _, _ in group):
        names = [step.name for step, _, _, _ in group]
        raise ConfigError(f"steps {names} split {writer.name!r}'s rows by {field!r}, but no step selects the rows with "
                          f"{field}: {_yaml_list(left)}: they would be left out silently. Add them to a step's where, "
                          "or set where_rest: drop on one of these steps to leave them out on purpose")


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _yaml_list(values: Any) -> str:
    return ", ".join(_yaml(v) for v in values)


# --------------------------------------------------------------------------- the pass and training


def check_pass_and_training(graph: Graph) -> None:
    """A train step reading a logprobs step's rows renders and cuts them as that pass did."""
    for step in graph.by_name.values():
        if step.stage != "train":
            continue
        source = graph.setting(step, "input")
        upstream = graph.producer(source) if isinstance(source, str) else None
        if upstream is None or upstream.stage != "logprobs":
            continue
        for key in PASS_AND_TRAINING:
            scored, trained = graph.setting(upstream, key), graph.setting(step, key)
            if scored != trained:
                raise ConfigError(f"steps {upstream.name!r} and {step.name!r}: {key} is {scored!r} in the reference "
                                  f"pass and {trained!r} in training; the pass must score the tokens training sees: "
                                  f"set the same {key} in both (or once, in defaults)")
