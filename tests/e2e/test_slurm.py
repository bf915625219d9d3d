"""The cluster path on a real one-node SLURM cluster (``.ci/slurm up``: slurm-wlm and munge, no accounting storage):
``prune.py -m`` and ``train.py -m`` sweeps through ``hydra/launcher=slurm``, a job requeued at its time limit that
finishes with an uninterrupted run's result, and DDP training started by ``srun`` (two tasks, or torchrun in one).

Without a cluster these tests skip with the reason; CI brings one up and sets DEPTHZOO_REQUIRE_SLURM=1, which makes a
missing cluster a failure. Serial: SLURM hands out this machine's cores, so nothing else may run beside them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import ROOT, TINY_PRUNE, TINY_TRAIN, assert_same_weights, entry_cmd, env_for


def cluster_missing() -> str | None:
    """Why no SLURM cluster can run jobs here, or None when one can."""
    if shutil.which("sinfo") is None or shutil.which("srun") is None:
        return "no SLURM client (sinfo, srun) on this machine: start one with .ci/slurm up"
    shown = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if shown.returncode != 0 or not {"idle", "mixed", "allocated"} & set(shown.stdout.split()):
        return f"no SLURM node is up ({(shown.stderr or shown.stdout).strip() or 'sinfo shows none'}): .ci/slurm up"
    return None


MISSING = cluster_missing()
if MISSING and os.environ.get("DEPTHZOO_REQUIRE_SLURM") == "1":
    raise RuntimeError(f"DEPTHZOO_REQUIRE_SLURM=1 but {MISSING}")
pytestmark = [pytest.mark.serial, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.gpus_per_node=0",
            "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2"]


def sweep(script: str, base: Path, *overrides: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, Path]:
    """``<script>.py -m`` through the SLURM launcher, outputs under `base`; the process and its sweep directory."""
    proc = subprocess.run(entry_cmd(script, "-m", *overrides, base=base), capture_output=True, text=True,
                          timeout=timeout, env=env_for(base), cwd=base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sweep_dir,) = list((base / "outputs" / script / "multiruns").iterdir())
    return proc, sweep_dir


def results_of(sweep_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/results.json"))]


def test_a_prune_sweep_runs_on_slurm_with_the_cores_it_was_given(tmp_path):
    """Two points, each a SLURM job given one CPU: each uses one thread and says the allocation set it; the
    sweep's report covers both; polling says nothing (this cluster keeps no accounting: squeue, not sacct)."""
    proc, sweep_dir = sweep("prune", tmp_path, *TINY_PRUNE, *ON_SLURM, "hydra.launcher.timeout_min=15",
                            "prune.target_speedup=1.25,1.5")
    results = results_of(sweep_dir)
    assert sorted(r["target_speedup"] for r in results) == [1.25, 1.5]
    for result in results:
        threads = result["threads"]
        assert threads["threads"] == 1 and threads["cores"] == 1, threads
        assert threads["cores_from"] in ("the CPU affinity mask", "SLURM_CPUS_PER_TASK"), threads
    assert "(2 jobs, 0 without results)" in proc.stdout + proc.stderr
    assert "sacct" not in proc.stdout + proc.stderr


