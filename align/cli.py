"""`align <stage> RECIPE.yaml [key=value ...]`: the command-line front door.

Under `accelerate launch`, run it as a module:
`accelerate launch --config_file recipes/accelerate/zero3.yaml -m align train recipes/apertus-70b/qrpo.yaml`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from align import stopping
from align.errors import AlignError
from align.stage_table import STAGES, command_module, parses_own_args, summaries

USAGE = """usage: align STAGE [RECIPE.yaml] [key=value ...]
       align STAGE --help

Stages:
{stages}

A recipe is a YAML file of the stage's keys, or a pipeline recipe (steps, or one section
per stage: the command runs the recipe's one step of that stage; `align step RECIPE NAME`
runs any step); key=value arguments override it (nested keys with dots, values parsed as
YAML). `align STAGE --help` lists every key with its type and default."""


def _usage() -> str:
    lines = summaries()
    width = max(map(len, lines))
    return USAGE.format(stages="\n".join(f"  {n.ljust(width)}  {s}" for n, s in lines.items()))


def stage_help(name: str) -> str:
    """The stage's docstring, then every recipe key with type, default and meaning."""
    from align.config import describe

    module = command_module(name)
    doc = (module.__doc__ or "").strip()
    usage = getattr(module, "USAGE", f"align {name} [RECIPE.yaml] [key=value ...]")
    keys = getattr(module, "KEYS_TITLE", "Recipe keys")
    required = getattr(module, "REQUIRED_KEYS", {})
    must = "".join(f"  {key}: {why}\n" for key, why in required.items())
    first = f"Keys to set (no default stands for them):\n{must}\n" if must else ""
    return f"usage: {usage}\n\n{doc}\n\n{first}{keys} (all):\n{describe(module.Config)}"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader of stdout went away (`align demo --help | head`): not an error of ours.
        # Point stdout at nothing so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from importlib.metadata import version

        print(version("align"))
        return 0
    name, rest = argv[0], argv[1:]
    if name == "demo":  # before reading the recipe loads torch: the demo's kernels are pinned
        from align.demo.environment import pin_cpu_kernels

        pin_cpu_kernels()
    if name not in summaries():
        print(f"align: unknown stage {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if any(a in ("-h", "--help") for a in rest):
        print(stage_help(name))
        return 0
    module = command_module(name)
    if name in ("step", "pipeline") or (name in STAGES and STAGES[name].job in ("array", "launch")):
        stopping.install()  # long stages (and the jobs that run them) stop at a safe point on request
    try:
        if os.environ.get("ALIGN_CODE"):  # a submitted job: it runs the code its submission froze
            from align.drivers.submit_checks import check_frozen_code

            check_frozen_code()
        if parses_own_args(name):  # a driver (its recipe is its input) or a tool with arguments of its own
            config = module.config_from_args(rest)
        else:
            from align.drivers.args import stage_config

            config = stage_config(name, rest)
        module.run(config)
    except stopping.Stopped as exc:  # asked to stop (the cluster's signal): saved, to be resumed by a rerun
        print(f"align {name}: {exc}", file=sys.stderr)
        stopping.record_stop(str(exc))
        return stopping.STOPPED_EXIT
    except AlignError as exc:  # a mistake the user can fix (align.errors); anything else is a bug
        if os.environ.get("ALIGN_TRACEBACK"):
            raise
        return _report(name, exc)
    return 0


def _report(name: str, exc: AlignError) -> int:
    """`align STAGE: ErrorClass: message` (the message names the key, file:line or record and
    field), exit status 2. Any other exception keeps its traceback (exit status 1);
    ALIGN_TRACEBACK=1 keeps it for these too."""
    print(f"align {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
