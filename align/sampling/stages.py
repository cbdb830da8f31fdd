"""Sampling stages over prompt records: reference completions and offline completions.

Both run through `align.jobs.run_job`, so they shard, resume after a kill, and refuse
to resume with other settings. Each record's draws are seeded by (seed, record id), so a
resumed run draws what the uninterrupted run would have.

Output rows are the input prompt records plus:

    completions:   the existing completions (if any) followed by the new ones
    num_overlong:  how many new completions hit the token budget (finish_reason "length");
                   with overlong="drop" they are not in `completions`, only counted here
    num_ref_dropped: (reference sampling) how many of the n reference samples overlong="drop"
                   removed, so the pairs stage expects n - num_ref_dropped references; the
                   offline stage passes it through unchanged
    skip_reason:   set (and no completions added) when nothing can be generated for the
                   prompt: its text holds a token the chat format reads as structure, it fills
                   the model's context, a server refused it, or every completion ran past
                   max_tokens and overlong="drop" removed it; such a record is not lost (a
                   skip row: every later stage passes it on with this reason). A row that came
                   in as a skip row is passed on as it came, not sampled.
    skipped_variants: (offline sampling) {system prompt tag: why} for the variants that could
                   not be sampled while others were
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from align.data.records import passing_skips, record_id, skip_reason, validate_all, validate_prompt
from align.errors import ConfigError, InputError, RecordError
from align.io import read_output
from align.jobs import run_job
from align.sampling.base import Completion, Sampler, derive_seed
from align.sampling.system_prompts import (
    DEFAULT_PERSONAS,
    SystemPrompt,
    charter_prompt,
    draw_system_prompt,
)

Overlong = Literal["flag", "drop"]


def _check_overlong(overlong: str) -> None:
    if overlong not in ("flag", "drop"):
        raise ConfigError(f"overlong must be 'flag' (keep, finish_reason='length') or 'drop', got {overlong!r}")


def _prompt_chars(record: Mapping[str, Any]) -> int:
    """Sort key: prompt size in characters, a cheap stand-in for its token count."""
    return len(json.dumps(record["messages"], ensure_ascii=False))


def _existing_completions(record: Mapping[str, Any]) -> list:
    existing = record.get("completions") or []
    if not isinstance(existing, list):
        raise RecordError(record["id"], "completions", f"expected a list, got {type(existing).__name__}")
    return list(existing)


def preflight(records: Sequence[Mapping[str, Any]] | Any, sampler: Sampler, variants: Any, shard_index: int,
              num_shards: int) -> dict[tuple[str, str], str]:
    """Every prompt of this shard rendered once before the job writes anything: (id, variant) -> why it is
    skipped (its text holds a token the format reads as structure, or it fills the context); a prompt the
    format cannot render at all is an error now, naming the record, never mid-run."""
    from align.chat import structure_text_problem
    from align.jobs.sharding import shard_of

    reasons: dict[tuple[str, str], str] = {}
    tried, too_long = 0, []  # prompts rendered; the lengths of those that fill the context
    for record in records:
        if shard_of(record["id"], num_shards) != shard_index or skip_reason(record) is not None:
            continue
        for tag, conversation in variants(record):
            tried += 1
            reason = structure_text_problem([conversation, record.get("tools")], sampler.encoder.chat_format)
            if reason is None and (length := _length(sampler, record, conversation)) >= sampler.max_model_len:
                reason = f"prompt has {length} tokens; the model's context length is {sampler.max_model_len}"
                too_long.append(length)
            if reason is not None:
                reasons[(record["id"], tag)] = reason
    if too_long and len(too_long) == tried:
        _refuse_if_none_fits(records, sampler, variants, min(too_long))
    return reasons


def _length(sampler: Sampler, record: Mapping[str, Any], conversation: Sequence[Mapping[str, Any]]) -> int:
    """The prompt's tokens as the sampler sends them.

    A prompt the chat format cannot render (an unknown role, content that is not text,
    tools that are not a list) is an error naming the record and the field.
    """
    try:
        return sampler.prompt_length(conversation, record.get("tools"))
    except InputError as err:
        field = "tools" if str(err).startswith("tool") else "messages"
        raise RecordError(record_id(record), field, f"cannot be rendered: {err}") from None


def _refuse_if_none_fits(records: Sequence[Mapping[str, Any]] | Any, sampler: Sampler, variants: Any,
                         shortest: int) -> None:
    """Every prompt of this shard fills the context: unless a prompt of another shard fits, nothing of the
    job would be sampled, and a stage "complete" with every prompt skipped hides a context length set wrong
    (a server started with a small ``--max-model-len``). Then it is an error naming the limit and the
    shortest prompt, before anything is written."""
    limit = sampler.max_model_len
    for record in records:
        if skip_reason(record) is not None:
            continue
        for _, conversation in variants(record):
            length = _length(sampler, record, conversation)
            if length < limit:
                return
            shortest = min(shortest, length)
    source = getattr(sampler, "context_source", "the model's context length")
    raise InputError(f"every prompt is too long for the context length of {limit} tokens ({source}): the "
                     f"shortest has {shortest} tokens, so nothing would be sampled; give the model a longer "
                     "context (a server: vllm serve --max-model-len), or shorter prompts")


def _all_dropped(n: int, max_tokens: int) -> str:
    return f"all {n} completions ran past max_tokens={max_tokens} and overlong=drop removed them"


def _keep(completions: list[Completion], overlong: Overlong) -> tuple[list[Completion], int]:
    """Apply the overlong policy; return what is kept and how many hit the budget."""
    num_overlong = sum(c.finish_reason == "length" for c in completions)
    if overlong == "drop":
        completions = [c for c in completions if c.finish_reason != "length"]
    return completions, num_overlong


def sample_references(
    prompts: Sequence[Mapping[str, Any]] | Any,
    sampler: Sampler,
    *,
    output_dir: str | Path,
    n: int = 10,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 4096,
    seed: int = 0,
    overlong: Overlong = "flag",
    shard_index: int = 0,
    num_shards: int = 1,
    batch_size: int = 16,
) -> dict[str, int]:
    """Sample ``n`` reference completions per prompt from the policy (docs/method.md, Reference completions).

    Completions get ``is_reference=True`` and a ``source`` naming the model and the
    sampling parameters. Returns counts over the output written so far (all shards).
    """
    _check_overlong(overlong)
    validate_all(prompts, validate_prompt)
    skipped = preflight(prompts, sampler, lambda r: [("", r["messages"])], shard_index, num_shards)

    def process(batch: list[dict]) -> list[dict]:
        skips = {r["id"]: skipped.get((r["id"], "")) for r in batch}
        todo = [r for r in batch if skips[r["id"]] is None]  # skip rows never reach here (passing_skips)
        drawn = sampler.sample(
            [r["messages"] for r in todo], n, temperature=temperature, top_p=top_p,
            max_tokens=max_tokens, seed=[derive_seed(seed, r["id"]) for r in todo],
            tools=[r.get("tools") for r in todo],
        ) if todo else []
        by_id = dict(zip((r["id"] for r in todo), drawn))
        for index, reason in (sampler.refusals if todo else {}).items():  # a server refused it: skipped
            skips[todo[index]["id"]] = reason
        out = []
        for record in batch:
            row = {**record, "completions": _existing_completions(record), "num_overlong": 0,
                   "num_ref_dropped": record.get("num_ref_dropped") or 0}
            if skips[record["id"]] is not None:
                row["skip_reason"] = skips[record["id"]]
            else:
                kept, row["num_overlong"] = _keep(by_id[record["id"]], overlong)
                row["num_ref_dropped"] += len(by_id[record["id"]]) - len(kept)
                row["completions"] += [c.to_record(is_reference=True, seed=seed) for c in kept]
                if not row["completions"]:
                    row["skip_reason"] = _all_dropped(len(by_id[record["id"]]), max_tokens)
            out.append(row)
        return out

    fingerprint = {
        "stage": "sample_references", "model": sampler.model_name, "backend": sampler.backend,
        "chat_format": sampler.encoder.chat_format, "n": n, "temperature": temperature,
        "top_p": top_p, "max_tokens": max_tokens, "seed": seed, "overlong": overlong,
    }
    run_job(
        prompts, passing_skips(process), output_dir, shard_index=shard_index, num_shards=num_shards,
        batch_size=batch_size, sort_key=_prompt_chars, desc="reference completions",
        fingerprint=fingerprint,
    )
    return sampling_summary(output_dir, is_reference=True)


def with_system_prompt(messages: Sequence[Mapping[str, Any]], prompt: SystemPrompt) -> list[dict]:
    """The conversation with the family's system prompt; a record's own system text follows it."""
    messages = [dict(m) for m in messages]
    if messages and messages[0]["role"] == "system":
        own = messages[0]["content"]
        own_text = own.get("text") if isinstance(own, Mapping) else own
        if not isinstance(own_text, str):
            raise InputError(f"system message content must be a string or {{'text': str}}, got {own!r}")
        messages[0] = {"role": "system", "content": f"{prompt.text}\n\n{own_text}"}
        return messages
    return [{"role": "system", "content": prompt.text}] + messages


UNCLASSIFIED = ("error", "persona", "attribute")


def _controversial(record: Mapping[str, Any], field: str, on_unclassified: str) -> bool:
    """The record's controversy flag; ``None`` (the classifier failed) per ``on_unclassified``.

    ``error`` stops with the record named; ``persona`` treats it as controversial (the
    cautious choice), ``attribute`` as not controversial.
    """
    value = record.get(field, False)
    if value is None and on_unclassified != "error":
        return on_unclassified == "persona"
    if not isinstance(value, bool):
        hint = " (the classifier could not label it: set on_unclassified=persona|attribute)" if value is None else ""
        raise RecordError(record["id"], field, f"expected true/false (set by the classifier), got {value!r}{hint}")
    return value


def offline_variants(
    record: Mapping[str, Any],
    *,
    seed: int,
    controversial_field: str = "controversial",
    default_prompt: bool = True,
    charter_persona: bool = False,
    personas: Sequence[str] = DEFAULT_PERSONAS,
    on_unclassified: str = "error",
) -> list[tuple[str, list[dict]]]:
    """(system prompt tag, conversation) pairs to sample for one record (report §E.2).

    Non-controversial: one attribute prompt (truthful/helpful/honest, drawn uniformly,
    then one of its prompts), plus the unchanged conversation when ``default_prompt``.
    Controversial: one persona prompt. Either: the charter persona when ``charter_persona``.
    """
    controversial = _controversial(record, controversial_field, on_unclassified)
    drawn = draw_system_prompt(record["id"], controversial=controversial, seed=seed, personas=personas)
    variants = [(drawn.tag, with_system_prompt(record["messages"], drawn))]
    if default_prompt and not controversial:
        variants.append(("default", [dict(m) for m in record["messages"]]))
    if charter_persona:
        charter = charter_prompt()
        variants.append((charter.tag, with_system_prompt(record["messages"], charter)))
    return variants


def sample_offline(
    prompts: Sequence[Mapping[str, Any]] | Any,
    sampler: Sampler,
    *,
    output_dir: str | Path,
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 4096,
    seed: int = 0,
    overlong: Overlong = "flag",
    controversial_field: str = "controversial",
    default_prompt: bool = True,
    charter_persona: bool = False,
    personas: Sequence[str] = DEFAULT_PERSONAS,
    on_unclassified: str = "error",
    shard_index: int = 0,
    num_shards: int = 1,
    batch_size: int = 16,
) -> dict[str, int]:
    """Offline completions from another model, steered by the system-prompt families.

    ``n`` completions per variant (see `offline_variants`), temperature 1 by default;
    ``is_reference=False`` and ``source`` names the model, the parameters and the system
    prompt (``system_prompt=truthful/3``, ``persona/17``, ``default``, ``charter/0``).
    Run it once per offline model, each into its own ``output_dir``.
    """
    _check_overlong(overlong)
    validate_all(prompts, validate_prompt)
    if on_unclassified not in UNCLASSIFIED:
        raise ConfigError(f"on_unclassified={on_unclassified!r}: choose one of {list(UNCLASSIFIED)}")
    options = {"seed": seed, "controversial_field": controversial_field, "personas": personas,
               "default_prompt": default_prompt, "charter_persona": charter_persona,
               "on_unclassified": on_unclassified}
    for record in prompts:  # bad flags fail now, not hours into the job (a skip row is passed on as it came)
        if skip_reason(record) is None:
            _controversial(record, controversial_field, on_unclassified)
    skipped = preflight(prompts, sampler, lambda r: offline_variants(r, **options), shard_index, num_shards)

    def process(batch: list[dict]) -> list[dict]:
        jobs = []  # (record id, tag, conversation)
        skips: dict[str, dict[str, str]] = {r["id"]: {} for r in batch}  # id -> {variant tag: why not sampled}
        for record in batch:
            for tag, conversation in offline_variants(record, **options):
                reason = skipped.get((record["id"], tag))
                if reason is not None:
                    skips[record["id"]][tag] = reason
                    continue
                jobs.append((record, tag, conversation))
        drawn = sampler.sample(
            [conv for _, _, conv in jobs], n, temperature=temperature, top_p=top_p,
            max_tokens=max_tokens, seed=[derive_seed(seed, r["id"], tag) for r, tag, _ in jobs],
            tools=[r.get("tools") for r, _, _ in jobs],
        ) if jobs else []
        for index, reason in (sampler.refusals if jobs else {}).items():  # a server refused it: skipped
            record, tag, _ = jobs[index]
            skips[record["id"]][tag] = reason
        new: dict[str, list[dict]] = {r["id"]: [] for r in batch}
        overlong_counts = {r["id"]: 0 for r in batch}
        for (record, tag, _), completions in zip(jobs, drawn):
            kept, count = _keep(completions, overlong)
            overlong_counts[record["id"]] += count
            new[record["id"]] += [c.to_record(is_reference=False, seed=seed, system_prompt=tag) for c in kept]
        out = []
        for record in batch:
            row = {**record, "completions": _existing_completions(record) + new[record["id"]],
                   "num_overlong": overlong_counts[record["id"]]}
            missed = skips[record["id"]]
            if missed:
                row["skipped_variants"] = missed
            if not row["completions"]:  # nothing to score for this prompt: a skip row, with the first reason
                tag, reason = next(iter(missed.items())) if missed else ("", _all_dropped(n, max_tokens))
                row["skip_reason"] = f"{tag}: {reason}" if tag else reason
            out.append(row)
        return out

    fingerprint = {
        "stage": "sample_offline", "model": sampler.model_name, "backend": sampler.backend,
        "chat_format": sampler.encoder.chat_format, "n": n, "temperature": temperature,
        "top_p": top_p, "max_tokens": max_tokens, "seed": seed, "overlong": overlong,
        "controversial_field": controversial_field, "default_prompt": default_prompt,
        "charter_persona": charter_persona, "num_personas": len(personas), "on_unclassified": on_unclassified,
    }
    run_job(
        prompts, passing_skips(process), output_dir, shard_index=shard_index, num_shards=num_shards,
        batch_size=batch_size, sort_key=_prompt_chars, desc="offline completions",
        fingerprint=fingerprint,
    )
    return sampling_summary(output_dir, is_reference=False)


def sampling_summary(output_dir: str | Path, *, is_reference: bool) -> dict[str, int]:
    """Counts over a sampling output: records, new completions, overlong, skipped prompts."""
    rows = read_output(output_dir)
    summary = {
        "records": len(rows),
        "completions": sum(
            sum(c.get("is_reference") is is_reference for c in r.get("completions", [])) for r in rows
        ),
        "overlong": sum(r.get("num_overlong", 0) for r in rows),
        "skipped_prompts": sum(skip_reason(r) is not None for r in rows),
    }
    if not is_reference:  # offline: the system-prompt variants that could not be sampled while others were
        summary["skipped_variants"] = sum(len(r.get("skipped_variants") or {}) for r in rows)
    return summary
