"""Scoring with a model too large for one device: DeepSpeed ZeRO-3 inference over the ranks of a launch.

Two layouts (``SHARDINGS``), chosen by a recipe key (``sharding`` of ``align logprobs``,
``kl_sharding`` of ``align evaluate``); docs/sharded-passes.md has the memory arithmetic:

* ``replicate``: each process holds the whole model on its device and scores its shard of
  the rows alone. The fastest layout wherever the model fits (an 8B model in bf16, 16 GB).
* ``zero3``: the model is built already partitioned (``deepspeed.zero.Init``, which
  transformers uses when a ``HfDeepSpeedConfig`` of stage 3 is alive during
  ``from_pretrained``), so each of N ranks holds 1/N of every weight and no rank ever
  holds it whole; a forward gathers each layer's weights just before the layer runs and
  frees them after. Each rank still scores its own rows, so the numbers are those of a
  whole model (the same modules and kernels; DeepSpeed's replacement of ``F.linear`` is
  turned off), and neither a cache key nor a manifest depends on the layout.

The lockstep. Gathering a layer is a collective call: every rank must run the same
sequence of forwards, or the ranks wait for each other forever. Rows are sharded by id, so
ranks hold unequal shares (and a resumed rank may have nothing left to do). A
``LockstepModel`` therefore agrees with the other ranks before each forward (one small
``all_reduce``): the ranks run the forward of the model with the lowest id anyone wants,
and a rank that wants another model, or has no rows left, runs a one-token dummy forward
of that model meanwhile. ``finish_forwards`` is the last rank's drain: it runs dummy
forwards until no rank wants one. Several partitioned models (a policy and a reference)
share one coordinator, so their forwards interleave in the same order on every rank.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from align.errors import ConfigError
from align.ranks import start_process_group
from align.scoring.flex import resolve_attn_implementation

logger = logging.getLogger(__name__)

SHARDINGS = ("replicate", "zero3")
DTYPES = ("float32", "bfloat16", "float16")

__all__ = [
    "DTYPES",
    "SHARDINGS",
    "LockstepModel",
    "all_ranks_agree",
    "check_sharding",
    "finish_forwards",
    "init_distributed",
    "is_partitioned",
    "launched_with_zero3",
    "load_scoring_model",
    "parameter_bytes",
    "release_model",
    "resolve_dtype",
    "this_process_device",
    "whole_weights_fingerprint",
    "zero3_inference_config",
]


def check_sharding(value: str, key: str = "sharding") -> None:
    """Refuse an unknown layout, naming the key."""
    if value not in SHARDINGS:
        raise ConfigError(f"{key}={value!r}: choose one of {list(SHARDINGS)} (replicate: a whole copy per process; "
                          "zero3: partitioned over the ranks of a distributed launch)")


def launched_with_zero3(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``accelerate launch`` was given a DeepSpeed config of ZeRO stage 3."""
    env = os.environ if env is None else env
    return env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and \
        env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "") == "3"


def init_distributed(key: str = "sharding") -> None:
    """The process group of this launch (nccl on GPUs, gloo on CPU); a launch is required."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise ConfigError(f"{key}=zero3 partitions the model over the ranks of a distributed launch: start the "
                          "command with `accelerate launch --config_file recipes/accelerate/zero3.yaml -m align ...` "
                          "(or torchrun), or use replicate in a single process")
    start_process_group(one_rank=True)


def all_ranks_agree(flag: bool) -> bool:
    """True only when ``flag`` is true on every rank (outside a process group: ``flag``).

    What decides a collective step (loading a partitioned model) must be the same on every rank.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def this_process_device() -> torch.device:
    """This process's accelerator (``LOCAL_RANK`` of a launch), or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def resolve_dtype(path: str, dtype: str | None) -> str:
    """A concrete weights dtype: ``dtype``, or for None / ``"auto"`` the checkpoint's own (else float32)."""
    if dtype not in (None, "auto"):
        if dtype not in DTYPES:
            raise ConfigError(f"dtype={dtype!r}: choose one of {list(DTYPES)} or auto")
        return dtype
    from transformers import AutoConfig

    found = getattr(AutoConfig.from_pretrained(path), "dtype", None)
    name = str(found).replace("torch.", "") if found is not None else "float32"
    return name if name in DTYPES else "float32"


