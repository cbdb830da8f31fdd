"""``read_recipe``: a recipe of any shape (stage file, sections, step graph) as one ``Recipe``."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.config import from_dict, merge, parse_overrides, read_yaml, unknown_key_error
from align.errors import ConfigError
from align.io.files import expand_variables
from align.recipe import graph
from align.recipe.checks import check_graph
from align.recipe.graph import (
    ConfigClass,
    OutputIndex,
    Recipe,
    Step,
    check_defaults,
    check_outputs,
    clear_path_cache,
    expand_phases,
    in_order,
    reads_from,
    references_in,
    resolve_references,
)
from align.recipe.rounds import POLICY_TOKENS, ROUND_SECTIONS, graph_rounds, section_rounds
from align.recipe.settings import EXTRA_SECTIONS, SECTIONS, PipelineSettings
from align.stage_table import STAGES

PIPELINE_KEYS = frozenset(f.name for f in dataclasses.fields(PipelineSettings))
# Keys whose value is a path: $VAR and ${VAR} in them are the environment's ($SCRATCH/runs/x)
_PATH_LEAVES = frozenset({"input", "prompts", "model", "model_name_or_path", "ref_model_name_or_path", "tokenizer",
                          "completions", "output_dir", "cache_dir", "log_dir", "scripts_dir", "accelerate_config",
                          "python", "charter", "personas_file", "deepspeed", "initial_policy", "from",
                          "validation_prompts", "kl_reference_model", "resume_from_checkpoint", "logging_dir",
                          "path"})
# A step's name: it becomes an argument of its job (`align step RECIPE NAME`) and part of paths and job names.
STEP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def expand_paths(value: Any, where: str = "", key: str = "") -> Any:
    """``$VAR`` / ``${VAR}`` in path values replaced by the environment's value; an unset one is an error
    naming the key (a directory literally named ``$SCRATCH`` is never made)."""
    if isinstance(value, Mapping):
        return {k: expand_paths(v, f"{where}{k}.", str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_paths(v, where, key) for v in value]
    leaf = key.rsplit(".", 1)[-1]
    if isinstance(value, str) and "$" in value and (leaf in _PATH_LEAVES or leaf.endswith(("_path", "_dir", "_file"))):
        return expand_variables(value, named=f"{where.rstrip('.')}={value!r}", what="path")
    return value


def config_builds() -> list[str]:
    """The step names whose config was built, in order, since the process started (tests count them)."""
    return list(graph.BUILDS)


def is_pipeline(data: Mapping[str, Any]) -> bool:
    """A recipe of sections or of steps (else: the keys of one stage)."""
    return isinstance(data.get("steps"), Mapping) or \
        any(isinstance(data.get(name), Mapping) for name in (*SECTIONS, *EXTRA_SECTIONS))


def read_recipe(source: str | Path | Mapping[str, Any], overrides: Sequence[str] | Mapping[str, Any] = (), *,
                config_class: ConfigClass, stage: str | None = None, devices: str = "check") -> Recipe:
    """Read a recipe into its steps.

    ``source``: a YAML file or the recipe as a mapping. ``overrides``: ``key=value`` strings
    (or a mapping) over it; for a pipeline, a step's keys are ``NAME.key=value``.
    ``stage``: the stage a stage file is for (required for that shape). ``devices``: ``check``
    where the steps run, ``defer`` where they are only read (status, plan, submit on a login node).
    """
    clear_path_cache()
    where = str(source) if isinstance(source, (str, Path)) else None
    data = read_yaml(source) if isinstance(source, (str, Path)) else dict(source or {})
    extra = parse_overrides(overrides) if not isinstance(overrides, Mapping) else dict(overrides)
    data, extra = expand_paths(data), expand_paths(extra)
    base = Path(where).parent if where else Path(".")
    if not is_pipeline(data) and not is_pipeline(extra):
        if stage is None:
            raise ConfigError(f"{where or 'the recipe'}: the keys of one stage, with no stage named (a pipeline "
                              "recipe has steps: or one section per stage)")
        keys = merge(data, extra)
        step = Step(stage, stage, keys, base=stage)
        raw = {"steps": {stage: {"stage": stage, **keys}}}
        return Recipe(PipelineSettings(), [step], config_class, where, "stage", devices, raw)
    if isinstance(data.get("steps"), Mapping):  # NAME.key=value: a step's key
        named = {k: v for k, v in extra.items() if k in data["steps"] and (k in SECTIONS or k not in PIPELINE_KEYS)}
        extra = {k: v for k, v in extra.items() if k not in named}
        _check_step_overrides(data["steps"], extra)
        if named:
            extra = merge(extra, {"steps": named})
    data = merge(data, extra)
    extra_sections = {k: v for k, v in data.items() if k in EXTRA_SECTIONS and isinstance(v, Mapping)}
    top = {k: v for k, v in data.items() if k in PIPELINE_KEYS}
    unknown = sorted(set(data) - PIPELINE_KEYS - set(extra_sections))
    if unknown:
        raise unknown_key_error(PipelineSettings, unknown[0], "")
    settings = from_dict(PipelineSettings, top)
    if settings.steps is not None:
        expanded = {name: _step_keys(name, keys, base, tuple(STAGES)) for name, keys in settings.steps.items()}
        settings.steps = expanded
        data = {**data, "steps": expanded}
        steps = _graph_steps(settings)
    else:
        if extra_sections and settings.rounds is not None:
            raise ConfigError(f"rounds: the sections {sorted(extra_sections)} run once; a recipe with rounds has the "
                              f"sections {list(SECTIONS)}")
        steps = _section_steps(settings, config_class, extra_sections)
    check_defaults(settings.defaults, steps, config_class)
    steps = [phase for step in steps for phase in expand_phases(step)]
    check_outputs(steps)
    check_graph(steps, settings.defaults, config_class)
    _check_slurm_names(settings, steps)
    steps = _stop_after(settings, steps)
    return Recipe(settings, steps, config_class, where, "pipeline", devices, data)


def _with_needs(steps: list[Step]) -> list[Step]:
    """Each step's ``needs`` (the steps whose output directory one of its values names, wherever they are
    listed), and the steps in an order where each runs after the steps it reads."""
    index = OutputIndex(steps)
    position = {step.name: i for i, step in enumerate(steps)}
    for step in steps:
        found = sorted(reads_from(step.keys, index, step.name), key=position.__getitem__)
        step.needs = tuple(dict.fromkeys([*step.needs, *found]))
    return in_order(steps)


def _section_steps(settings: PipelineSettings, config_class: ConfigClass,
                   extra: Mapping[str, Any] | None = None) -> list[Step]:
    once = [Step(name, name, dict(getattr(settings, name)), base=name) for name in SECTIONS
            if getattr(settings, name) is not None and (settings.rounds is None or name not in ROUND_SECTIONS)]
    once += [Step(name, name, dict(keys), base=name) for name, keys in (extra or {}).items()]
    if settings.rounds is not None:
        once += section_rounds(settings, once, config_class)
    if not once:
        raise ConfigError(f"a pipeline recipe needs steps: or at least one stage section of {list(SECTIONS)}")
    return _with_needs(once)


def _step_keys(name: str, keys: Any, base: Path, stages: Sequence[str]) -> dict[str, Any]:
    """A step's keys as written, with the stage file its ``from`` names underneath."""
    if not isinstance(name, str) or not STEP_NAME.fullmatch(name) or name.startswith("round-") or \
            name in POLICY_TOKENS:
        raise ConfigError(f"steps: {name!r} is not a step name: a name is letters, digits, _ and -, starting with a "
                          "letter or _ (no '.', '/', '=', '@' or leading '-'; not round-K, policy, reference or "
                          "initial): it becomes a command-line argument of the step's job")
    if not isinstance(keys, Mapping):
        raise ConfigError(f"steps.{name}: expected a mapping ({{stage: TYPE, ...}}), got {keys!r}")
    stage = keys.get("stage")
    if stage not in stages:
        raise ConfigError(f"steps.{name}.stage: {stage!r} is not a stage; one of {sorted(stages)}")
    out = {k: v for k, v in keys.items() if k != "from"}
    if "from" in keys:
        path = Path(str(keys["from"]))
        if not path.is_absolute() and (base / path).exists():
            path = base / path  # beside the recipe, else from the working directory
        try:
            included = read_yaml(path)
        except ConfigError as exc:  # the file's own error (not found, not UTF-8, not YAML), with the step it is for
            raise ConfigError(f"steps.{name}.from: {exc}") from None
        if is_pipeline(included):
            raise ConfigError(f"steps.{name}.from: {keys['from']} is a pipeline recipe; name a stage file")
        out = merge(expand_paths(included), out)
    return out


