"""Dataclass configs loaded from YAML, with ``key=value`` overrides from the command line.

A recipe key that no field knows is an error naming the key and the allowed keys (with a
close match when there is one): a typo never silently turns into a default. Values are
checked against the field's type annotation, so ``beta=five`` fails at load time, not an
hour into a run.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import difflib
import enum
import inspect
import math
import numbers
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from align.errors import ConfigError

T = TypeVar("T")

# The most values a recipe may hold once its YAML aliases are expanded: a ~1 KB file of nested
# aliases ("billion laughs") expands to billions, which every later walk over the settings
# (merging, the manifest, printing) would pay for.
MAX_RECIPE_VALUES = 100_000

# What numpy (``np.random.seed``), torch and vLLM all accept as a seed: a negative seed or a
# larger one fails in numpy, possibly after hours of work (evaluate's bootstrap comes last).
SEED_RANGE = (0, 2**32 - 1)

_DEVICE_CHECKS = contextvars.ContextVar("align_device_checks", default=True)


@contextlib.contextmanager
def deferred_device_checks() -> Iterator[None]:
    """Build configs without checking this machine's devices (bf16 support, GPUs).

    ``align status``, ``align plan`` and ``align submit`` read recipes on a login node that
    has no GPU: a training section with ``bf16: true`` describes the job's node, not this
    one. Inside this block the trainer configs skip those checks; the job that runs the
    stage builds its config again, outside it, and checks its own devices.
    """
    token = _DEVICE_CHECKS.set(False)
    try:
        yield
    finally:
        _DEVICE_CHECKS.reset(token)


def device_checks_enabled() -> bool:
    """False inside ``deferred_device_checks`` (a config read where the job does not run)."""
    return _DEVICE_CHECKS.get()


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"key {key!r} is given twice (lines {first} and {second})")
        self.key, self.first, self.second = key, first, second


class _RecipeLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error: plain YAML
    keeps the last value, so a second ``train:`` section or a repeated ``beta:`` would
    silently replace the first. Keys merged in with ``<<`` may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKey(key, seen[key], line)
                    seen[key] = line
                except TypeError:  # an unhashable key: the base loader reports it
                    continue
        return super().construct_mapping(node, deep=deep)


def expanded_size(value: Any, limit: int = MAX_RECIPE_VALUES) -> int:
    """How many values ``value`` holds with every shared (aliased) node counted each time it
    appears; counting stops past ``limit``."""
    memo: dict[int, int] = {}

    def size(node: Any, depth: int) -> int:
        if depth > 100:
            raise ConfigError("the recipe nests deeper than 100 levels")
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in memo:
            return memo[id(node)]
        children = node.values() if isinstance(node, dict) else node
        total = 1
        for child in children:
            total += size(child, depth + 1)
            if total > limit:
                break
        memo[id(node)] = total
        return total

    return size(value, 0)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a recipe file into a mapping (an empty file is an empty recipe); a key given
    twice in one mapping is an error naming it and both lines; aliases that expand past
    ``MAX_RECIPE_VALUES`` values are an error; so is a file that is not UTF-8 text (naming
    the byte) or not a regular file."""
    from align.io.files import read_text

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"recipe file not found: {path}")
    text = read_text(path, error=ConfigError)  # UTF-8, a regular file (a FIFO never blocks the read)
    try:
        data = yaml.load(text, Loader=_RecipeLoader) or {}  # a SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}; give each key once") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{where}: not valid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of keys to values, got {type(data).__name__}")
    if expanded_size(data) > MAX_RECIPE_VALUES:
        raise ConfigError(f"{path}: expands to more than {MAX_RECIPE_VALUES:,} values (YAML aliases referring to "
                          "aliases); write the settings out")
    return data


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Turn ``["a=1", "b.c=x"]`` into a nested mapping; values are parsed as YAML scalars."""
    result: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("-")
        if not key:
            raise ConfigError(f"override {item!r} has an empty key")
        try:  # @NAME (a step's output) is text, as in a recipe file where it is quoted: [@a, @b] too
            value = raw.strip() if raw.strip().startswith("@") else \
                yaml.safe_load(re.sub(r"(?<=[\[,{:]) *(@[^,\]\}\s]+)", r' "\1"', raw)) if raw.strip() else ""
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem})") from None
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return result


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


# One setting, one name (docs/settings.md). A key that was renamed, or that another stage
# uses for the same meaning, is an error naming the key to use, whether or not difflib
# would find it: old name -> the names it may have become (the first the config has is named).
RENAMED_KEYS: dict[str, tuple[str, ...]] = {
    "date": ("chat_date",),
    "format": ("chat_format",),
    "n_ref": ("num_ref_rewards",),
    "vllm_dtype": ("dtype",),
    "model_dtype": ("dtype",),
    "torch_dtype": ("dtype",),
    "dataset": ("input", "prompts"),
    "train_path": ("input",),
    "train_split": ("split",),
    "train_text_field": ("text_field",),
    "max_new_tokens": ("max_tokens",),
}

# A stage's input is ``prompts`` where it generates completions for prompt records
# (sample, evaluate) and ``input`` where it processes rows (every other stage).
_INPUT_KEYS = {"input": "prompts", "prompts": "input"}


def renamed_key_hint(key: str, names: Sequence[str]) -> str | None:
    """The key ``key`` is called now, among ``names`` (a config's keys), with the reason; else None."""
    if key in RENAMED_KEYS:
        new = next((n for n in RENAMED_KEYS[key] if n in names), None)
        if new is not None:
            return f"Did you mean {new!r}? ({key!r} is now {new!r}: one name per setting, docs/settings.md)"
    if key in _INPUT_KEYS and _INPUT_KEYS[key] in names:
        new = _INPUT_KEYS[key]
        return (f"Did you mean {new!r}? (a stage's input is 'prompts' where it generates completions for "
                f"prompt records, 'input' where it processes rows; docs/settings.md)")
    return None


ALL_KEYS_UP_TO = 15  # a config with more keys (a trainer's: ~200 with TrainingArguments') names the nearest only


def unknown_key_error(cls: type, key: str, where: str) -> ConfigError:
    """The key's likely meaning first (a renamed key, the closest spelling), then the keys to choose from: all of
    a small config's, the nearest few of a large one's (a trainer's hundreds would bury the answer)."""
    names = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    hint = renamed_key_hint(key, names)
    if hint is None:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"Did you mean {close[0]!r}?" if close else ""
    hint = f" {hint}" if hint else ""
    if len(names) <= ALL_KEYS_UP_TO:
        return ConfigError(f"unknown key {where}{key!r} for {cls.__name__}.{hint} Allowed keys: {', '.join(names)}")
    nearest = difflib.get_close_matches(key, names, n=6, cutoff=0.5) or sorted(
        names, key=lambda name: -difflib.SequenceMatcher(None, key, name).ratio())[:6]
    return ConfigError(f"unknown key {where}{key!r} for {cls.__name__}.{hint} Nearest keys: {', '.join(nearest)} "
                       f"({len(names)} keys in all: --help lists each with its meaning)")


def _coerce(value: Any, annotation: Any, where: str, finite: bool = True) -> Any:
    """Check (and gently convert) a YAML value against a type annotation; ``finite``: a float
    must be finite (a field declares ``metadata={"finite": False}`` to take inf or NaN)."""
    if annotation is Any or annotation is typing.Any:
        return value
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where, finite)
            except ConfigError as exc:
                errors.append(str(exc))
        detail = f" ({errors[0].removeprefix(f'{where}: ')})" if errors else ""
        raise ConfigError(f"{where}: {value!r} does not fit {annotation}{detail}")
    if origin is Literal:
        allowed = get_args(annotation)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {annotation.__name__}, got {value!r}")
        return from_dict(annotation, value, where=f"{where}.")
    if origin in (list, tuple, Sequence, typing.Sequence) or annotation in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = get_args(annotation)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, f"{where}[{i}]", finite) for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{where}[{i}]", finite) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or annotation is tuple else items
    if origin in (dict, Mapping) or annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        allowed = [member.value for member in annotation]
        if isinstance(value, annotation) or value in allowed:
            return value
        hint = " (YAML reads an unquoted no/yes/off/on as false/true: quote it)" if isinstance(value, bool) else ""
        raise ConfigError(f"{where}: {value!r} is not one of {allowed}{hint}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)  # numpy integers too
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
            return int(value)
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if annotation is float:
        number = None
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            number = float(value)  # numpy and torch scalars too
        elif isinstance(value, str):
            try:
                number = float(value)  # YAML reads "5e-7" (no dot) as a string
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if finite and not math.isfinite(number):
            raise ConfigError(f"{where}: {value!r} is not a finite number (a run with it would compute NaN "
                              "and could still be marked complete)")
        return number
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (datetime.date, datetime.datetime)):
            return value.isoformat()  # YAML reads an unquoted 2025-09-01 as a date
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        hint = " (YAML reads an unquoted no/yes/off/on as false/true: quote it)" if isinstance(value, bool) else ""
        raise ConfigError(f"{where}: expected a string, got {value!r}{hint}")
    if annotation is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"{where}: expected a path, got {value!r}")
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], *, where: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise unknown_key_error(cls, key, where)
        factory = fields[key].default_factory
        if isinstance(value, Mapping) and factory is not dataclasses.MISSING:
            # `sampler.device=cpu` changes that one key of the field's default (evaluate's
            # sampler defaults to the transformers backend), not of a fresh SamplerConfig
            default = factory()
            if _nested_dataclass(type(default)) is not None:
                value = merge(_init_values(default), value)
        kwargs[key] = _coerce(value, hints.get(key, Any), f"{where}{key}", fields[key].metadata.get("finite", True))
        check_bounds(fields[key], kwargs[key], f"{where}{key}")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:  # a required key not given
        raise ConfigError(f"{where}{cls.__name__}: {exc}") from None
    try:
        return cls(**kwargs)  # its own checks raise ConfigError; anything else is a bug
    except ConfigError as exc:
        if not where:
            raise
        raise ConfigError(f"{where.rstrip('.')}: {exc}") from exc


