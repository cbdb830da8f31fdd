"""Chosen/rejected selection per prompt from quantile rewards (docs/method.md, Pair selection; Apertus report §3.4).

Buckets by R_q against the n reference rewards (docs/method.md, Quantile rewards; ties count for the candidate):

- high:   R_q = 1, the reward is ≥ every reference reward;
- low:    R_q ≤ max(low_threshold, 1/n), "below the 20th percentile"; the 1/n floor keeps
          the worst reference eligible when n < 5 (it always has R_q ≥ 1/n);
- middle: the rest.

The report says chosen completions are "higher than all the on-policy completions". With
the ≤ convention R_q = 1 also admits a tie with the best reference; we keep that choice,
because with binary rewards (9 of 10 references correct) a strict "higher" leaves no
chosen candidate at all. Whether a bucket is usable also needs a real preference: chosen
must have a reward above the prompt's lowest, rejected a reward below chosen's. So chosen
and rejected are always different completions with different rewards. An empty bucket
falls back to the next (chosen: high → middle → low; rejected: low → middle → high) and
the fallback is recorded; a prompt with no preference at all is a recorded skip.
Selection on R_q, not on an interpolated percentile of raw rewards, keeps a correct answer
from being picked as rejected on binary rewards.

Completions cut at the token budget (``finish_reason`` "length") never ended their turn;
by default (``truncated="exclude"``) they are neither chosen nor rejected but still count
as references. ``num_pairs_per_prompt`` > 1 draws further pairs from the completions not
yet used by the prompt's earlier pairs, by the same rules (rejected uniformly from the
low bucket, as the Apertus report describes).

A completion whose text holds a token string of the chat format's structure (a turn
delimiter such as ``<|system_end|>``, the BOS; `special_token_problem`, the check
``align.chat.encode_completion`` refuses with) cannot be encoded by the log-prob pass or
the trainer: it is never chosen or rejected (its reward still counts as a reference), and
the prompt's skip row lists each one (``left_out``: its index and the reason
``special_token_text``), a prompt that still gave a pair included (``paired``: true).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from align.chat.formats import get_format
from align.chat.template import TOKENIZER_FORMAT
from align.data.quantiles import quantile_rewards
from align.data.records import skip_reason, skip_row_id, validate_rewards, with_completion_defaults
from align.errors import ConfigError, InputError, RecordError

__all__ = ["TRUNCATED_POLICIES", "Pair", "Skip", "is_truncated", "make_pairs", "select_pair",
           "special_token_problem"]

SPECIAL_TOKEN_TEXT = "special_token_text"

CHOSEN_ORDER = ("high", "middle", "low")
REJECTED_ORDER = ("low", "middle", "high")
TRUNCATED_POLICIES = ("exclude", "train_without_end")
TRUNCATED_FINISH_REASON = "length"


@dataclass(frozen=True)
class Pair:
    """Indices of the chosen and rejected completions; ``fallback`` says which bucket rule bent."""

    chosen: int
    rejected: int
    fallback: str | None = None


@dataclass(frozen=True)
class Skip:
    """A prompt that yields no pair, and why (recorded, never silently dropped)."""

    reason: str


def _bucket(quantile: float, low_cut: float) -> str:
    """The bucket of one R_q; high wins where the buckets would overlap (n = 1)."""
    if quantile >= 1.0:
        return "high"
    return "low" if quantile <= low_cut else "middle"


def _check_inputs(
    rewards: Sequence[float | None],
    quantiles: Sequence[float | None],
    num_ref_rewards: int,
    low_threshold: float,
) -> None:
    """Rewards and quantiles line up, are real numbers, and are None together."""
    if isinstance(num_ref_rewards, bool) or not isinstance(num_ref_rewards, int) or num_ref_rewards < 1:
        raise ConfigError(f"num_ref_rewards must be a positive int, got {num_ref_rewards!r}")
    if not 0.0 <= low_threshold < 1.0:
        raise ConfigError(f"low_threshold must be in [0, 1), got {low_threshold}")
    if len(rewards) != len(quantiles):
        raise InputError(f"quantiles has {len(quantiles)} entries, rewards has {len(rewards)}")
    for i, (reward, quantile) in enumerate(zip(rewards, quantiles)):
        if (reward is None) != (quantile is None):
            raise InputError(f"rewards[{i}] and quantiles[{i}] must both be None or both set")
        if reward is not None and math.isnan(reward):
            raise InputError(f"rewards[{i}] is NaN")
        if quantile is not None and not 0.0 <= quantile <= 1.0:
            raise InputError(f"quantiles[{i}] = {quantile} is outside [0, 1]")


REJECTED_PICKS = ("uniform", "highest")


def _pick(
    order: Sequence[str], buckets: dict[str, list[int]], side: str, rng: random.Random,
    highest_of: Sequence[float | None] | None = None,
) -> tuple[int, str | None]:
    """A uniform draw from the first non-empty bucket in ``order``, and the fallback taken; with
    ``highest_of`` (a quantile per completion), the draw is among that bucket's highest."""
    for name in order:
        pool = buckets[name]
        if pool:
            if highest_of is not None:
                best = max(highest_of[i] for i in pool)
                pool = [i for i in pool if highest_of[i] == best]
            fallback = None if name == order[0] else f"{side}:{name}"
            return rng.choice(pool), fallback
    raise AssertionError("unreachable: callers ensure some bucket is non-empty")


