"""Stages as SLURM jobs: the recipe's ``slurm:`` section, the batch scripts, sbatch and squeue.

``align submit`` (``align.stages.submit``) decides which stages to submit; this package
only knows SLURM: the settings (``config``), the scripts written for a stage
(``scripts``) and the client commands (``commands``).
"""

from align.slurm.commands import active_jobs, dependency_options, sbatch, sbatch_test_only
from align.slurm.config import ARRAY_STAGES, LAUNCH_STAGES, SINGLE_STAGES, JobSettings, SlurmConfig
from align.slurm.scripts import SHIPPED_SCRIPTS, StageJob, array_spec, kind_of

__all__ = [
    "ARRAY_STAGES",
    "LAUNCH_STAGES",
    "SHIPPED_SCRIPTS",
    "SINGLE_STAGES",
    "JobSettings",
    "SlurmConfig",
    "StageJob",
    "active_jobs",
    "array_spec",
    "dependency_options",
    "kind_of",
    "sbatch",
    "sbatch_test_only",
]
