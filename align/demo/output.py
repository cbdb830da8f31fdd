"""Where the demo writes: a new or empty directory, or over an earlier demo run, never over other files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from align.config import to_dict
from align.errors import InputError
from align.io import write_json

if TYPE_CHECKING:
    from align.demo.config import DemoConfig

# What a demo run writes under output_dir (listed in its manifest); a new run removes these first.
RUN_OUTPUTS = ("data", "sft", "sample", "annotate", "pairs", "logprobs", "qrpo", "dpo", "evaluate",
               "report.json", "training.png", "validation_grid.png", "reward_vs_accuracy.png")
DEMO_MANIFEST = "_demo.json"


def check_demo_output_dir(out: Path) -> None:
    """The demo writes only into a new or empty directory, or over an earlier demo run.

    An earlier run is recognised by its manifest (``_demo.json``, listing what it wrote);
    a directory holding anything else is refused, so a mistyped ``output_dir`` never costs a
    user their files.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise InputError(f"demo: output_dir={str(out)!r} is a file, not a directory")
    manifest = out / DEMO_MANIFEST
    listed: set[str] = set()
    if manifest.is_file():
        try:
            listed = set(json.loads(manifest.read_text()).get("outputs") or [])
        except (json.JSONDecodeError, AttributeError):
            raise InputError(f"demo: {manifest} is not a demo manifest; choose another output_dir") from None
    foreign = sorted(p.name for p in out.iterdir() if p.name != DEMO_MANIFEST and p.name not in listed)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError(f"demo: output_dir={str(out)!r} holds files that no demo run wrote ({shown}); "
                         "choose a new or empty output_dir")


def clear_previous_run(out: Path) -> None:
    """Start from nothing: remove exactly what the earlier demo run's manifest lists.

    The demo's stages resume from what they find, and a previous run with other settings
    (another seed, another preset) would be refused or mixed in.
    """
    import shutil

    manifest = out / DEMO_MANIFEST
    if not manifest.is_file():
        return
    listed = json.loads(manifest.read_text()).get("outputs") or []
    found = [out / name for name in listed if (out / name).exists() or (out / name).is_symlink()]
    print(f"[align demo] removing the previous demo run's outputs in {out}", flush=True)
    for path in found:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    manifest.unlink()


def claim_output_dir(out: Path, config: DemoConfig) -> None:
    """Remove the earlier demo run (as its manifest lists it) and record this run's manifest."""
    clear_previous_run(out)
    out.mkdir(parents=True, exist_ok=True)
    from align.demo.rounds import round_dirs

    outputs = list(RUN_OUTPUTS) + round_dirs(config.rounds)
    write_json(out / DEMO_MANIFEST, {"written_by": "align demo", "outputs": outputs,
                                     "settings": to_dict(config)})
