"""Reading a job's output back: merged shards, completeness, `datasets` loading."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from align.jobs.store import SHARD_RE, done_path, iter_lines, shard_files


def output_files(output_dir: str | Path) -> list[str]:
    """The shard files, for `datasets.load_dataset("json", data_files=output_files(d))`.

    Load only a complete output (`is_complete`): a shard being written may end in a torn
    line that `read_output` skips but the `datasets` JSON reader would reject.
    """
    return [str(p) for p in shard_files(output_dir)]


def read_output(
    output_dir: str | Path, *, expect_ids: Iterable[str] | None = None, id_field: str = "id"
) -> list[dict]:
    """All records of all shards; in `expect_ids` order (and checked against it) if given.

    Raises on an id written twice (corruption, or two jobs sharing a directory) and, with
    `expect_ids`, on ids missing from the output or present but not expected.
    """
    merged: dict[str, dict] = {}
    where: dict[str, str] = {}
    for path in shard_files(output_dir):
        for number, record in iter_lines(path):
            rid = record.get(id_field)
            if rid in merged:
                raise ValueError(f"id {rid!r} is written twice: {where[rid]} and {path.name}:{number}")
            merged[rid], where[rid] = record, f"{path.name}:{number}"
    if expect_ids is None:
        return list(merged.values())
    expected = list(expect_ids)
    missing = [rid for rid in expected if rid not in merged]
    extra = sorted(set(merged) - set(expected))
    if missing or extra:
        raise ValueError(
            f"output in {output_dir} does not match the expected ids: "
            f"{len(missing)} missing {missing[:10]}, {len(extra)} unexpected {extra[:10]}"
        )
    return [merged[rid] for rid in expected]


def _ids_of(records_or_ids: Sequence[Any] | Any, id_field: str) -> list[str]:
    if hasattr(records_or_ids, "column_names"):
        return list(records_or_ids[id_field])
    return [r[id_field] if isinstance(r, Mapping) else r for r in records_or_ids]


def is_complete(
    output_dir: str | Path,
    records_or_ids: Sequence[Any] | Any,
    num_shards: int,
    *,
    id_field: str = "id",
) -> bool:
    """True when every shard has its done marker and the output holds exactly these ids."""
    output_dir = Path(output_dir)
    files = shard_files(output_dir)
    if any(int(SHARD_RE.match(p.name).group(2)) != num_shards for p in files):
        return False
    if not all(done_path(output_dir, i, num_shards).exists() for i in range(num_shards)):
        return False
    written: list[str] = [r.get(id_field) for p in files for _, r in iter_lines(p)]
    return len(written) == len(set(written)) and set(written) == set(_ids_of(records_or_ids, id_field))
