"""One name per setting (docs/settings.md), checked on every key and every public signature.

``MEANINGS`` is the table of docs/settings.md: meaning -> the one name -> the names it
must never have again. The names checked are collected from

- every stage's ``Config`` (``align.stage_table.STAGES``), nested component configs (``sampler``,
  ``reward``, ``generator``) and list items (``policies[]``, ``benchmarks[]``) included;
- the public API: every name ``align`` and ``rewards`` export (a function's parameters, a
  class's constructor parameters and dataclass fields, and the parameters of its public
  methods defined in this project).

A test fails when an old name appears anywhere, when a name of the table appears nowhere
(the table went stale), when an old recipe key would not be answered with the new one
(``align.config.RENAMED_KEYS``), or when a stage reads its rows under another key than
``prompts`` (prompt records it generates for) or ``input`` (rows it processes).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

import align
import rewards
from align.config import RENAMED_KEYS, ConfigError, from_dict
from align.stage_table import command_module as stage_module, summaries

STAGES = summaries()  # every command: the stages, the drivers and the tools


class Meaning(NamedTuple):
    meaning: str
    name: str
    old: tuple[str, ...]
    recipe: bool = True  # a recipe / CLI key (old names must be in RENAMED_KEYS); False: Python only


MEANINGS = [
    Meaning("the date in the Apertus default system text", "chat_date", ("date",)),
    Meaning("the chat format prompts are rendered in", "chat_format", ("format",)),
    Meaning("reference completions drawn per prompt", "num_ref_rewards", ("n_ref",)),
    Meaning("the dtype a model's weights are loaded in", "dtype", ("model_dtype", "vllm_dtype", "torch_dtype")),
    Meaning("the most tokens generated per completion", "max_tokens", ("max_new_tokens",)),
    Meaning("prompt records a stage generates completions for", "prompts", ()),
    Meaning("the rows a stage processes (a path)", "input", ("dataset", "train_path")),
    Meaning("the rows a Python function processes", "records", ("dataset", "eval_dataset", "train_records"),
            recipe=False),
    Meaning("the split of a load_dataset source", "split", ("train_split",)),
    Meaning("the column holding a prompt's text", "text_field", ("train_text_field",)),
]

# stages that read rows, and the key they read them under
GENERATES_FOR_PROMPTS = {"sample", "evaluate"}
NO_ROW_INPUT = {"plan", "pipeline", "status", "submit", "demo", "step", "tiny-models", "card"}  # sections of other stages; the demo and tiny-models make their own; card reads manifests


# --------------------------------------------------------------------------- collecting names


def _nested_configs(annotation: Any) -> list[type]:
    """The project's config dataclasses a field holds (directly, optionally or as list items)."""
    found = []
    for candidate in (annotation, *typing.get_args(annotation),
                      *(i for a in typing.get_args(annotation) for i in typing.get_args(a))):
        if dataclasses.is_dataclass(candidate) and isinstance(candidate, type) \
                and (candidate.__module__.split(".")[0] in ("align", "rewards") or candidate.__module__ == __name__):
            found.append(candidate)
    return found