def is_seed(name: str) -> bool:
    """A seed by its name (``seed``, ``data_seed``): bounded to ``SEED_RANGE`` at load."""
    return name == "seed" or name.endswith("_seed")


def field_bounds(f: dataclasses.Field) -> tuple[float | None, float | None, bool]:
    """(lowest, highest, lowest excluded) that field ``f`` takes: its ``metadata`` ``min`` / ``max``
    (inclusive) or ``above`` (exclusive), and ``SEED_RANGE`` for a seed that declares none."""
    low, high, above = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("above")
    if is_seed(f.name):
        low = SEED_RANGE[0] if low is None and above is None else low
        high = SEED_RANGE[1] if high is None else high
    return (above, high, True) if above is not None else (low, high, False)


def _range_text(low: float | None, high: float | None, excluded: bool) -> str:
    if low is not None and high is not None:
        return f"{'above' if excluded else 'from'} {low} {'and at most' if excluded else 'to'} {high}"
    if low is not None:
        return f"{'>' if excluded else '>='} {low}"
    return f"<= {high}"


def check_bounds(f: dataclasses.Field, value: Any, where: str) -> None:
    """A number given for ``f`` (or each number of a list) within ``field_bounds(f)``, else a
    ConfigError naming the key, the range and the value: found when the recipe loads, not
    when the number is first used, hours later."""
    low, high, excluded = field_bounds(f)
    if low is None and high is None:
        return
    for number in value if isinstance(value, (list, tuple)) else [value]:
        if not isinstance(number, numbers.Real) or isinstance(number, bool):
            continue
        below = low is not None and (number <= low if excluded else number < low)
        if below or (high is not None and number > high):
            seed = " (a seed numpy, torch and vLLM all accept)" if is_seed(f.name) else ""
            raise ConfigError(f"{where}: must be {_range_text(low, high, excluded)}{seed}, got {number!r}")