def test_a_request_the_cluster_cannot_meet_is_refused_in_one_line(tmp_path):
    """A sweep asking this CPU-only cluster for a GPU (the config's default gpus_per_node=1): SLURM refuses the
    jobs, and the sweep says so in one line with what to check, exit 2."""
    proc = subprocess.run(entry_cmd("prune", "-m", *TINY_PRUNE, "hydra/launcher=slurm",
                                    "hydra.launcher.partition=debug", "prune.target_speedup=1.25,1.5", base=tmp_path),
                          capture_output=True, text=True, timeout=300, env=env_for(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "SLURM refused the sweep's jobs" in errors[0] and "gpus_per_node" in errors[0]
    assert "Traceback" not in proc.stderr


def test_a_train_sweep_runs_on_slurm(tmp_path):
    _, sweep_dir = sweep("train", tmp_path, *TINY_TRAIN, *ON_SLURM, "hydra.launcher.timeout_min=10",
                         "optim.lr=0.001,0.002")
    results = results_of(sweep_dir)
    assert len(results) == 2 and all(r["steps"] == 4 and r["threads"]["threads"] == 1 for r in results)


# A longer job than TINY_PRUNE (about 130 s on one core of CI's machine, longer here), on a fixed plan: the search's
# latencies are measured, so only a fixed plan makes two runs comparable; everything else (training, fine-tuning) is
# seeded. Its limit: 4 minutes, signalled 150 s before, which SLURM may do up to 60 s earlier still: 30 to 90 s after
# the start, so the job is still running (a signal before submitit's handler is in place, in the first seconds, would
# kill the job instead; a job done before 90 s would never be cut, as 8 epochs were on CI's machine).
REQUEUED = [*TINY_PRUNE, "trainer.limit_train_batches=null", "trainer.max_epochs=20", "finetune.epochs=20"]
TIME_LIMIT = ["hydra.launcher.timeout_min=4", "hydra.launcher.signal_delay_s=150", "hydra.launcher.max_num_timeout=8"]
PLAN = {"remove": ["blocks.3.1", "blocks.3.2", "blocks.4.1.bn1.act"], "merge": True}


def job_record(job: str, wait_s: float = 120) -> str:
    """``scontrol show job``'s record once the job has ended: the sweep collects a job's result as soon as its
    result file is written, while SLURM may still show the job RUNNING for a few seconds after."""
    deadline = time.monotonic() + wait_s
    while True:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
        if "JobState=RUNNING" not in shown and "JobState=COMPLETING" not in shown or time.monotonic() > deadline:
            return shown
        time.sleep(2)


def test_a_job_requeued_at_its_time_limit_ends_as_an_uninterrupted_one(tmp_path):
    """A four-minute time limit: SLURM signals the job before it, submitit requeues it (max_num_timeout), and the
    requeued job resumes from the stages its run directory holds. Its plan, baseline and pruned metrics and pruned
    weights equal those of the same job run without a limit."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    whole = tmp_path / "whole"
    whole.mkdir()
    proc = subprocess.run(entry_cmd("prune", *REQUEUED, f"prune.plan={plan}", base=whole, run_dir=whole / "run"),
                          capture_output=True, text=True, timeout=600, env=env_for(whole), cwd=whole)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cut = tmp_path / "cut"
    cut.mkdir()
    _, sweep_dir = sweep("prune", cut, *REQUEUED, f"prune.plan={plan}", *ON_SLURM, *TIME_LIMIT)
    (job,) = [p.name for p in sweep_dir.glob(".submitit/*") if p.name.isdigit()]
    shown = job_record(job)
    # SLURM's own record says it was cut and started again (the job's log file cannot: a requeued job truncates it)
    assert int(shown.split("Restarts=")[1].split()[0]) >= 1 and "JobState=COMPLETED" in shown, shown
    (cut_result,) = results_of(sweep_dir)  # ... and finished after its requeue
    whole_result = json.loads((whole / "run" / "results.json").read_text())
    assert cut_result["plan"] == whole_result["plan"] == PLAN
    for stage in ("baseline", "pruned"):
        assert cut_result[stage]["metrics"] == whole_result[stage]["metrics"], stage
    (cut_weights,) = sweep_dir.glob("*/pruned.safetensors")
    assert_same_weights(cut_weights, whole / "run" / "pruned.safetensors")  # (their metadata name their run folders)


def test_ddp_training_started_by_srun(tmp_path):
    """``srun --ntasks=2 python train.py`` (each task a rank, from SLURM's variables) and ``srun --ntasks=1
    torchrun --nproc_per_node=2 train.py`` train the same two-process DDP run: half the steps of one process, and
    the same metrics."""
    overrides = ["trainer=ddp", *[o for o in TINY_TRAIN if not o.startswith("trainer.limit_train_batches")]]
    runs = {"tasks": ["srun", "--ntasks=2", "--cpus-per-task=1", sys.executable, str(ROOT / "train.py")],
            "torchrun": ["srun", "--ntasks=1", "--cpus-per-task=2", sys.executable, "-m", "torch.distributed.run",
                         "--standalone", "--nproc_per_node=2", str(ROOT / "train.py")]}
    results = {}
    for name, launch in runs.items():
        base = tmp_path / name
        base.mkdir()
        cmd = [*launch, *overrides, f"paths.log_dir={base / 'outputs'}", f"hydra.run.dir={base / 'run'}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env_for(base), cwd=base)
        assert proc.returncode == 0, name + proc.stdout[-3000:] + proc.stderr[-3000:]
        results[name] = json.loads((base / "run" / "results.json").read_text())
    batch = int(next(o for o in TINY_TRAIN if o.startswith("data.batch_size=")).split("=")[1])
    for result in results.values():
        assert result["steps"] == result["data_info"]["train_samples"] // (2 * batch)  # two ranks share the epoch
    assert results["tasks"]["metrics"] == results["torchrun"]["metrics"]