def config_names(cls: type, where: str, out: dict[str, set[str]]) -> dict[str, set[str]]:
    """name -> the places (``stage.key.path``) of every init field of ``cls``, nested ones too."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        out[f.name].add(f"{where}.{f.name}")
        for nested in _nested_configs(hints.get(f.name)):
            config_names(nested, f"{where}.{f.name}", out)
    return out


def _own(obj: Any) -> bool:
    return getattr(obj, "__module__", "").split(".")[0] in ("align", "rewards")


def _parameters(func: Any) -> list[str]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    return [p.name for p in signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in ("self", "cls")]


# classes whose constructor is transformers.Trainer's, names included (train_dataset, eval_dataset,
# processing_class): a TRL user builds them as TRL's trainers (docs/coming-from-trl.md)
TRAINER_SHAPED = {"align.PreferenceTrainer"}


def api_names(objects: dict[str, Any], out: dict[str, set[str]]) -> dict[str, set[str]]:
    """name -> the places (``align.render(chat_date)``) of every parameter of the public API."""
    for label, obj in objects.items():
        if inspect.isclass(obj):
            if dataclasses.is_dataclass(obj):
                config_names(obj, label, out)
            for name in ([] if label in TRAINER_SHAPED else _parameters(obj)):
                out[name].add(f"{label}({name})")
            for attr, member in vars(obj).items():
                member = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if not attr.startswith("_") and inspect.isfunction(member) and _own(member):
                    for name in _parameters(member):
                        out[name].add(f"{label}.{attr}({name})")
        elif callable(obj):
            for name in _parameters(obj):
                out[name].add(f"{label}({name})")
    return out


def stage_configs() -> dict[str, type]:
    return {name: stage_module(name).Config for name in STAGES}


def public_api() -> dict[str, Any]:
    return {**{f"align.{n}": getattr(align, n) for n in align.__all__},
            **{f"rewards.{n}": getattr(rewards, n) for n in rewards.__all__}}


@pytest.fixture(scope="module")
def names() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for stage, cls in stage_configs().items():
        config_names(cls, stage, out)
    return api_names(public_api(), out)


def violations(names: dict[str, set[str]], meanings: list[Meaning] = MEANINGS) -> list[str]:
    """Each old name found, with where; each name of the table found nowhere."""
    problems = []
    for m in meanings:
        for old in m.old:
            if old in names:
                problems.append(f"{m.meaning}: {old!r} (the one name is {m.name!r}) at {sorted(names[old])}")
        if m.name not in names:
            problems.append(f"{m.meaning}: {m.name!r} is used nowhere: the table is stale")
    return problems


# --------------------------------------------------------------------------- the rules


def test_no_meaning_has_a_second_name(names):
    assert not violations(names), "\n".join(violations(names))


@dataclass
class _OldSampler:
    date: str | None = None
    vllm_dtype: str = "auto"


@dataclass
class _OldStage:
    sampler: _OldSampler = field(default_factory=_OldSampler)


def _old_render(messages, *, format="apertus", chat_date=None):
    return messages


def test_the_checker_finds_an_old_name_in_a_config_and_in_a_signature():
    found: dict[str, set[str]] = defaultdict(set)
    config_names(_OldStage, "sample", found)
    api_names({"align.render": _old_render}, found)
    problems = "\n".join(violations(found))
    assert "'date'" in problems and "sample.sampler.date" in problems
    assert "'vllm_dtype'" in problems and "'format'" in problems and "align.render(format)" in problems
    assert not violations({m.name: {"x"} for m in MEANINGS})


def test_the_collection_reaches_nested_sections_list_items_and_methods(names):
    assert "sample.sampler.chat_date" in names["chat_date"] and "evaluate.sampler.chat_date" in names["chat_date"]
    assert "evaluate.reward.dtype" in names["dtype"] and "judge-validate.generator.max_tokens" in names["max_tokens"]
    assert "decontaminate.benchmarks.text_field" in names["text_field"]
    assert "align.render(chat_date)" in names["chat_date"] and "align.install_format(chat_format)" in names["chat_format"]
    assert "align.TransformersSampler.sample(max_tokens)" in names["max_tokens"]
    assert "align.make_pairs(num_ref_rewards)" in names["num_ref_rewards"]


@pytest.mark.parametrize("meaning", [m for m in MEANINGS if m.recipe and m.old], ids=lambda m: m.name)
def test_every_old_recipe_key_names_the_new_one(meaning):
    for old in meaning.old:
        assert meaning.name in RENAMED_KEYS.get(old, ()), f"RENAMED_KEYS[{old!r}] should name {meaning.name!r}"


def _classes_with(name: str) -> list[tuple[str, type]]:
    """(where, config class) for every stage config and nested config that has the key ``name``."""
    found = {}

    def walk(cls: type, where: str) -> None:
        hints = typing.get_type_hints(cls)
        if any(f.name == name and f.init for f in dataclasses.fields(cls)):
            found.setdefault(cls, where)
        for f in dataclasses.fields(cls):
            for nested in _nested_configs(hints.get(f.name)):
                walk(nested, f"{where}.{f.name}")

    for stage, cls in stage_configs().items():
        walk(cls, stage)
    return [(where, cls) for cls, where in found.items()]


@pytest.mark.parametrize("old,new", [(old, new) for old, news in RENAMED_KEYS.items() for new in news])
def test_an_old_key_is_an_error_naming_the_new_key_in_every_config_that_has_it(old, new):
    """``date=...`` on the sampler, ``dataset=...`` on sft, ``vllm_dtype`` anywhere: the error
    says which key to use, whatever difflib would have suggested."""
    places = _classes_with(new)
    for where, cls in places:
        if any(f.name == old for f in dataclasses.fields(cls)):
            continue  # `prompts` and `input` are both keys somewhere; not an old name there
        with pytest.raises(ConfigError, match=rf"Did you mean '{new}'\?.*'{old}' is now '{new}'") as raised:
            from_dict(cls, {old: "x"})
        assert "docs/settings.md" in str(raised.value), where


def test_each_stage_reads_its_rows_from_prompts_or_input():
    for stage, cls in stage_configs().items():
        keys = {f.name for f in dataclasses.fields(cls) if f.init}
        if stage in NO_ROW_INPUT:
            assert not keys & {"input", "dataset", "train_path"}, stage
            continue
        expected = "prompts" if stage in GENERATES_FOR_PROMPTS else "input"
        assert expected in keys and not ({"prompts", "input"} - {expected}) & keys, (stage, sorted(keys))


def test_prompts_and_input_are_paths_wherever_they_are_keys():
    """One meaning per name too: a stage key called ``prompts`` or ``input`` is a path (the demo's
    prompt count is ``num_prompts``)."""
    for stage, cls in stage_configs().items():
        hints = typing.get_type_hints(cls)
        for key in ("prompts", "input"):
            if key in hints:
                # a path, or several read as one input (pairs: the annotate outputs of a `where:` split)
                assert hints[key] in (str, str | None, str | list[str]), (stage, key, hints[key])


def test_a_stage_key_and_its_hint_for_the_other_input_name():
    """`input=` on sample, `prompts=` on annotate: the error names the key that stage reads."""
    with pytest.raises(ConfigError, match=r"Did you mean 'prompts'\?"):
        from_dict(stage_module("sample").Config, {"input": "p.jsonl"})
    with pytest.raises(ConfigError, match=r"Did you mean 'input'\?"):
        from_dict(stage_module("annotate").Config, {"prompts": "p.jsonl"})


def test_removed_python_keywords_are_type_errors():
    from align.chat import render

    with pytest.raises(TypeError, match="format"):
        render([{"role": "user", "content": "Hi"}], format="apertus")
    with pytest.raises(TypeError, match="n_ref"):
        align.make_pairs([], seed=0, n_ref=4)


def test_one_dtype_reaches_every_backend(monkeypatch):
    """The sampler's and the reward side's `dtype` is what vLLM gets too (once `vllm_dtype`,
    or a `dtype` inside `engine_kwargs`, which is refused now)."""
    import align.sampling.vllm_backend
    from align.sampling.config import SamplerConfig, build_sampler
    from rewards.config import RewardProviderConfig, vllm_engine_kwargs

    seen = {}
    monkeypatch.setattr(align.sampling.vllm_backend, "VLLMSampler", lambda model, **kwargs: seen.update(kwargs))
    build_sampler(SamplerConfig(model="m", dtype="bfloat16"))
    assert seen["dtype"] == "bfloat16"
    build_sampler(SamplerConfig(model="m"))
    assert seen["dtype"] == "auto"  # the default, as before
    assert vllm_engine_kwargs(RewardProviderConfig(model="j", dtype="bfloat16", engine_kwargs={"max_model_len": 8})) \
        == {"max_model_len": 8, "dtype": "bfloat16"}
    assert vllm_engine_kwargs(RewardProviderConfig(model="j")) == {}  # vLLM's own default
    for config in (SamplerConfig, RewardProviderConfig):
        with pytest.raises(ValueError, match=r"engine_kwargs.dtype: set the dtype key"):
            config(model="m", engine_kwargs={"dtype": "bfloat16"})
