"""SLURM through Hydra's submitit launcher (``hydra/launcher=slurm``), quiet where the cluster keeps no accounting.

submitit polls a job's state with ``sacct``; on a cluster without accounting storage (many small ones) every poll
fails and prints three lines. The launcher (``hydra_plugins.depthzoo_launcher``, :func:`job_state_polling`) asks the
cluster once (``scontrol show config``) and, there, polls with ``squeue`` instead (the controller's memory of
pending, running and recently ended jobs). Everything else is the submitit launcher's: requeue at the time limit or
on preemption (``max_num_timeout``), its checkpoint hook resubmitting the same job, which resumes from its run
directory. Once a job has asked to be requeued (:func:`requeue_requested`) SLURM stops its step: SIGTERM reaches the
job and every process it started (W&B's service among them), so whatever the job raises from then on is the stop,
not its result (:func:`stopping_for_requeue`): it records no failure that would end the requeued job's sweep.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from collections.abc import Iterator

from submitit.core.utils import FailedJobError, UncompletedJobError
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from ..errors import ZooError, first_line
from ..signals import requeue_requested

NO_ACCOUNTING = "accounting_storage/none"


@functools.cache
def accounting_enabled() -> bool:
    """Whether this cluster stores job accounting (``sacct`` answers): its AccountingStorageType is not
    ``accounting_storage/none``. Unknown (no ``scontrol``, no answer): assumed, so submitit keeps its own way."""
    try:
        shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    for line in shown.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() != NO_ACCOUNTING
    return True


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's job-state watcher reading ``squeue`` (every state the controller still holds) in sacct's format."""

    COLUMNS = {"JOBID": "JobID", "STATE": "State", "NODELIST": "NodeList"}  # squeue's header -> sacct's names

    def _make_command(self) -> list[str] | None:
        if super()._make_command() is None:  # nothing left to watch
            return None
        return ["squeue", "--me", "--states=all", "--format=%i|%T|%N"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        header, _, rows = text.partition("\n")
        names = "|".join(self.COLUMNS.get(name.strip(), name.strip()) for name in header.split("|"))
        return super().read_info(f"{names}\n{rows}")


@contextlib.contextmanager
def job_state_polling() -> Iterator[None]:
    """SLURM jobs submitted in this block report their states through ``sacct`` where the cluster keeps accounting,
    else through ``squeue`` (:class:`SqueueWatcher`)."""
    if accounting_enabled():
        yield
        return
    previous = SlurmJob.watcher
    SlurmJob.watcher = SqueueWatcher(delay_s=previous._delay_s)
    try:
        yield
    finally:
        SlurmJob.watcher = previous


class SubmissionError(ZooError):
    """The cluster refused the sweep's jobs (or there is no cluster to submit to): nothing ran."""


@contextlib.contextmanager
def submitted() -> Iterator[None]:
    """The sweep's submission: refused in one line (what sbatch said, what to change) when this machine has no
    ``sbatch`` or the cluster refuses the jobs' request (a partition it lacks, GPUs it has not)."""
    if shutil.which("sbatch") is None:
        raise SubmissionError("hydra/launcher=slurm submits with sbatch, which this machine does not have: run the "
                              "sweep on a SLURM login node, or use hydra/launcher=joblib (this machine) or "
                              "hydra/launcher=submitit_local.")
    try:
        yield
    except FailedJobError as error:
        said = next((line.strip() for line in str(error).splitlines() if "error" in line.lower()), first_line(error))
        raise SubmissionError(f"SLURM refused the sweep's jobs ({said}); check hydra.launcher.partition, "
                              "gpus_per_node, cpus_per_task, mem_gb and timeout_min against the cluster's "
                              "partitions (sinfo).") from None



def stopping_for_requeue(error: BaseException) -> bool:
    """Whether `error` only ends a job that SLURM is requeueing: raised after its checkpoint hook
    (:func:`~zoo.signals.ignore_stop_for_requeue`; a W&B connection reset by the step's SIGTERM, say), and not
    submitit's UncompletedJobError, which says it declined to requeue (too many timeouts): that is the job's result."""
    if not requeue_requested():
        return False
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, UncompletedJobError):
            return False
        cause = cause.__cause__ or cause.__context__
    return True


def requeue_exit(error: BaseException) -> SystemExit:
    """How a job stopped by its requeue ends (:func:`stopping_for_requeue`): SystemExit, which submitit records as
    nothing."""
    return SystemExit(f"requeued; stopped by {type(error).__name__}")
