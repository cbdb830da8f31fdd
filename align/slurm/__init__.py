"""Recipe steps as SLURM jobs: the recipe's ``slurm:`` section, the batch scripts, sbatch and squeue.

``align submit`` (``align.drivers.submit``) decides which steps to submit; this package
only knows SLURM: the settings (``config``), the script written for a step (``scripts``)
and the client commands (``commands``).
"""

from align.slurm.commands import active_jobs, dependency_options, sbatch, sbatch_test_only
from align.slurm.config import ARRAY_STAGES, LAUNCH_STAGES, SINGLE_STAGES, STEP_STAGES, JobSettings, SlurmConfig
from align.slurm.scripts import SHIPPED_SCRIPTS, StepJob, array_spec, kind_of

__all__ = [
    "ARRAY_STAGES",
    "LAUNCH_STAGES",
    "SHIPPED_SCRIPTS",
    "SINGLE_STAGES",
    "STEP_STAGES",
    "JobSettings",
    "SlurmConfig",
    "StepJob",
    "active_jobs",
    "array_spec",
    "dependency_options",
    "kind_of",
    "sbatch",
    "sbatch_test_only",
]
