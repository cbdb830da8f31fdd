"""`evaluate`: several policies on the same prompts, scored, compared to a baseline, with CIs.

The steps, each a resumable job (``align.jobs``) under ``output_dir`` so that a killed
evaluation restarts where it stopped and ends exactly as an uninterrupted one:

1. ``generations/<policy>``: per prompt, a greedy completion and ``n`` samples at
   ``temperature`` from each policy's sampler (or completions given in its place);
2. ``scores/<policy>``: every completion scored by one reward provider (reward model,
   judge pointwise, verifiable answers);
3. ``pairwise/<policy>``: with the constitutional judge, each policy's completions
   against the baseline's, asked in both orders;
4. ``kl/<policy>``: log π − log π_ref of each sample (see `align.eval.kl`).

One engine holds the GPUs at a time: each policy's sampler is built, generates and is
released (engine dropped, garbage collected, CUDA cache emptied) before the next; the reward
provider, given as a function, is built only after every policy has generated, scores and
compares, and is released before the KL step loads models.

Then ``eval.jsonl`` (one row per prompt: completions, scores, comparisons), ``report.json``,
``report.md`` and the plots are written from the job outputs, so they are the same after
any number of restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.bootstrap import check_resamples
from align.data.records import record_id, validate_prompt
from align.errors import ConfigError, InputError, RecordError
from align.eval import stats
from align.eval.rescore import DIGEST_FIELD, prompt_digest
from align.eval.summary import BREAKDOWN_COLUMNS, build_report
from align.io import job_is_complete, read_output
from align.jobs import run_job
from align.sampling.base import Sampler, SampleRequest, derive_seed
from align.scoring.sharded import check_sharding


@dataclass
class EvalPolicy:
    """One policy: a sampler to generate with, or completions generated before.

    name:        the label in every table (unique).
    sampler:     generates greedy and sampled completions (transformers or vLLM); or a
                 function that builds one, called when this policy's turn comes and
                 released after (so one engine at a time holds the GPU).
    completions: records with ``id``, the prompt's ``messages`` and ``completions`` (a
                 ``sample`` stage output, a list, or a path), used in place of a sampler:
                 their first ``n`` completions are the samples (fewer is an error, and so
                 is a prompt other than the held-out one); there is no greedy completion.
    model:       the causal LM for KL estimates, or a function that builds one (called at
                 the KL step, released after it: a model loaded from the policy's path,
                 whole or partitioned over ranks, ``align.scoring.sharded``); default the
                 sampler's model when it has one in memory (transformers backend).
    tokenizer:   the tokenizer of that model (the KL step reads its pad token and checks
                 it against the reference's); default the sampler's.
    """

    name: str
    sampler: Sampler | Callable[[], Sampler] | None = None
    completions: Sequence[Mapping[str, Any]] | str | Path | None = None
    model: Any = None
    tokenizer: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ConfigError(f"policy name {self.name!r}: a non-empty name without '/'")
        if (self.sampler is None) == (self.completions is None):
            raise ConfigError(f"policy {self.name!r}: give exactly one of sampler and completions")
        self._built: Sampler | None = None
        self._built_model: Any = None

    @property
    def generates(self) -> bool:
        return self.sampler is not None

    def open(self) -> Sampler:
        """The sampler, built now if it was given as a function."""
        if isinstance(self.sampler, Sampler):
            return self.sampler
        if self._built is None:
            self._built = self.sampler()  # type: ignore[misc]
        return self._built

    def release(self) -> None:
        """Drop a sampler (and a KL model) this policy built, so their memory (a GPU's) is freed."""
        if self._built is not None or self._built_model is not None:
            for engine in (self._built, self._built_model):  # a partitioned model lets its partitions go
                if engine is not None:
                    close_engine(engine)
            self._built = self._built_model = None
            free_device_memory()

    @property
    def builds_kl_model(self) -> bool:
        """The KL model comes from a function (loaded from a path at the KL step), not a sampler."""
        return self.model is not None and callable(self.model) and not hasattr(self.model, "parameters")

    def kl_model(self) -> Any:
        """The causal LM whose log-probs the KL estimate reads (built now if given as a function;
        else the sampler's, if in memory)."""
        if self.builds_kl_model:
            if self._built_model is None:
                self._built_model = self.model()
            return self._built_model
        return self.model if self.model is not None else getattr(self.open(), "model", None)

    def kl_tokenizer(self) -> Any:
        """The KL model's tokenizer: the one given, else the sampler's."""
        return self.tokenizer if self.tokenizer is not None else self.open().encoder.tokenizer


def close_engine(engine: Any) -> None:
    """Let an engine holder drop its engine (``close()``: a vLLM sampler or judge deletes its
    ``vllm.LLM`` there); one without ``close`` is freed when its last reference goes."""
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def free_device_memory() -> None:
    """After the last reference to an engine is dropped: collect it, empty the CUDA cache."""
    import gc

    gc.collect()
    _empty_device_cache()


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _is_provider(provider: Any) -> bool:
    """A reward provider itself, not a function that builds one."""
    return hasattr(provider, "score_groups")


@dataclass
class EvalSettings:
    """How completions are drawn, compared and summarised.

    greedy / n / temperature / top_p / max_tokens / seed: generation. Each prompt's draws
        are seeded by (seed, prompt id), so every policy gets the same random streams.
    judge_pairwise: with the constitutional judge, also compare each policy's completions
        with the baseline's head to head (both orders); ``pairwise_samples`` sampled pairs
        per prompt besides the greedy pair.
    kl: estimate KL(π‖π_ref) for each policy with a model, against ``kl_reference``
        (default: the baseline); needs temperature 1 and top_p 1.
    kl_sharding: how the KL step holds the models (docs/sharded-passes.md); the estimates
        do not depend on it. ``replicate``: each process holds whole models (the
        transformers sampler's own, or with ``kl_only`` models loaded from the policies'
        paths). ``zero3``: loaded from the policies' paths, partitioned over the ranks of a
        distributed launch (DeepSpeed ZeRO-3), for models too large for one device; the
        evaluation then leaves the KL step to a launch of its own, ``kl_only=true``.
    kl_only: run only the KL step, over generations already complete (no sampler and no
        reward provider is built; ``align evaluate`` loads the models from the policies'
        paths, a Python caller gives each ``EvalPolicy`` a ``model`` function and its
        ``tokenizer``). Then run the evaluation once more without it: it finds every job
        done and writes the report.
    tie_margin: judge preferences within this distance of 0.5 count as ties.
    resamples / confidence: the bootstrap.
    batch_size: prompts per job batch, in every step; kl_batch_size: sequences per forward
        pass. A generation job batch is one ``sample_many`` call: the greedy and the sampled
        requests together, batch_size x (1 + n) sequences, which on vLLM is one ``generate``
        call. The default, 256 prompts (1,280 sequences at n = 4), fills a vLLM engine's
        running batch (``max_num_seqs``, 256 to 1,024 by default) from the start of each job
        batch, and a killed job loses at most one batch. The transformers backend splits a
        job batch into its own ``sampler.batch_size`` calls, so there it only sets how often
        the job appends its output.
    shard_index / num_shards: this task's share of the prompts (SLURM arrays, ranks); the
        task that finishes last writes the report.
    """

    greedy: bool = field(default=True, metadata={"help": "generate one greedy completion per prompt"})
    n: int = field(default=4, metadata={"help": "samples per prompt (0: greedy only)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (KL needs 1)", "min": 0})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling (KL needs 1)", "above": 0, "max": 1})
    max_tokens: int = field(default=512, metadata={"help": "completion length budget", "min": 1})
    seed: int = field(default=0, metadata={"help": "each prompt's draws are seeded by (seed, id), the same for "
                                           "every policy"})
    judge_pairwise: bool = field(default=True, metadata={"help": "judge: also compare with the baseline head to "
                                                         "head, both orders"})
    pairwise_samples: int = field(default=1, metadata={"help": "judge: sampled pairs per prompt compared (besides "
                                                       "the greedy pair)"})
    kl: bool = field(default=True, metadata={"help": "estimate KL(π‖π_ref) from each policy's samples"})
    kl_reference: str | None = field(default=None, metadata={"help": "the π_ref policy (default: the baseline)"})
    kl_sharding: str = field(default="replicate", metadata={"help": "KL models: replicate (whole per process) | "
                                                            "zero3 (partitioned over the ranks of a launch; "
                                                            "computed by a kl_only launch)"})
    kl_only: bool = field(default=False, metadata={"help": "run only the KL step on finished generations, models "
                                                   "loaded from the policies' paths"})
    tie_margin: float = field(default=0.0, metadata={"help": "judge preferences within this of 0.5 are ties"})
    resamples: int = field(default=stats.DEFAULT_RESAMPLES, metadata={"help": "bootstrap resamples"})
    confidence: float = field(default=stats.DEFAULT_CONFIDENCE, metadata={"help": "confidence level of every "
                                                                          "interval"})
    batch_size: int = field(default=256, metadata={"help": "prompts per job batch (each step; generation sends "
                                                   "batch_size x (1 + n) sequences to the engine at once)", "min": 1})
    kl_batch_size: int = field(default=32, metadata={"help": "KL: sequences per forward pass", "min": 1})
    plots: bool = field(default=True, metadata={"help": "write the PNG plots"})
    shard_index: int = field(default=0, metadata={"help": "this task's shard of the prompts"})
    num_shards: int = field(default=1, metadata={"help": "number of shards"})

    def __post_init__(self) -> None:
        if self.n < 0 or (self.n == 0 and not self.greedy):
            raise ConfigError(f"n: at least one completion per prompt is needed (n={self.n}, greedy={self.greedy})")
        if self.pairwise_samples < 0:
            raise ConfigError(f"pairwise_samples: must be >= 0, got {self.pairwise_samples}")
        if not 0 <= self.tie_margin < 0.5:
            raise ConfigError(f"tie_margin: must be in [0, 0.5), got {self.tie_margin}")
        check_sharding(self.kl_sharding, "kl_sharding")
        check_resamples(self.resamples)
        if not 0 < self.confidence < 1:
            raise ConfigError(f"confidence: must be in (0, 1), got {self.confidence}")
        if self.kl_only and not self.kl:
            raise ConfigError("kl_only=true runs only the KL step, but kl=false: set kl=true")


# --------------------------------------------------------------------------- inputs


def check_prompts(prompts: Sequence[Mapping[str, Any]], source: str, reference_field: str | None) -> None:
    """Every prompt has an id, ends in a user turn and (if needed) has its reference answer."""
    if not prompts:
        raise InputError(f"{source}: no prompts to evaluate")
    seen: dict[str, int] = {}
    for index, record in enumerate(prompts):
        try:
            validate_prompt(record, index)
            if reference_field is not None and record.get(reference_field) is None:
                raise RecordError(record_id(record, index), reference_field,
                                  "missing: the verifiable reward compares completions with it")
            if reference_field is not None:
                from rewards.verifiable import reference_problem

                if problem := reference_problem(record[reference_field]):
                    raise RecordError(record_id(record, index), reference_field, problem)
        except RecordError as error:
            raise RecordError(error.record_id, error.field, f"{error.problem} ({source}, row {index})") from None
        if record["id"] in seen:
            raise RecordError(record["id"], "id", f"appears twice ({source}, rows {seen[record['id']]} and {index})")
        seen[record["id"]] = index


def check_policies(names: Sequence[str], baseline: str) -> None:
    """Unique names, at least two policies, and the baseline among them."""
    names = list(names)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"policies: the name {duplicates[0]!r} is used twice; each policy needs its own name")
    if len(names) < 2:
        raise ConfigError("policies: give at least two (a baseline and a policy to compare with it)")
    if baseline not in names:
        raise ConfigError(f"baseline: {baseline!r} is not one of the policies {names}")


def _completion(c: Mapping[str, Any], token_ids: Sequence[int] | None = None) -> dict[str, Any]:
    out = {"text": c["text"], "num_tokens": int(c.get("num_tokens") or 0), "finish_reason": c.get("finish_reason", "stop")}
    if token_ids is not None:
        out["token_ids"] = list(token_ids)
    return out


def _generated(completion: Any) -> dict[str, Any]:
    """A sampler's Completion as an eval record, with its token ids (for KL)."""
    return _completion(completion.to_record(is_reference=False), completion.token_ids)


def given_generations(policy: EvalPolicy, prompts: Sequence[Mapping[str, Any]], n: int) -> dict[str, dict]:
    """Generation rows from completions given in place of a sampler, checked against the prompts.

    Matching by id alone would score completions against whatever prompt now has that id,
    so each row must carry the prompt it answered (``messages``, and ``tools`` when it had
    them; a ``sample`` output does) and it must equal the held-out prompt. An id twice is an
    error, and so is a prompt with fewer than ``n`` completions (the first ``n`` are used).
    """
    from align.io import read_records

    source = policy.completions
    records = read_records(source) if isinstance(source, (str, Path)) else list(source)  # type: ignore[arg-type]
    where = str(source) if isinstance(source, (str, Path)) else f"policy {policy.name!r} completions"
    by_id: dict[str, Mapping[str, Any]] = {}
    row_of: dict[str, int] = {}
    for index, record in enumerate(records):
        rid = record.get("id") if isinstance(record, Mapping) else None
        if not isinstance(rid, str):
            raise RecordError(f"<row {index}>", "id", f"missing ({where})")
        if rid in by_id:
            raise RecordError(rid, "id", f"duplicate id (rows {row_of[rid]} and {index} of {where})")
        by_id[rid], row_of[rid] = record, index
    for prompt in prompts:
        if prompt["id"] not in by_id:
            raise RecordError(prompt["id"], "completions", f"no completions for this prompt in {where}")
    needed = max(n, 1)
    rows = {}
    for prompt in prompts:
        record = by_id[prompt["id"]]
        if "messages" not in record:
            raise RecordError(prompt["id"], "messages", f"missing in {where}: given completions must carry the "
                              "prompt they answered (a sample output does), so they cannot be matched by id alone")
        if record["messages"] != prompt["messages"]:
            raise RecordError(prompt["id"], "messages", f"the completions in {where} answered another prompt than "
                              "the held-out prompt with this id")
        if (record.get("tools") or None) != (prompt.get("tools") or None):
            raise RecordError(prompt["id"], "tools", f"the completions in {where} were sampled with other tools "
                              "than the held-out prompt declares")
        completions = record.get("completions")
        if not isinstance(completions, list) or not completions:
            raise RecordError(prompt["id"], "completions", f"missing or empty in {where}")
        if len(completions) < needed:
            raise RecordError(prompt["id"], "completions", f"{len(completions)} completions in {where}, n={n} "
                              "are evaluated: sample at least n per prompt, or evaluate with a smaller n")
        for i, c in enumerate(completions):
            if not isinstance(c, Mapping) or not isinstance(c.get("text"), str):
                raise RecordError(prompt["id"], f"completions[{i}].text", f"expected a string ({where})")
        rows[prompt["id"]] = {"id": prompt["id"], "greedy": None,
                              "samples": [_completion(c) for c in completions[:needed]]}
    return rows


# --------------------------------------------------------------------------- jobs


def shard_is_done(out: Path, settings: EvalSettings) -> bool:
    """This task's shard of a job directory is complete: nothing to build an engine for."""
    from align.io.markers import shard_done_path

    return shard_done_path(out, settings.shard_index, settings.num_shards).exists()


def _generate_job(policy: EvalPolicy, prompts: list[dict], out: Path, settings: EvalSettings) -> None:
    if shard_is_done(out, settings):
        return  # no engine is built for a job this task already finished
    sampler = policy.open()

    def process(batch: list[dict]) -> list[dict]:
        convs, tools = [r["messages"] for r in batch], [r.get("tools") for r in batch]
        seeds = [derive_seed(settings.seed, r["id"]) for r in batch]
        # the greedy and the sampled requests go to the sampler together: a vLLM engine
        # schedules them in one generate call (docs/environment.md, "Evaluation generation
        # on vLLM"); each keeps its own seeds, so the completions are those of two calls
        requests = []
        if settings.greedy:
            requests.append(SampleRequest(convs, 1, temperature=0.0, max_tokens=settings.max_tokens, seed=seeds,
                                          tools=tools))
        if settings.n:
            requests.append(SampleRequest(convs, settings.n, temperature=settings.temperature, top_p=settings.top_p,
                                          max_tokens=settings.max_tokens, seed=seeds, tools=tools))
        results = sampler.sample_many(requests)
        greedy = results.pop(0) if settings.greedy else [[None]] * len(batch)
        samples = results.pop(0) if settings.n else [[] for _ in batch]
        return [{"id": r["id"], "prompt_ids": sampler.encoder.prompt_ids(r["messages"], r.get("tools")),
                 "greedy": None if g[0] is None else _generated(g[0]),
                 "samples": [_generated(c) for c in s]}
                for r, g, s in zip(batch, greedy, samples)]

    run_job(prompts, process, out, batch_size=settings.batch_size, desc=f"generate ({policy.name})",
            shard_index=settings.shard_index, num_shards=settings.num_shards,
            fingerprint={"stage": "eval_generate", "model": sampler.model_name, "backend": sampler.backend,
                         "greedy": settings.greedy, "n": settings.n, "temperature": settings.temperature,
                         "top_p": settings.top_p, "max_tokens": settings.max_tokens, "seed": settings.seed})


def _texts(gen: Mapping[str, Any]) -> list[str]:
    """A generation row's completions in scoring order: greedy first (if any), then samples."""
    return ([gen["greedy"]["text"]] if gen.get("greedy") else []) + [s["text"] for s in gen["samples"]]


def _score_job(provider: Any, prompts: dict[str, dict], generations: list[dict], out: Path, settings: EvalSettings,
               name: str) -> None:
    if shard_is_done(out, settings):
        return
    field_name = getattr(provider, "reference_field", None)

    def process(batch: list[dict]) -> list[dict]:
        convs = [prompts[g["id"]]["messages"] for g in batch]
        refs = [prompts[g["id"]][field_name] for g in batch] if field_name else None
        groups = provider.score_groups(convs, [_texts(g) for g in batch], references=refs)
        rows = []
        for gen, scores in zip(batch, groups):
            entries = [{"value": s.value, "skip": s.reason} for s in scores]
            greedy = entries.pop(0) if gen.get("greedy") else None
            rows.append({"id": gen["id"], "greedy": greedy, "samples": entries})
        return rows

    run_job(generations, process, out, batch_size=settings.batch_size, desc=f"score ({name})",
            shard_index=settings.shard_index, num_shards=settings.num_shards,
            fingerprint={"stage": "eval_score", **provider.fingerprint()})


PROMPT_TOO_LONG = "prompt_too_long"  # the judge's note on a comparison it could not ask (rewards.judge)


def _pairwise_job(judge: Any, prompts: dict[str, dict], gens: list[dict], base: dict[str, dict], out: Path,
                  settings: EvalSettings, name: str) -> None:
    if shard_is_done(out, settings):
        return
    def pairs_of(gen: Mapping[str, Any]) -> list[tuple[str, str, str]]:
        other = base[gen["id"]]
        out_pairs = []
        if gen.get("greedy") and other.get("greedy"):
            out_pairs.append(("greedy", gen["greedy"]["text"], other["greedy"]["text"]))
        for i in range(min(settings.pairwise_samples, len(gen["samples"]), len(other["samples"]))):
            out_pairs.append((f"sample{i}", gen["samples"][i]["text"], other["samples"][i]["text"]))
        return out_pairs

    def process(batch: list[dict]) -> list[dict]:
        asked = [(g["id"], kind, mine, theirs) for g in batch for kind, mine, theirs in pairs_of(g)]
        results = judge.compare_pairs([(prompts[rid]["messages"], mine, theirs) for rid, _, mine, theirs in asked])
        rows = {g["id"]: {"id": g["id"], "greedy": None, "samples": []} for g in batch}
        for (rid, kind, _, _), comparison in zip(asked, results):
            # a prompt over the judge's max_model_len was not asked: no outcome, not a tie
            unasked = (comparison.note or "").startswith(PROMPT_TOO_LONG)
            entry = {"p_win": None if unasked else comparison.first_wins, "orders_agree": comparison.orders_agree,
                     "note": comparison.note}
            if kind == "greedy":
                rows[rid]["greedy"] = entry
            else:
                rows[rid]["samples"].append(entry)
        return list(rows.values())

    run_job(gens, process, out, batch_size=settings.batch_size, desc=f"judge pairwise ({name})",
            shard_index=settings.shard_index, num_shards=settings.num_shards,
            fingerprint={"stage": "eval_pairwise", "pairwise_samples": settings.pairwise_samples,
                         **judge.fingerprint()})


def _kl_job(name: str, model: Any, reference: Any, reference_fingerprint: str, tokenizer: Any, gens: list[dict],
            out: Path, settings: EvalSettings) -> None:
    from align.eval.kl import sequence_logratios
    from align.scoring.sharded import finish_forwards, whole_weights_fingerprint

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def process(batch: list[dict]) -> list[dict]:
        sequences = [(gen["prompt_ids"], sample["token_ids"]) for gen in batch for sample in gen["samples"]]
        owners = [gen["id"] for gen in batch for _ in gen["samples"]]
        ratios = sequence_logratios(model, reference, sequences, pad_token_id=pad,
                                    batch_size=settings.kl_batch_size) if sequences else []
        rows = {g["id"]: {"id": g["id"], "logratios": []} for g in batch}
        for rid, value in zip(owners, ratios):
            rows[rid]["logratios"].append(value)
        return list(rows.values())

    # the whole weights' fingerprint, also of a partitioned model: a job resumes under either layout
    run_job(gens, process, out, batch_size=settings.batch_size, desc=f"KL ({name})",
            shard_index=settings.shard_index, num_shards=settings.num_shards,
            fingerprint={"stage": "eval_kl", "policy": whole_weights_fingerprint(model),
                         "reference": reference_fingerprint})
    finish_forwards(model, reference)  # partitioned models: forward in step until every rank's shard is done


# --------------------------------------------------------------------------- the whole evaluation


def evaluate(
    prompts: Sequence[Mapping[str, Any]] | Any,
    policies: Sequence[EvalPolicy],
    provider: Any,
    output_dir: str | Path,
    *,
    baseline: str,
    settings: EvalSettings | None = None,
    source: str = "prompts",
) -> dict[str, Any]:
    """Generate, score and compare; write eval.jsonl, report.json, report.md and plots.

    ``prompts`` are records with ``id`` and ``messages`` (ending in a user turn), and
    optionally ``answer`` (for the verifiable reward), ``language`` and ``category``
    (every figure is then broken down by them). ``provider`` is the reward provider, or a
    function that builds one: it is then called only after every policy has generated
    (so a judge's engine never shares the GPUs with a policy's sampler) and the provider is
    released before the KL step. Returns the report.
    """
    from align.eval.report import write_outputs

    settings = settings or EvalSettings()
    prompts = [dict(p) for p in prompts]
    check_prompts(prompts, source, getattr(provider, "reference_field", None))
    check_policies([p.name for p in policies], baseline)
    out = Path(output_dir)
    by_id = {p["id"]: p for p in prompts}
    ids = [p["id"] for p in prompts]

    jobs: list[Path] = []  # every job directory, to tell when all shards are in
    if settings.kl_only:
        return _kl_only(policies, baseline, by_id, out, settings)

    generations: dict[str, list[dict]] = {}
    for policy in policies:
        if policy.generates:
            path = out / "generations" / policy.name
            _generate_job(policy, prompts, path, settings)
            policy.release()
            jobs.append(path)
            generations[policy.name] = read_output(path)
        else:
            rows = given_generations(policy, prompts, settings.n)
            generations[policy.name] = [rows[i] for i in ids]

    built_here = not _is_provider(provider)
    if built_here and _scoring_done(out, policies, baseline, settings):
        # every scoring job of this shard is finished: no engine to build
        provider = _Done(out / "scores" / policies[0].name, settings.judge_pairwise)
        built_here = False
    if built_here:  # every sampler is released by now: the provider's engine has the GPUs
        provider = provider()
        if getattr(provider, "reference_field", None):
            check_prompts(prompts, source, provider.reference_field)
    provider_name = provider.name

    scores = {}
    for policy in policies:
        path = out / "scores" / policy.name
        _score_job(provider, by_id, generations[policy.name], path, settings, policy.name)
        jobs.append(path)
        scores[policy.name] = read_output(path)

    pairwise: dict[str, list[dict]] = {}
    if settings.judge_pairwise and hasattr(provider, "compare_pairs"):
        base = {g["id"]: g for g in generations[baseline]}
        for policy in policies:
            if policy.name == baseline:
                continue
            path = out / "pairwise" / policy.name
            _pairwise_job(provider, by_id, generations[policy.name], base, path, settings, policy.name)
            jobs.append(path)
            pairwise[policy.name] = read_output(path)
    if built_here:  # released before the KL step loads the policies' models
        close_engine(provider)
        provider = None
        free_device_memory()

    kl: dict[str, list[dict]] = {}
    kl_notes: dict[str, str] = {}
    if settings.kl:
        kl, kl_notes, pending = _kl_all(policies, baseline, by_id, generations, out, settings)
        jobs += [out / "kl" / name for name in [*kl, *pending]]

    unfinished = [str(p.relative_to(out)) for p in jobs if not _job_done(p, ids, settings.num_shards)]
    if unfinished:
        print(f"[align evaluate] shard {settings.shard_index} of {settings.num_shards} done; waiting for other "
              f"shards of {', '.join(unfinished)}")
        return {"complete": False, "unfinished": unfinished}

    def now(rows: list[dict], path: Path) -> list[dict]:
        # read again: another array task may have finished its shard of this job since it was read above
        return _in_order(read_output(path) if path in jobs else rows, ids, path)

    generations = {k: now(v, out / "generations" / k) for k, v in generations.items()}
    scores = {k: now(v, out / "scores" / k) for k, v in scores.items()}
    pairwise = {k: now(v, out / "pairwise" / k) for k, v in pairwise.items()}
    kl = {k: now(v, out / "kl" / k) for k, v in kl.items()}

    rows = assemble_rows(prompts, policies, generations, scores, pairwise, kl)
    report = build_report(rows, [p.name for p in policies], baseline, settings, provider_name=provider_name,
                          kl_notes=kl_notes, supplied=[p.name for p in policies if p.completions is not None])
    write_outputs(out, rows, report, plots=settings.plots)
    return report


def _scoring_done(out: Path, policies: Sequence[EvalPolicy], baseline: str, settings: EvalSettings) -> bool:
    """Every scoring job of this task's shard is finished (and, for the judge, every comparison)."""
    scores = [out / "scores" / p.name for p in policies]
    if not all(shard_is_done(path, settings) for path in scores):
        return False
    if not (settings.judge_pairwise and _Done(scores[0], True).name == "constitutional_judge"):
        return True
    return all(shard_is_done(out / "pairwise" / p.name, settings) for p in policies if p.name != baseline)


class _Done:
    """The reward provider of an evaluation whose scoring jobs are all finished: it is never built.
    Its name is the one the scoring jobs recorded; ``compare_pairs`` is there when they compared pairs."""

    def __init__(self, score_dir: Path, pairwise: bool):
        import json

        try:
            self.name = json.loads((score_dir / "_job.json").read_text()).get("provider", "unknown")
        except (OSError, ValueError):
            self.name = "unknown"
        if pairwise and self.name == "constitutional_judge":
            self.compare_pairs = None  # the judge's comparisons are read back, not asked again


def _in_order(rows: list[dict], ids: list[str], where: Path) -> list[dict]:
    """A job's rows in prompt order, every prompt exactly once."""
    by_id = {r["id"]: r for r in rows}
    missing = [i for i in ids if i not in by_id]
    if missing or len(by_id) != len(ids):
        raise InputError(f"{where}: {len(missing)} prompts missing ({missing[:5]}) or unexpected ids present")
    return [by_id[i] for i in ids]


KL_ONLY_COMMAND = ("accelerate launch --config_file recipes/accelerate/zero3.yaml -m align evaluate RECIPE "
                   "kl_only=true")


def _kl_all(policies: Sequence[EvalPolicy], baseline: str, by_id: dict[str, dict], generations: dict[str, list],
            out: Path, settings: EvalSettings) -> tuple[dict[str, list[dict]], dict[str, str], list[str]]:
    """The KL jobs: (rows by policy, why a policy has none, policies whose KL a ``kl_only`` launch computes).

    With ``kl_sharding=zero3`` and without ``kl_only``, nothing is computed here: finished
    KL jobs are read, the others are pending. Models are built (or their samplers opened)
    in policy order, the reference first, the same on every rank of a launch.
    """
    from align.eval.kl import check_kl_sampling
    from align.scoring.sharded import all_ranks_agree, whole_weights_fingerprint

    reference_name = settings.kl_reference or baseline
    reference = next((p for p in policies if p.name == reference_name), None)
    if reference is None:
        raise ConfigError(f"kl_reference: {reference_name!r} is not one of the policies")
    ids = list(by_id)
    notes: dict[str, str] = {}
    results: dict[str, list[dict]] = {}
    why_not = check_kl_sampling(settings.temperature, settings.top_p)
    if not why_not and settings.n == 0:
        why_not = "no samples (n = 0)"
    if not why_not and not reference.generates:
        why_not = f"the KL reference {reference_name!r} has no model (completions given)"
    if not why_not and not reference.builds_kl_model and reference.kl_model() is None:
        why_not = f"no model in memory for the KL reference {reference_name!r} (a vLLM sampler)"
    todo = []
    for policy in policies:
        if policy.name == reference_name:
            continue
        note = why_not or _kl_blocker(policy, reference)
        if note:
            notes[policy.name] = note
        else:
            todo.append(policy)
    if settings.kl_sharding == "zero3" and not settings.kl_only:  # the models are too large for this run
        pending = [p.name for p in todo if not _job_done(out / "kl" / p.name, ids, settings.num_shards)]
        results = {p.name: read_output(out / "kl" / p.name) for p in todo if p.name not in pending}
        if pending:
            print(f"[align evaluate] KL of {', '.join(pending)} (kl_sharding=zero3) waits for its own launch: "
                  f"{KL_ONLY_COMMAND}")
        return results, notes, pending
    reference_model = reference.kl_model() if todo else None
    reference_fingerprint = whole_weights_fingerprint(reference_model) if todo else ""
    for policy in todo:
        path = out / "kl" / policy.name
        if policy.builds_kl_model and all_ranks_agree(_job_done(path, ids, settings.num_shards)):
            results[policy.name] = read_output(path)  # finished: its model is not loaded again
            continue
        _kl_job(policy.name, policy.kl_model(), reference_model, reference_fingerprint, policy.kl_tokenizer(),
                generations[policy.name], path, settings)
        policy.release()
        results[policy.name] = read_output(path)
    reference.release()
    return results, notes, []


def _kl_only(policies: Sequence[EvalPolicy], baseline: str, by_id: dict[str, dict], out: Path,
             settings: EvalSettings) -> dict[str, Any]:
    """``kl_only``: the KL step alone, over the generations an earlier run completed."""
    generations: dict[str, list[dict]] = {}
    for policy in policies:
        if not policy.generates:
            continue
        path = out / "generations" / policy.name
        if not _job_done(path, list(by_id), settings.num_shards):
            raise InputError(f"kl_only: the generations of policy {policy.name!r} in {path} are not complete: run "
                             "the evaluation without kl_only first (it generates and scores, and leaves the KL step "
                             "to this launch)")
        generations[policy.name] = read_output(path)
    kl, notes, _ = _kl_all(policies, baseline, by_id, generations, out, settings)
    print(f"[align evaluate] KL done for {', '.join(kl) or 'no policy'} (shard {settings.shard_index} of "
          f"{settings.num_shards}){''.join(f'; {k}: {v}' for k, v in notes.items())}. Run the evaluation again "
          "without kl_only to write the report")
    return {"complete": False, "kl_only": True, "kl": sorted(kl), "kl_notes": notes}


def _job_done(path: Path, ids: list[str], num_shards: int) -> bool:
    """``job_is_complete`` with the shard count the job was written with: a ``kl_only``
    launch shards its KL jobs over its ranks, whatever shards the evaluation used."""
    from align.io.shards import SHARD_RE, shard_files

    files = shard_files(path)
    return job_is_complete(path, ids, int(SHARD_RE.match(files[0].name).group(2)) if files else num_shards)


def _kl_blocker(policy: EvalPolicy, reference: EvalPolicy) -> str | None:
    """Why this policy's KL cannot be estimated against the reference, or None (no model is loaded to tell)."""
    from align.logprobs import tokenizer_fingerprint

    if not policy.generates:
        return "completions given, no model to score them with"
    if not policy.builds_kl_model and policy.kl_model() is None:
        return "no model in memory (a vLLM sampler): evaluate with the transformers backend for KL"
    if tokenizer_fingerprint(policy.kl_tokenizer()) != tokenizer_fingerprint(reference.kl_tokenizer()):
        return f"its tokenizer differs from the KL reference {reference.name!r}'s"
    return None


def _public(completion: Mapping[str, Any]) -> dict[str, Any]:
    """A completion as eval.jsonl shows it: text, length, finish reason (token ids stay in the job)."""
    return {k: v for k, v in completion.items() if k != "token_ids"}


def assemble_rows(prompts: list[dict], policies: Sequence[EvalPolicy], generations: dict[str, list[dict]],
                  scores: dict[str, list[dict]], pairwise: dict[str, list[dict]],
                  kl: dict[str, list[dict]]) -> list[dict]:
    """One eval.jsonl row per prompt: each policy's completions with their scores and comparisons."""
    rows = []
    for k, prompt in enumerate(prompts):
        row: dict[str, Any] = {"id": prompt["id"], DIGEST_FIELD: prompt_digest(prompt)}  # what rescore_rows matches
        for column in BREAKDOWN_COLUMNS:
            if prompt.get(column) is not None:
                row[column] = prompt[column]
        row["policies"] = {}
        for policy in policies:
            gen, score = generations[policy.name][k], scores[policy.name][k]
            entry: dict[str, Any] = {}
            if gen.get("greedy"):
                entry["greedy"] = {**_public(gen["greedy"]), "score": score["greedy"]["value"],
                                   "skip": score["greedy"]["skip"]}
            entry["samples"] = [{**_public(s), "score": sc["value"], "skip": sc["skip"]}
                                for s, sc in zip(gen["samples"], score["samples"])]
            if policy.name in pairwise:
                entry["judge_vs_baseline"] = {key: pairwise[policy.name][k][key] for key in ("greedy", "samples")}
            if policy.name in kl:
                entry["kl_logratios"] = kl[policy.name][k]["logratios"]
            row["policies"][policy.name] = entry
        rows.append(row)
    return rows


__all__ = [
    "EvalPolicy",
    "EvalSettings",
    "assemble_rows",
    "build_report",
    "check_policies",
    "check_prompts",
    "close_engine",
    "evaluate",
    "free_device_memory",
]