def select_pair(
    rewards: Sequence[float | None],
    quantiles: Sequence[float | None],
    *,
    num_ref_rewards: int,
    rng: random.Random | None = None,
    seed: int | str | None = None,
    low_threshold: float = 0.2,
    rejected_pick: str = "uniform",
) -> Pair | Skip:
    """Pick chosen and rejected completions of one prompt by docs/method.md, Pair selection (see module docstring).

    ``rewards``/``quantiles``: one per completion, None for a completion that could not be
    scored (it is not a candidate). ``num_ref_rewards``: how many reference rewards the quantiles
    were computed against. Give exactly one of ``rng`` and ``seed``. ``rejected_pick``:
    ``uniform`` (the report: a draw from the low bucket) or ``highest`` (the published code: the
    low bucket's highest quantile).
    """
    if rejected_pick not in REJECTED_PICKS:
        raise ConfigError(f"rejected_pick: {rejected_pick!r} is not one of {list(REJECTED_PICKS)}")
    if (rng is None) == (seed is None):
        raise ConfigError("pass exactly one of rng and seed (pair selection is seeded)")
    rng = rng if rng is not None else random.Random(seed)
    _check_inputs(rewards, quantiles, num_ref_rewards, low_threshold)
    scored = [i for i, reward in enumerate(rewards) if reward is not None]
    if len(scored) < 2:
        return Skip(f"fewer than 2 scored completions ({len(scored)})")
    lowest = min(rewards[i] for i in scored)
    if all(rewards[i] == lowest for i in scored):
        return Skip(f"all {len(scored)} scored completions have the same reward: no preference")

    low_cut = max(low_threshold, 1.0 / num_ref_rewards)
    by_bucket: dict[str, list[int]] = {"high": [], "middle": [], "low": []}
    for i in scored:
        by_bucket[_bucket(quantiles[i], low_cut)].append(i)

    chosen_pool = {
        name: [i for i in pool if rewards[i] > lowest] for name, pool in by_bucket.items()
    }
    chosen, chosen_fallback = _pick(CHOSEN_ORDER, chosen_pool, "chosen", rng)
    rejected_pool = {
        name: [i for i in pool if rewards[i] < rewards[chosen]] for name, pool in by_bucket.items()
    }
    rejected, rejected_fallback = _pick(REJECTED_ORDER, rejected_pool, "rejected", rng,
                                        quantiles if rejected_pick == "highest" else None)
    fallbacks = [f for f in (chosen_fallback, rejected_fallback) if f is not None]
    return Pair(chosen, rejected, ";".join(fallbacks) or None)


def _num_ref_dropped(record: Mapping[str, Any], rid: str) -> int:
    """How many reference samples sampling removed with ``overlong=drop`` (0 when not recorded)."""
    dropped = record.get("num_ref_dropped")
    if dropped is None:
        return 0
    if isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0:
        raise RecordError(rid, "num_ref_dropped", f"expected a count >= 0, got {dropped!r}")
    return dropped