def _init_values(config: Any) -> dict[str, Any]:
    """A dataclass instance's init fields as a mapping (nested ones too), to merge keys over."""
    return {f.name: (_init_values(v) if dataclasses.is_dataclass(v := getattr(config, f.name))
                     and not isinstance(v, type) else v)
            for f in dataclasses.fields(config) if f.init}


def _component_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """The init fields of ``cls`` that hold one nested component config (``sampler``,
    ``reward``, ``generator``), with that config's class; lists of configs are not components."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        nested = _nested_dataclass(hint) if f.init else None
        if nested is not None and get_origin(hint) not in (list, tuple, Sequence, typing.Sequence):
            out.append((f, nested))
    return out


def default_keys(cls: type) -> set[str]:
    """Every key a pipeline ``defaults`` entry can reach in ``cls``: its own keys and its
    nested components' keys, at any depth."""
    keys = {f.name for f in dataclasses.fields(cls) if f.init}
    for _, nested in _component_fields(cls):
        keys |= default_keys(nested)
    return keys


def apply_defaults(cls: type, defaults: Mapping[str, Any], section: Mapping[str, Any]) -> dict[str, Any]:
    """``section`` over the pipeline ``defaults`` that ``cls`` knows, at every depth.

    A default key reaches ``cls``'s own key of that name and the same key of every nested
    component config (``defaults: {chat_date: ...}`` sets the trainers' ``chat_date`` and
    ``sample.sampler.chat_date``); a key given in the section wins at its own level. A
    component absent by default (its field defaults to None) is not created by a default.
    Defaults that ``cls`` does not know are left out (they are meant for other stages).
    """
    own = {f.name for f in dataclasses.fields(cls) if f.init}
    out = merge({k: v for k, v in defaults.items() if k in own}, section)
    for f, nested in _component_fields(cls):
        given = out.get(f.name)
        if given is None and f.default_factory is dataclasses.MISSING:
            continue
        if given is not None and not isinstance(given, Mapping):
            continue  # a config object (Python callers) or a wrong value: from_dict decides
        projected = apply_defaults(nested, defaults, given or {})
        if projected or f.name in out:
            out[f.name] = projected
    return out


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> T:
    """Load ``cls`` from a file of its keys plus ``key=value`` overrides.

    A pipeline recipe (steps or sections) is read by ``align.stages.load_recipe`` instead,
    which applies its ``defaults`` and wiring: ``align.stages.stage_config(STAGE, [RECIPE, ...])``
    gives one step's config as ``align STAGE RECIPE`` builds it.
    """
    data = read_yaml(path) if path is not None else {}
    return from_dict(cls, merge(data, parse_overrides(overrides)))


