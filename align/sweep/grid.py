"""A grid of preference-training settings: every combination is one point of the sweep.

``{"beta": [1, 5, 20], "learning_rate": [3e-5, 1e-4]}`` gives six points, in the order of
``itertools.product`` (the first key varies slowest). Each point is named by its values
alone (``beta-5_learning_rate-0.0001``), never by its position, so a grid that grows keeps
the names, and the finished outputs, of the points it already had.

Values are checked against the field types of `PreferenceConfig` (``3e-5`` written in
YAML is a string there, and becomes a number here); a key that is not a setting of
preference training, one that cannot change what training writes (``NEUTRAL_KEYS``:
logging, checkpoint cadence) or one that must be the same for every point (the start
model, the output directory) is an error naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from align.config import from_dict
from align.errors import ConfigError
from align.manifests import NEUTRAL_KEYS

# Settings every point shares by construction: the start policy and where things go.
FIXED_KEYS = frozenset({"output_dir", "model_name_or_path", "ref_model_name_or_path", "resume_from_checkpoint"})


@dataclass(frozen=True)
class Point:
    """One combination of the grid: its settings and the name of its output directories."""

    settings: dict[str, Any]

    @property
    def name(self) -> str:
        """``beta-5_learning_rate-0.0001``: the values, in grid order (a directory name)."""
        return "_".join(f"{key}-{_safe(format_value(value))}" for key, value in self.settings.items())

    @property
    def label(self) -> str:
        """``beta=5, learning_rate=0.0001``: how tables and logs show the point."""
        return ", ".join(f"{key}={format_value(value)}" for key, value in self.settings.items())


def format_value(value: Any) -> str:
    """A grid value as written in names and tables: numbers in their shortest exact-enough form."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return format(value, ".6g")
    return str(value)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]", "_", text)


def coerce_value(key: str, value: Any) -> Any:
    """``value`` as the `PreferenceConfig` field ``key`` takes it (a YAML ``3e-5`` string becomes a float)."""
    from align.trainers.preference_config import PreferenceConfig

    fields = {f.name for f in dataclasses.fields(PreferenceConfig) if f.init}
    if key not in fields:
        close = difflib.get_close_matches(key, sorted(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"grid.{key}: not a setting of preference training{hint}; `align train --help` lists them")
    hint = typing.get_type_hints(PreferenceConfig)[key]
    probe = dataclasses.make_dataclass("GridValue", [(key, hint)])
    try:
        return getattr(from_dict(probe, {key: value}, where="grid."), key)
    except ValueError as error:  # the config loader's error, as the sweep's own
        raise ConfigError(str(error)) from None


def check_grid(grid: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The grid with each value coerced to its setting's type; any problem is a `ConfigError` naming the key."""
    if not isinstance(grid, Mapping) or not grid:
        raise ConfigError("grid: give at least one setting with its values, e.g. grid.beta=[1,5,20]")
    checked: dict[str, list[Any]] = {}
    for key, values in grid.items():
        if key in FIXED_KEYS:
            raise ConfigError(f"grid.{key}: every point starts from the same model and writes under the sweep's "
                              "own output_dir; this setting cannot vary across points")
        if key in NEUTRAL_KEYS:
            raise ConfigError(f"grid.{key}: this setting cannot change what training writes (logging, checkpoints), "
                              "so points differing only in it would be the same run")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            values = [values]
        if not values:
            raise ConfigError(f"grid.{key}: an empty list gives no point; give at least one value")
        coerced = [coerce_value(key, value) for value in values]
        shown = [format_value(value) for value in coerced]
        twice = sorted({s for s in shown if shown.count(s) > 1})
        if twice:
            raise ConfigError(f"grid.{key}: the value {twice[0]} is given twice")
        checked[str(key)] = coerced
    return checked


def expand_grid(grid: Mapping[str, Any]) -> list[Point]:
    """Every combination of the grid's values, the first key varying slowest."""
    checked = check_grid(grid)
    keys = list(checked)
    return [Point(dict(zip(keys, values))) for values in itertools.product(*checked.values())]


def at_edge(grid: Mapping[str, Sequence[Any]], chosen: Mapping[str, Any]) -> dict[str, bool]:
    """Per numeric grid key with 3 or more values: whether the chosen value is the smallest or largest.

    A choice at the edge of the grid says the best setting may lie outside it (widen the
    grid that way); with two values every choice is an edge, so that says nothing.
    """
    out = {}
    for key, values in grid.items():
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) == len(values) >= 3 and key in chosen:
            out[key] = chosen[key] in (min(numbers), max(numbers))
    return out


__all__ = ["FIXED_KEYS", "Point", "at_edge", "check_grid", "coerce_value", "expand_grid", "format_value"]