def _reference_rewards(
    record: Mapping[str, Any], rid: str, num_ref_rewards: int | None, dropped: int
) -> tuple[list[float], int]:
    """The scored reference rewards of a record and how many references it has.

    ``num_ref_rewards`` is the number of references drawn; a row whose sampling dropped some of them
    (``overlong=drop``, counted in ``num_ref_dropped``) must hold ``num_ref_rewards - num_ref_dropped``.
    """
    refs = [i for i, c in enumerate(record["completions"]) if c["is_reference"]]
    if not refs:
        raise RecordError(
            rid,
            "completions",
            "no completion has is_reference=True; quantile rewards need the reference samples",
        )
    if num_ref_rewards is not None:
        if dropped > num_ref_rewards:
            raise RecordError(
                rid, "num_ref_dropped", f"is {dropped}, more than the num_ref_rewards={num_ref_rewards} references drawn"
            )
        if len(refs) != num_ref_rewards - dropped:
            problem = f"{len(refs)} reference completions, expected num_ref_rewards={num_ref_rewards}"
            if dropped:
                problem += (
                    f" minus num_ref_dropped={dropped} (removed by sampling with overlong=drop) "
                    f"= {num_ref_rewards - dropped}"
                )
            raise RecordError(rid, "completions", problem)
    scored = [float(record["rewards"][i]) for i in refs if record["rewards"][i] is not None]
    return scored, len(refs)


def is_truncated(completion: Mapping[str, Any]) -> bool:
    """A completion cut at the token budget (``finish_reason`` "length"): it never ended its turn."""
    return completion.get("finish_reason") == TRUNCATED_FINISH_REASON


def special_token_problem(text: str, chat_format: str) -> str | None:
    """Why a completion text cannot be trained on in ``chat_format``, or None.

    The same rule ``align.chat.encode_completion`` applies (and the log-prob pass and the
    trainer through it): the text may not contain a token string the format reads as
    structure (its turn delimiters and BOS, ``ChatFormat.forbidden_in_text``), nor end with
    its end-of-turn token. Markup a completion may carry (tool calls, thoughts) is allowed.
    Needs no tokenizer: the strings come from the format's definition in ``align.chat``.
    """
    if chat_format == TOKENIZER_FORMAT:
        return None  # the tokenizer's special tokens: the pass and the trainer check them, holding the tokenizer
    fmt = get_format(chat_format)
    for token in fmt.forbidden_in_text:
        if token in text:
            return f"{SPECIAL_TOKEN_TEXT}: contains {token!r}, which the {fmt.name} format reads as structure"
    if text.endswith(fmt.eos):
        return f"{SPECIAL_TOKEN_TEXT}: ends with the end-of-turn token {fmt.eos!r}"
    return None


def pair_row_id(rid: str, k: int) -> str:
    """The id of a prompt's k-th pair (0-based): the prompt id for the first, ``id#2``... after."""
    return rid if k == 0 else f"{rid}#{k + 1}"