def _graph_steps(settings: PipelineSettings) -> list[Step]:
    raw = dict(settings.steps or {})  # each step's keys, its from: file merged in
    if not raw:
        raise ConfigError("steps: give at least one step")
    tokens = POLICY_TOKENS if settings.rounds is not None else ()
    for name, keys in raw.items():
        for ref in sorted(references_in(keys)):
            if ref not in tokens and ref not in raw:
                raise ConfigError(f"step {name!r}: @{ref} names no step (steps: {list(raw)})")
            if ref == name:
                raise ConfigError(f"step {name!r}: @{ref} names the step itself: a step reads what other steps "
                                  "or your files hold, never what it writes")
    if settings.rounds is None:
        outputs = _outputs(settings, raw, list(raw))
        return _with_needs([_graph_step(name, raw[name], outputs) for name in raw])
    order = _raw_order(raw)
    outputs = _outputs(settings, raw, order, rounds=True)
    once, initial, repeated = graph_rounds(settings, raw, outputs, order)
    once_outputs = {name: outputs[name] for name in once}
    # π₀: a step that runs once reads @reference only under reference: initial (else it would run every round)
    steps = [_graph_step(name, raw[name], once_outputs, {"initial": initial, "reference": initial}) for name in once]
    for k, name, keys in repeated:
        steps.append(Step(f"round-{k}.{name}", raw[name]["stage"], keys, k, (), f"round {k}", base=name))
    return _with_needs(steps)


