"""Which shard a record belongs to, and which shard this process is.

Records go to shards by a stable hash of their id (not by position): a record keeps its
shard when the input is reordered, filtered or extended, so a resumed shard never
re-processes work another shard already did. Shards are balanced in expectation, not
exactly (for N shards of M records, each holds about M/N ± a few √(M/N)).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from align.errors import ConfigError


def shard_of(record_id: str, num_shards: int) -> int:
    """The shard (0..num_shards-1) of an id: blake2b of its UTF-8 bytes, mod N."""
    if num_shards < 1:
        raise ConfigError(f"num_shards must be >= 1, got {num_shards}")
    digest = hashlib.blake2b(record_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def check_shard(shard_index: int, num_shards: int) -> None:
    """Raise on a shard spec that cannot be right (index outside 0..N-1)."""
    for name, value in (("num_shards", num_shards), ("shard_index", shard_index)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if num_shards < 1:
        raise ConfigError(f"num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard_index < num_shards:
        raise ConfigError(f"shard_index must be in 0..{num_shards - 1}, got {shard_index}")


def _int_env(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ConfigError(f"environment variable {name}={env[name]!r} is not an integer") from None


def shard_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(shard_index, num_shards) from a SLURM job array, or torchrun/accelerate ranks.

    SLURM: SLURM_ARRAY_TASK_ID counted from SLURM_ARRAY_TASK_MIN (arrays may start at
    1), SLURM_ARRAY_TASK_COUNT shards. Else RANK / WORLD_SIZE. Else (0, 1).
    """
    env = os.environ if env is None else env
    if "SLURM_ARRAY_TASK_ID" in env:
        if "SLURM_ARRAY_TASK_COUNT" not in env:
            raise ConfigError("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not")
        first = _int_env(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
        index = _int_env(env, "SLURM_ARRAY_TASK_ID") - first
        count = _int_env(env, "SLURM_ARRAY_TASK_COUNT")
    elif "RANK" in env or "WORLD_SIZE" in env:
        if "RANK" not in env or "WORLD_SIZE" not in env:
            raise ConfigError("set both RANK and WORLD_SIZE, or neither")
        index, count = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE")
    else:
        return 0, 1
    check_shard(index, count)
    return index, count


def shard_index_from_env(num_shards: int, env: Mapping[str, str] | None = None) -> int:
    """This process's shard when the shard count is given: SLURM_ARRAY_TASK_ID as it is
    (not counted from SLURM_ARRAY_TASK_MIN), else RANK, else 0.

    A resubmitted array task (``sbatch --array=2``) sees SLURM_ARRAY_TASK_COUNT=1 and
    SLURM_ARRAY_TASK_MIN=2: only an explicit count keeps task 2 on shard 2 of N.
    """
    env = os.environ if env is None else env
    for name in ("SLURM_ARRAY_TASK_ID", "RANK"):
        if name in env:
            index = _int_env(env, name)
            if not 0 <= index < num_shards:
                raise ConfigError(f"{name}={index} is not a shard of num_shards={num_shards} (shards 0.."
                                  f"{num_shards - 1}; a SLURM array for it is --array=0-{num_shards - 1})")
            return index
    return 0


def resolve_shard(shard_index: int | None, num_shards: int | None,
                  env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """A stage's shard: the configured one, else what the environment gives.

    Neither set: ``shard_from_env`` (SLURM array: task id and count; ranks). Only
    ``num_shards`` set: that count, and the shard from ``shard_index_from_env`` (the array
    task id or the rank). Only ``shard_index`` set: that shard of 1 (an error unless 0).
    """
    if shard_index is None and num_shards is None:
        return shard_from_env(env)
    if shard_index is None:
        check_shard(0, num_shards)
        return shard_index_from_env(num_shards, env), num_shards
    return shard_index, num_shards or 1