def _pair_or_skip(
    record: Mapping[str, Any],
    rid: str,
    *,
    seed: int | str,
    low_threshold: float,
    num_ref_rewards: int | None,
    min_ref_rewards: int | None,
    truncated: str,
    num_pairs_per_prompt: int,
    chat_format: str | None,
    rejected_pick: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One record's pair rows (up to ``num_pairs_per_prompt``), or its one skip row ``{"id", "reason"}``;
    and the completions left out for their text (``{"completion", "reason"}``)."""
    dropped = _num_ref_dropped(record, rid)
    if dropped and not any(c["is_reference"] for c in record["completions"]):
        return [{"id": rid, "reason": f"all {dropped} reference samples were dropped as overlong "
                 "(sampling overlong=drop, num_ref_dropped)"}], []
    ref_rewards, num_refs = _reference_rewards(record, rid, num_ref_rewards, dropped)
    needed = num_refs if min_ref_rewards is None else min_ref_rewards
    if len(ref_rewards) < max(needed, 1):
        return [{
            "id": rid,
            "reason": f"only {len(ref_rewards)} of {num_refs} reference rewards scored "
            f"(min_ref_rewards={needed})",
        }], []
    rewards = record["rewards"]
    completions = record["completions"]
    scored = [i for i, r in enumerate(rewards) if r is not None]
    quantiles: list[float | None] = [None] * len(rewards)
    for i, q in zip(scored, quantile_rewards([rewards[i] for i in scored], ref_rewards)):
        quantiles[i] = q
    # Truncated completions still count as references above (their rewards shape the
    # quantiles); with truncated="exclude" they are never chosen or rejected.
    excluded = {i for i in scored if truncated == "exclude" and is_truncated(completions[i])}
    # Completions the trainer cannot encode are never picked either (still references).
    unencodable = [] if chat_format is None else [
        {"completion": i, "reason": problem} for i in scored
        if (problem := special_token_problem(completions[i]["text"], chat_format))]
    num_truncated = len(excluded)
    excluded |= {row["completion"] for row in unencodable}
    rng = random.Random(f"{seed}:{rid}")
    used: set[int] = set()
    rows: list[dict[str, Any]] = []
    for k in range(num_pairs_per_prompt):
        off = excluded | used
        choice = select_pair(
            [None if i in off else r for i, r in enumerate(rewards)],
            [None if i in off else q for i, q in enumerate(quantiles)],
            num_ref_rewards=len(ref_rewards),
            rng=rng,
            low_threshold=low_threshold,
            rejected_pick=rejected_pick,
        )
        if isinstance(choice, Skip):
            if k > 0:  # the buckets hold no further pair without reusing a completion
                break
            reason = choice.reason
            if num_truncated:
                reason += f" ({num_truncated} truncated completions excluded, truncated=exclude)"
            if unencodable:
                reason += f" ({len(unencodable)} completions excluded: {SPECIAL_TOKEN_TEXT})"
            return [{"id": rid, "reason": reason, **({"left_out": unencodable} if unencodable else {})}], []
        used |= {choice.chosen, choice.rejected}
        rows.append({
            "id": pair_row_id(rid, k),
            "messages": record["messages"],
            "chosen": completions[choice.chosen]["text"],
            "rejected": completions[choice.rejected]["text"],
            "chosen_reward": float(rewards[choice.chosen]),
            "rejected_reward": float(rewards[choice.rejected]),
            "chosen_quantile": quantiles[choice.chosen],
            "rejected_quantile": quantiles[choice.rejected],
            "num_ref_rewards": len(ref_rewards),
            "pair_fallback": choice.fallback,
            "chosen_finish_reason": completions[choice.chosen]["finish_reason"],
            "rejected_finish_reason": completions[choice.rejected]["finish_reason"],
            "num_ref_dropped": dropped,
            # the tool declarations the completions were sampled with: the trainer and the
            # log-prob pass render the prompt with them (align.scoring.encode_record)
            **({"tools": record["tools"]} if record.get("tools") else {}),
        })
    return rows, unencodable


def make_pairs(
    records: Iterable[Mapping[str, Any]],
    *,
    seed: int | str,
    low_threshold: float = 0.2,
    num_ref_rewards: int | None = None,
    min_ref_rewards: int | None = None,
    truncated: str = "exclude",
    num_pairs_per_prompt: int = 1,
    chat_format: str | None = "apertus",
    rejected_pick: str = "uniform",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pair rows (``records.PAIR_FIELDS``) and skip rows ``{"id", "reason"}`` for prompt records.

    Quantiles are taken against the rewards of the ``is_reference`` completions; every
    scored completion (reference or offline) is a candidate. ``num_ref_rewards``: if set, each record
    must have exactly that many references. ``min_ref_rewards``: how many of them must be
    scored (default: all), else the record is skipped with the reason. Each record draws
    from its own RNG seeded by (seed, id), so the result does not depend on record order or
    sharding. A malformed record raises ``RecordError`` naming the record and the field.

    ``num_ref_rewards`` counts the references drawn: a record whose sampling dropped overlong
    references (``num_ref_dropped``) must hold ``num_ref_rewards - num_ref_dropped`` of them.
    ``truncated``: what to do with completions cut at the token budget (``finish_reason``
    "length"): ``"exclude"`` (default) never picks them as chosen or rejected, though their
    rewards still count as references for the quantiles; ``"train_without_end"`` lets them
    be picked, and the trainer then scores them without an end-of-turn token (its own
    ``truncated`` setting). Pair rows carry ``chosen_finish_reason`` and
    ``rejected_finish_reason`` either way.
    ``num_pairs_per_prompt``: up to this many pairs per prompt, each drawn as the first
    from the completions no earlier pair of the prompt used (a completion is never reused
    within a prompt); pair k > 1 gets the id ``<id>#k``. The first pair is the one
    ``num_pairs_per_prompt=1`` gives.
    A skip row (``skip_reason``: sampling could not make the prompt's completions) gives the
    skip row ``{"id", "reason": its skip_reason, "upstream": true}``.
    ``chat_format``: the format the log-prob pass and the trainer will encode the pairs in
    (an ``align.chat`` format; None: no check). A completion whose text that format cannot
    encode (``special_token_problem``: a turn delimiter or BOS in the text) is never picked;
    the prompt's skip row lists them in ``left_out`` (``{"completion": index, "reason":
    "special_token_text: ..."}``); a prompt that still gave a pair gets a skip row too,
    marked ``paired: true`` (one skip row per prompt id).
    """
    if chat_format is not None and chat_format != TOKENIZER_FORMAT:
        get_format(chat_format)  # an unknown format is an error before any record is read
    if truncated not in TRUNCATED_POLICIES:
        raise ConfigError(f"truncated must be one of {list(TRUNCATED_POLICIES)}, got {truncated!r}")
    if (
        isinstance(num_pairs_per_prompt, bool)
        or not isinstance(num_pairs_per_prompt, int)
        or num_pairs_per_prompt < 1
    ):
        raise ConfigError(f"num_pairs_per_prompt must be a positive int, got {num_pairs_per_prompt!r}")
    if num_ref_rewards is not None and (isinstance(num_ref_rewards, bool) or not isinstance(num_ref_rewards, int)
                                        or num_ref_rewards < 1):
        raise ConfigError(f"num_ref_rewards={num_ref_rewards!r}: the number of reference completions drawn per "
                          "prompt must be an int >= 1 (or None: not checked)")
    if min_ref_rewards is not None and (
        isinstance(min_ref_rewards, bool)
        or not isinstance(min_ref_rewards, int)
        or min_ref_rewards < 1
    ):
        raise ConfigError(f"min_ref_rewards must be a positive int or None, got {min_ref_rewards!r}")
    pairs: list[dict[str, Any]] = []
    skips: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    pair_ids: set[str] = set()
    for index, record in enumerate(records):
        upstream = skip_reason(record)
        if upstream is not None:  # a stage before could not make this row: recorded here with its reason
            rid = skip_row_id(record, index)
            if rid in seen:
                raise RecordError(rid, "id", f"duplicate id (rows {seen[rid]} and {index})")
            seen[rid] = index
            skips.append({"id": rid, "reason": upstream, "upstream": True})
            continue
        validate_rewards(record, index)
        record = with_completion_defaults(record)
        # numpy / torch scalars and ints read as floats; validate_rewards made sure of the id
        record = {**record, "rewards": [None if r is None else float(r) for r in record["rewards"]]}
        rid = record["id"]
        if rid in seen:
            raise RecordError(rid, "id", f"duplicate id (rows {seen[rid]} and {index})")
        seen[rid] = index
        rows, left_out = _pair_or_skip(
            record,
            rid,
            seed=seed,
            low_threshold=low_threshold,
            num_ref_rewards=num_ref_rewards,
            min_ref_rewards=min_ref_rewards,
            truncated=truncated,
            num_pairs_per_prompt=num_pairs_per_prompt,
            chat_format=chat_format,
            rejected_pick=rejected_pick,
        )
        if left_out:
            skips.append({"id": rid, "reason": f"{SPECIAL_TOKEN_TEXT}: {len(left_out)} completions left out; "
                          "the prompt was still paired", "left_out": left_out, "paired": True})
        if "reason" in rows[0]:
            skips.extend(rows)
            continue
        for row in rows:
            if row["id"] in pair_ids:
                raise RecordError(rid, "id", f"pair id {row['id']!r} is taken by another prompt's pair: "
                                  "rename the prompt or set num_pairs_per_prompt=1")
            pair_ids.add(row["id"])
        pairs.extend(rows)
    return pairs, skips


def fallback_note(fallbacks: int, pairs: int, kinds: Mapping[str, int]) -> str:
    """What the pair fallbacks are, and that they are no defect: a completion tied with other
    references (a 0/1 reward, or the same text sampled several times under any reward) sits
    above the low bucket's cut. ``kinds``: how
    many of each ``pair_fallback`` (the demo's summary and ``align pairs`` print it)."""
    listed = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"({fallbacks} of the {pairs} pairs are fallbacks ({listed}): the preferred bucket was empty, so the "
            "next was used. Expected when references tie (a 0/1 reward, or one text sampled several times): a "
            "completion tied with others has a quantile above the low cut; every pair still prefers the higher "
            "reward (docs/method.md, Pair selection).)")
