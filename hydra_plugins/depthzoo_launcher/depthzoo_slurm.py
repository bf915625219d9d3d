"""``hydra/launcher=slurm``: Hydra's submitit SLURM launcher, polling job states with ``squeue`` where the cluster
keeps no accounting (:mod:`zoo.jobs.slurm`). Importing this module (Hydra scans every plugin at start-up) needs
neither submitit nor depthzoo; the launcher imports them when it launches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
except ImportError:  # the launchers extra is not installed: no SLURM launcher to offer
    SubmititSlurmLauncher = None

if SubmititSlurmLauncher is not None:

    class SlurmLauncher(SubmititSlurmLauncher):
        """Hydra's submitit SLURM launcher, quiet where ``sacct`` cannot answer; a job stopped by its own requeue
        records no failure."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            from zoo.jobs.slurm import requeue_exit, stopping_for_requeue

            try:
                return super().__call__(*args, **kwargs)
            except Exception as error:
                if stopping_for_requeue(error):
                    raise requeue_exit(error) from error
                raise

        def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
            from zoo.signals import ignore_stop_for_requeue

            ignore_stop_for_requeue()
            return super().checkpoint(*args, **kwargs)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
            from zoo.jobs.slurm import job_state_polling, submitted

            with job_state_polling(), submitted():
                return super().launch(job_overrides, initial_job_idx)