def to_dict(config: Any) -> dict[str, Any]:
    """A YAML-safe dict of a config (paths as strings), for logging and output metadata."""

    def clean(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: clean(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, Mapping):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if hasattr(value, "value") and type(value).__module__ != "builtins":  # enums
            return clean(value.value)
        return value

    return clean(config)


def _docstring_fields(cls: type) -> dict[str, str]:
    """Field docs written in a class docstring.

    Two styles are read: ``name (type, ...): text`` and ``name: text`` (several names may
    share one entry: ``dtype / device: text``, ``a, b: text``); indented lines continue it.
    """
    import inspect
    import re

    docs: dict[str, str] = {}
    current: list[str] = []
    indent = 0
    entry = re.compile(r"^\s*(\w+(?:\s*[/,]\s*\w+)*)(?: \((.*?)\))?:\s*(.*)$")
    for klass in reversed(cls.__mro__):
        for line in inspect.cleandoc(klass.__doc__ or "").splitlines():
            match = entry.match(line)
            if match and match.group(3).strip():
                current = [name.strip() for name in re.split(r"[/,]", match.group(1))]
                indent = len(line) - len(line.lstrip())
                for name in current:
                    docs[name] = match.group(3).strip()
            elif current and line.strip() and len(line) - len(line.lstrip()) > indent:
                for name in current:
                    docs[name] += " " + line.strip()
            else:
                current = []
    return docs


def _nested_dataclass(annotation: Any) -> type | None:
    """The project's config dataclass a field holds (directly, optionally, or as list items), else None."""
    for candidate in (annotation, *get_args(annotation), *(i for a in get_args(annotation) for i in get_args(a))):
        if dataclasses.is_dataclass(candidate) and isinstance(candidate, type):
            # the project's own configs; a library's (accelerate's parallelism_config) stays one key
            return candidate if candidate.__module__.split(".")[0] in ("align", "rewards") else None
    return None


def field_docs(cls: type, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every recipe key of ``cls``, nested keys as ``a.b``.

    The one source of ``--help``: help comes from ``field(metadata={"help": ...})`` or,
    failing that, from the class docstring. Keys of nested configs (``sampler.model``,
    ``reward.provider``, ``policies[].name``) follow their parent, with the defaults of the
    parent field's own default (``defaults``: evaluate's sampler is on transformers).
    """
    rows = []
    docstring_docs = _docstring_fields(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if defaults is not None:
            default = repr(getattr(defaults, f.name))
        elif f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = repr(f.default_factory())  # type: ignore[misc]
        else:
            default = "required"
        hint = hints.get(f.name)
        kind = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        doc = f.metadata.get("help", "") or docstring_docs.get(f.name, "")
        nested = _nested_dataclass(hint)
        if nested is not None and len(default) > 60:
            default = f"{nested.__name__}(...)"
        rows.append((prefix + f.name, kind, default, doc))
        if nested is not None:
            is_list = get_origin(hint) in (list, Sequence, typing.Sequence)
            if defaults is not None:
                value = getattr(defaults, f.name)
            else:
                value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            value = value if isinstance(value, nested) else None
            rows += field_docs(nested, f"{prefix}{f.name}{'[]' if is_list else ''}.", value)
    return rows


def describe(cls: type) -> str:
    """A help text listing each key (nested ones too) with its type, default and docs: the keys a class of
    the project declares first, the most specific class's first (a trainer's method keys before its model
    keys), then the keys it inherits from transformers or TRL under their own heading."""
    rank = _declared_rank(cls)
    rows = sorted(field_docs(cls), key=lambda row: rank.get(_top_key(row[0]), 0))
    own = [row for row in rows if rank.get(_top_key(row[0]), 0) >= 0]
    inherited = [row for row in rows if rank.get(_top_key(row[0]), 0) < 0]
    text = "\n".join(_key_line(row) for row in own)
    if inherited:
        origins = sorted({c.__module__.split(".")[0] for c in cls.__mro__ if _is_library_class(c)})
        text += (f"\n\n  Inherited from {' and '.join(origins)} (their own documentation has more):\n"
                 + "\n".join(_key_line(row) for row in inherited))
    return text


def _key_line(row: tuple[str, str, str, str]) -> str:
    key, kind, default, doc = row
    return f"  {key} ({kind}, default {default})" + (f"\n      {doc}" if doc else "")


def _top_key(key: str) -> str:
    return key.split(".")[0].split("[")[0]


def _is_library_class(klass: type) -> bool:
    return dataclasses.is_dataclass(klass) and klass.__module__.split(".")[0] not in ("align", "rewards", "bench")


def _declared_rank(cls: type) -> dict[str, int]:
    """Each field by the class that declares it: 0, 1, ... from the most specific of the project's classes,
    negative for a field a library class declares (and no class of the project declares again)."""
    rank: dict[str, int] = {}
    own = [c for c in cls.__mro__ if dataclasses.is_dataclass(c) and not _is_library_class(c)]
    for position, klass in enumerate(own):
        for name in vars(klass).get("__annotations__", {}):
            rank.setdefault(name, position)
    for f in dataclasses.fields(cls):
        rank.setdefault(f.name, -1)
    return rank