def zero3_inference_config(dtype: str) -> dict[str, Any]:
    """A DeepSpeed config for forward passes only: ZeRO stage 3, weights in ``dtype``.

    The weights dtype is the one the layout must not change, so bf16/fp16 are switched on
    exactly for those dtypes (``zero.Init`` builds the partitions in that dtype).
    ``memory_efficient_linear`` is off: DeepSpeed would otherwise replace ``F.linear``
    process-wide with its own autograd function (a saving for backward, which a pass has
    none of, and another kernel than the replicated model's).
    """
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3, "memory_efficient_linear": False},
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def is_partitioned(model: torch.nn.Module) -> bool:
    """Every parameter is a ZeRO-3 partition (DeepSpeed marks them with ``ds_id``)."""
    params = list(model.parameters())
    return bool(params) and all(hasattr(p, "ds_id") for p in params)


def parameter_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of parameters this process holds, bytes of the whole model's parameters).

    A ZeRO-3 partition counts its local piece (``ds_tensor``) and the whole by ``ds_numel``;
    any other parameter counts whole in both. Shared (tied) parameters count once.
    """
    held = whole = 0
    for p in model.parameters():
        size = p.element_size()
        if hasattr(p, "ds_tensor"):
            held += p.ds_tensor.numel() * p.ds_tensor.element_size()
            whole += p.ds_numel * size
        else:
            held += p.numel() * size
            whole += p.numel() * size
    return held, whole


# --------------------------------------------------------------------------- loading


def load_scoring_model(path: str, *, dtype: str | None, attn_implementation: str | None = None,
                       sharding: str = "replicate", device: str | torch.device | None = None,
                       key: str = "sharding") -> torch.nn.Module:
    """A causal LM to score with, in eval mode: whole on ``device`` (replicate), or
    partitioned over the ranks of this launch and wrapped in a ``LockstepModel`` (zero3).

    ``dtype`` None or ``"auto"``: the checkpoint's own. Under zero3 each rank uses its own
    accelerator (``LOCAL_RANK``), and every rank must call this in the same order.
    """
    from transformers import AutoModelForCausalLM

    check_sharding(sharding, key)
    dtype = resolve_dtype(path, dtype)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    attn_implementation = resolve_attn_implementation(attn_implementation, cuda=on_gpu)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if sharding == "replicate":
        if launched_with_zero3():
            logger.warning("%s=replicate under a ZeRO-3 launch: every rank loads a whole copy of %s", key, path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if device is not None:
            model = model.to(device)
        return model.eval()
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    init_distributed(key)
    ds_config = zero3_inference_config(dtype)
    live = HfDeepSpeedConfig(ds_config)  # alive during from_pretrained: transformers builds under zero.Init
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if not is_partitioned(model):
        raise RuntimeError(f"{path} was not built partitioned under ZeRO-3 (transformers did not see the "
                           "DeepSpeed config): refusing to go on with a whole copy per rank")
    held, whole = parameter_bytes(model)
    logger.info("%s: this rank holds %.1f MiB of the model's %.1f MiB of %s weights (ZeRO-3, %d ranks)", path,
                held / 2**20, whole / 2**20, dtype, torch.distributed.get_world_size())
    engine, *_ = deepspeed.initialize(model=model, config=ds_config)
    wrapped = LockstepModel(engine, keep_alive=live)
    return wrapped.eval()


# --------------------------------------------------------------------------- lockstep


class _Coordinator:
    """Agrees, before each forward, which partitioned model all ranks run (see the module doc)."""

    IDLE = (1 << 62)

    def __init__(self) -> None:
        self.models: dict[int, weakref.ref] = {}
        self.next_id = 0

    def register(self, model: LockstepModel) -> int:
        index = self.next_id
        self.next_id += 1
        self.models[index] = weakref.ref(model)
        return index

    def _agree(self, wanted: int, device: torch.device) -> int:
        import torch.distributed as dist

        value = torch.tensor([wanted], dtype=torch.int64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return int(value.item())

    def _device(self) -> torch.device:
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def forward(self, model: LockstepModel, args: tuple, kwargs: dict) -> Any:
        device = self._device()
        while True:
            chosen = self._agree(model.lockstep_id, device)
            if chosen == model.lockstep_id:
                model.real_forwards += 1
                return model.module(*args, **kwargs)
            self._dummy(chosen)

    def drain(self) -> None:
        """Dummy forwards until every rank has no forward left to run."""
        device = self._device()
        while (chosen := self._agree(self.IDLE, device)) != self.IDLE:
            self._dummy(chosen)

    def _dummy(self, chosen: int) -> None:
        ref = self.models.get(chosen)
        model = ref() if ref is not None else None
        if model is None:
            raise RuntimeError(f"another rank runs partitioned model {chosen}, which this rank has released: every "
                               "rank must finish its forwards (finish_forwards) before releasing a model")
        model.dummy_forward()


_COORDINATOR = _Coordinator()


class LockstepModel(torch.nn.Module):
    """A partitioned model (a DeepSpeed ZeRO-3 engine) whose forwards run in step on every rank.

    Call it as the model (``align.scoring.completion_logps`` does); ``unwrap_model`` finds
    the transformers model under it. After this rank's last real forward, call
    ``finish_forwards`` on every rank. ``real_forwards`` and ``dummy_forwards`` count what
    this rank ran.
    """

    def __init__(self, engine: torch.nn.Module, keep_alive: Any = None,
                 dummy_inputs: Callable[[torch.device], dict[str, Any]] | None = None):
        super().__init__()
        self.module = engine
        self._keep_alive = keep_alive  # the HfDeepSpeedConfig: transformers consults it while the model lives
        self._dummy_inputs = dummy_inputs or _one_token
        self.real_forwards = self.dummy_forwards = 0
        self.lockstep_id = _COORDINATOR.register(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _COORDINATOR.forward(self, args, kwargs)

    def close(self) -> None:
        """Let the partitions go (on every rank, after ``finish_forwards``).

        A DeepSpeed engine outlives its last reference: its module stays on DeepSpeed's
        module-level stack of modules in forward (pushed at setup, never popped), and its
        parameter coordinator in a class-level ``lru_cache`` of the layers to release. Both
        are cleared here, and the engine's hooks removed, so the memory goes with the model.
        """
        from deepspeed.runtime.zero import parameter_offload

        engine = self.module
        if engine is None:
            return
        engine.destroy()
        stack = parameter_offload.FWD_MODULE_STACK
        stack[:] = [m for m in stack if m is not engine.module]
        _clear_coordinator_caches()
        self.module = None
        self._keep_alive = None

    def dummy_forward(self) -> None:
        """One forward on a one-token input: the same layers gathered as a real forward."""
        self.dummy_forwards += 1
        device = next(self.module.parameters()).device
        with torch.inference_mode():
            self.module(**self._dummy_inputs(device))


def _clear_coordinator_caches() -> None:
    """Empty the ``lru_cache`` s on DeepSpeed's ``PartitionedParameterCoordinator`` methods: keyed
    by the coordinator and a layer, they keep every engine that ever ran a forward alive (a
    cache: another live engine just fills it again)."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

    pending = list(vars(PartitionedParameterCoordinator).values())
    seen: set[int] = set()
    while pending:  # the caches sit under decorators: through __wrapped__ and closures
        value = pending.pop()
        if id(value) in seen or not callable(value):
            continue
        seen.add(id(value))
        if hasattr(value, "cache_clear"):
            value.cache_clear()
            continue
        pending += [getattr(value, "__wrapped__", None)] + [c.cell_contents for c in getattr(value, "__closure__", None)
                                                             or () if _filled(c)]


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _one_token(device: torch.device) -> dict[str, Any]:
    return {"input_ids": torch.zeros((1, 1), dtype=torch.long, device=device), "use_cache": False}


