"""The commands whose input is a whole recipe: ``pipeline``, ``step``, ``status``, ``submit`` and ``plan``.

A stage (``align.stages``) does one piece of work over datasets on disk; a driver reads a
recipe into its steps (``align.recipe``), checks the graph whole, and then runs the steps
(``pipeline``, ``step``), reports where they stand (``status``), submits them as SLURM jobs
(``submit``) or sizes their jobs (``plan``). ``args`` turns command-line arguments into a
recipe; every driver reads recipes through it.
"""

from align.drivers.args import load_recipe, stage_config

__all__ = ["load_recipe", "stage_config"]