def _outputs(settings: PipelineSettings, raw: Mapping[str, dict[str, Any]], order: list[str], *,
             rounds: bool = False) -> dict[str, str | None]:
    """Every step's output directory (as if it ran once, with rounds: what ``@NAME`` of a once-step means):
    its own ``output_dir`` (None: a keyed output), else the recipe's ``output_dir/NAME``."""
    out: dict[str, str | None] = {}
    for name in order:
        if "output_dir" in raw[name]:
            value = raw[name]["output_dir"]
            if isinstance(value, str) and value.startswith("@"):
                raise ConfigError(f"step {name!r}: output_dir={value!r}: a step writes a directory of its own, not "
                                  "another step's output")
            out[name] = None if value is None else str(value)
        elif settings.output_dir:
            out[name] = str(Path(settings.output_dir) / name)
        elif rounds:
            out[name] = name
        else:
            raise ConfigError(f"step {name!r}: set its output_dir, or the recipe's output_dir (step NAME then writes "
                              "to output_dir/NAME)")
    return out


def _raw_order(raw: Mapping[str, dict[str, Any]]) -> list[str]:
    """The steps of a graph with rounds in an order where each comes after the steps it names (``@NAME``)."""
    steps = [Step(name, str(keys.get("stage")), {}, needs=tuple(sorted(references_in(keys) & set(raw))))
             for name, keys in raw.items()]
    return [step.name for step in in_order(steps)]


def _graph_step(name: str, keys: dict[str, Any], outputs: Mapping[str, str | None],
                tokens: dict[str, str] | None = None) -> Step:
    """One step of a graph without rounds (or one that runs once, before them), every ``@NAME`` resolved."""
    stage = keys["stage"]
    values = {k: v for k, v in keys.items() if k != "stage"}
    values = resolve_references(values, outputs, f"step {name!r}", tokens)
    values["output_dir"] = outputs[name]  # its own output_dir (as a string), else the recipe's output_dir/NAME
    return Step(name, stage, values, base=name)


def _check_step_overrides(steps: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
    """An override of a step graph names a step (``qrpo.beta=3``) or a top-level key; a stage's name
    (``train.beta=3``) names the steps of that stage it could mean, a misspelt step the steps there are."""
    for key, value in extra.items():
        if key in PIPELINE_KEYS and key not in SECTIONS:
            continue
        if not isinstance(value, Mapping):
            continue  # an unknown top-level key: refused with the pipeline's keys below
        inner = ".".join(_first_path(value))
        if key in STAGES:
            mine = [name for name, keys in steps.items() if isinstance(keys, Mapping) and keys.get("stage") == key]
            raise ConfigError(f"{key}.{inner}=...: this recipe is a step graph, where {key} is a stage, not a step; "
                              + (f"its {key} steps are {mine}: set {' or '.join(f'{n}.{inner}=...' for n in mine)}"
                                 if mine else f"it has no {key} step (steps: {list(steps)})"))
        close = difflib.get_close_matches(key, list(steps), n=1)
        raise ConfigError(f"{key}.{inner}=...: {key!r} names no step of this recipe"
                          + (f"; did you mean {close[0]}.{inner}?" if close else "") + f" (steps: {list(steps)})")


def _first_path(value: Any) -> list[str]:
    """The keys down to an override's first value (``sampler.model`` for ``{sampler: {model: x}}``)."""
    path: list[str] = []
    while isinstance(value, Mapping) and value:
        key = next(iter(value))
        path.append(str(key))
        value = value[key]
    return path


def _check_slurm_names(settings: PipelineSettings, steps: list[Step]) -> None:
    """``slurm.stages`` keys name a step (its name in the recipe) or a stage type."""
    known = {s.base or s.name for s in steps} | {s.stage for s in steps} | {s.name for s in steps}
    unknown = sorted(set(settings.slurm.stages) - known)
    if unknown:
        raise ConfigError(f"slurm.stages: {unknown} name no step or stage of this recipe (steps: "
                          f"{sorted({s.base or s.name for s in steps})})")


def _stop_after(settings: PipelineSettings, steps: list[Step]) -> list[Step]:
    """The steps to run: up to the one ``stop_after`` names (a step, a stage or, with rounds, a round)."""
    wanted = settings.stop_after
    if wanted is None:
        return steps
    for i, step in enumerate(steps):
        if wanted in (step.name, step.stage, step.base):
            last = i
            while last + 1 < len(steps) and steps[last + 1].phase:
                last += 1  # an evaluate step's KL and report jobs, which follow it, belong to it
            return steps[: last + 1]
    rounds = [i for i, step in enumerate(steps) if step.round is not None and f"round-{step.round}" == wanted]
    if rounds:
        return steps[: rounds[-1] + 1]
    if wanted in SECTIONS:  # a stage this recipe does not run: nothing to stop at
        return steps
    allowed = [s.name for s in steps] + sorted({f"round-{s.round}" for s in steps if s.round})
    raise ConfigError(f"stop_after: {wanted!r} is not one of {allowed}")
