"""Recipes: the one reader of every recipe the project accepts, and its step graph.

A recipe is one of three shapes, all read by ``read_recipe`` into one ``Recipe``:

- **a stage file**: the keys of one stage (``recipes/apertus-8b/qrpo.yaml``); one step,
  named after the stage;
- **a pipeline with one section per stage** (``sft:``, ``sample:``, ``annotate:`` ...):
  a step per section, named after it;
- **a step graph** (``steps:``): named steps, any number of each stage type, each
  ``{stage: TYPE, ...keys}``, optionally ``from: FILE`` (a stage file whose keys the step
  starts from). A value ``@NAME`` (or ``@NAME/file.jsonl``) is step NAME's output
  directory (or a file in it): that is how a step reads an earlier step's output.

Both pipeline shapes take ``defaults`` (keys merged under every step that has them, at
every depth), ``output_dir`` (where steps write when they name no directory of their own),
``stop_after``, ``overwrite``, ``slurm`` and ``rounds`` (K repetitions of the steps that
depend on the policy, ``align.recipe.rounds``). Each step's config is built once, on
demand, from its keys (``Recipe.config``); building it inside
``align.config.deferred_device_checks`` (``devices="defer"``) lets a login node without a
GPU read a recipe whose training steps ask for bf16.
"""

from align.recipe.graph import IDENTITY_KEYS, Recipe, Step
from align.recipe.read import config_builds, read_recipe
from align.recipe.settings import PipelineSettings

__all__ = ["IDENTITY_KEYS", "PipelineSettings", "Recipe", "Step", "config_builds", "read_recipe"]
