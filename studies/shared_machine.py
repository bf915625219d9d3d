"""Two prune jobs on one machine: a 2-job Hydra joblib study against the same two jobs run one after the other.

A joblib study runs its jobs at once on one machine by design. Each job sets its torch threads from
``trainer.threads`` (default: the cores divided by the jobs sharing them, ``zoo.training.resources.set_threads``); the
suite times, side by side in one run and each in a fresh output folder and latency cache:

- ``sequential``: ``prune.py`` with the first target, then with the second (the second reuses the baseline, table and
  importance the first made), each alone with every core;
- ``joblib``: ``prune.py -m prune.target_speedup=A,B hydra/launcher=joblib hydra.launcher.n_jobs=2`` with today's
  default threads (one per job on two cores);
- ``joblib_all_cores``: the same with ``trainer.threads=<cores>``, every job taking every core (PyTorch's default
  before the setting existed).

Target: the joblib study takes at most 1.1x the sequential pair.
``python -m studies.shared_machine --out results`` (about 10 minutes on 2 cores); ``--quick``: tiny jobs and the first
two modes, one thread per job (a smoke test: beside a test worker a job with every core oversubscribes the machine;
the sequential pair then took 132 s instead of 24 s, and 579 s in one CI run).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Check,
    CommandLine,
    judge,
    out_folder,
    write_result,
)
from studies.jobs import job_command
from zoo.errors import run_command

TARGET_RATIO = 1.1
TARGETS = (1.25, 1.5)
QUICK = ["model=mobilenetv2_035", "data.image_size=16", "trainer.max_epochs=1", "trainer.limit_train_batches=4",
         "trainer.threads=1",  # a smoke test beside a test worker: every core per job oversubscribes (5x slower)
         "prune.batch_size=2", "prune.calib_batches=1", "finetune.epochs=1",
         "++prune.table={warmup_s: 0.2, min_rounds: 3, max_rounds: 5}",
         "++prune.measure={warmup_s: 0.2, min_rounds: 3, max_rounds: 5}"]
MODES = ("sequential", "joblib", "joblib_all_cores")
QUICK_MODES = MODES[:2]  # the judged pair


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def prune_command(overrides: list[str], folder: Path, multirun: bool, name: str = "run") -> list[str]:
    """``python prune.py`` with its outputs under `folder` (W&B off: the suite times the jobs, not a logger)."""
    place = [f"paths.log_dir={folder / 'outputs'}", "logger=none", "trainer.progress=false"]
    where = [f"hydra.sweep.dir={folder / 'sweep'}"] if multirun else [f"hydra.run.dir={folder / name}"]
    return job_command("prune.py", [*(["-m"] if multirun else []), *overrides, *place, *where])


def timed(commands: list[list[str]], folder: Path) -> float:
    """Seconds to run `commands` one after the other in a clean environment of their own (a fresh latency cache,
    no inherited thread count); a failing command stops the suite with its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(DEPTHZOO_CACHE=str(folder / "cache"), WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    for command in commands:
        proc = subprocess.run(command, capture_output=True, text=True, cwd=folder, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command[1:4])} ... failed ({proc.returncode}): "
                               f"{(proc.stdout + proc.stderr)[-2000:]}")
    return time.perf_counter() - start


def mode_commands(mode: str, base: list[str], folder: Path) -> list[list[str]]:
    if mode == "sequential":
        return [prune_command([*base, f"prune.target_speedup={t}"], folder, multirun=False, name=f"run{t}")
                for t in TARGETS]
    threads = [f"trainer.threads={cores()}"] if mode == "joblib_all_cores" else []
    sweep = [*base, *threads, f"prune.target_speedup={','.join(map(str, TARGETS))}", "hydra/launcher=joblib",
             "hydra.launcher.n_jobs=2"]
    return [prune_command(sweep, folder, multirun=True)]


def run(quick: bool = False, device: str = "cpu", out: str | None = None, **_: Any) -> dict[str, Any]:
    """Time the modes in turn (quick: :data:`QUICK_MODES`), each in a fresh folder; returns the seconds and the ratios
    to sequential."""
    base = [*(QUICK if quick else []), f"prune.device={'cpu' if device == 'auto' else device}"]
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="shared_machine-") as root:
        for mode in QUICK_MODES if quick else MODES:
            folder = Path(root) / mode
            folder.mkdir()
            seconds[mode] = round(timed(mode_commands(mode, base, folder), folder), 1)
            print(f"shared_machine: {mode} {seconds[mode]} s", flush=True)
    result = {"suite": "shared_machine", "quick": quick, "cores": cores(), "targets": list(TARGETS),
              "seconds": seconds,
              "ratio": {m: round(seconds[m] / seconds["sequential"], 3) for m in seconds if m != "sequential"}}
    judge("shared_machine", result)
    write_result("shared_machine", result, out)
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    ratio = (result.get("ratio") or {}).get("joblib")
    return [Check(f"a 2-job joblib study <= {TARGET_RATIO}x the same jobs in sequence", ratio, "<=", TARGET_RATIO)]


def markdown(result: dict[str, Any]) -> str:
    s, r = result["seconds"], result["ratio"]
    return "\n".join([
        f"Two prune.py jobs (targets {', '.join(map(str, result['targets']))}) on {result['cores']} cores:", "",
        "| mode | seconds | / sequential |", "|---|---:|---:|",
        f"| one after the other, each with {'one thread' if result['quick'] else 'every core'} | "
        f"{s['sequential']:.1f} | 1.00 |",
        f"| joblib, 2 jobs at once, today's default threads | {s['joblib']:.1f} | {r['joblib']:.2f} |",
        *([f"| joblib, 2 jobs at once, every job taking every core | {s['joblib_all_cores']:.1f} | "
           f"{r['joblib_all_cores']:.2f} |"] if "joblib_all_cores" in s else []), "", f"Status: {result['status']}."])


def command_line() -> CommandLine:
    parser = CommandLine("studies.shared_machine", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, args.device, args.out)))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