def release_model(model: Any) -> None:
    """Drop what keeps a scoring model's memory alive beyond its last reference (``LockstepModel.close``)."""
    close = getattr(model, "close", None)
    if isinstance(model, LockstepModel) and callable(close):
        close()


def finish_forwards(*models: Any) -> None:
    """On every rank, after its last real forward: run dummy forwards until all ranks are done.

    Nothing happens unless one of ``models`` is a ``LockstepModel``.
    """
    if any(isinstance(m, LockstepModel) for m in models):
        _COORDINATOR.drain()


# --------------------------------------------------------------------------- fingerprint


def whole_weights_fingerprint(model: torch.nn.Module) -> str:
    """``align.io.fingerprint.weights_fingerprint`` of the whole model, also when it is partitioned.

    A partitioned model's ``state_dict`` holds empty placeholders; its tensors are gathered
    one at a time (a collective: every rank calls this), so the digest equals that of the
    same weights held whole.
    """
    from align.io.fingerprint import tensors_fingerprint, weights_fingerprint

    base = model
    while hasattr(base, "module") and hasattr(base.module, "state_dict"):
        base = base.module
    if not is_partitioned(base):
        return weights_fingerprint(model)
    import deepspeed

    params = dict(base.named_parameters(remove_duplicate=False))

    def tensors():
        for name, value in base.state_dict().items():
            param = params.get(name)
            if param is None or not hasattr(param, "ds_id"):
                yield name, value
                continue
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                yield name, param.data

    return tensors_fingerprint(tensors())
