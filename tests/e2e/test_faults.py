"""Fault injection: kills at random points of train.py and prune.py, then the same command again in the same
directory, must end with the results of a run that was never interrupted (bit-identical weights on the CPU, where the
code path is deterministic); SIGTERM saves and exits 143; a write that fails half-way leaves the previous file; a
SLURM job stopped by its own requeue records no failure.

The kill delays are random (printed on failure with their seed) and land inside the named phase: each prune.py
phase is watched for in the run's log, and the kill comes a random fraction of that phase's duration later.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import QUICK_TIMING, ROOT, assert_same_weights, entry_cmd, env_for, run_entry, snapshot

TRAIN_ARGS = ["model=mobilenetv2_035", "data.image_size=16", "data.batch_size=32", "trainer.max_epochs=3",
              "trainer.limit_train_batches=10", "trainer.progress=false", "optim.warmup_epochs=0", "logger=none",
              "trainer.resume=auto"]
PRUNE_ARGS = [*(a for a in TRAIN_ARGS[:-1] if not a.startswith("trainer.max_epochs=")), "trainer.max_epochs=3",
              "prune.batch_size=2", "prune.calib_batches=2", "finetune.epochs=2", *QUICK_TIMING]
PHASES = ("baseline", "latency_table", "importance", "finetune")


def kill_when(cmd: list[str], base: Path, *, after_line: str | None = None, after_file: str | None = None,
              delay: float, sig: int = signal.SIGKILL) -> tuple[int, str]:
    """Start `cmd`; once a line containing `after_line` appears, or a file matching the glob `after_file` under
    `base` exists (at once if neither), wait `delay` s and send `sig`."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for(base),
                            cwd=base)
    lines = []
    if after_line is not None:
        for line in proc.stdout:
            lines.append(line)
            if after_line in line:
                break
    deadline = time.time() + 240
    while after_file is not None and not list(base.glob(after_file)) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(sig)
    rest = proc.communicate(timeout=300)[0]
    return proc.returncode, "".join(lines) + rest


# ----------------------------------------------------------------------------------------------- train.py
@pytest.fixture(scope="module")
def train_reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("train-reference")
    start = time.perf_counter()
    proc = run_entry("train", *TRAIN_ARGS, base=base, run_dir=base / "run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return base / "run", time.perf_counter() - start


@pytest.mark.parametrize("attempt", range(3))
def test_train_killed_at_a_random_point_resumes_to_the_same_weights(train_reference, attempt, tmp_path):
    reference, seconds = train_reference
    seed = random.randrange(10**6)
    delay = random.Random(seed).uniform(1.0, seconds)
    cmd = entry_cmd("train", *TRAIN_ARGS, base=tmp_path, run_dir=tmp_path / "run")
    code, output = kill_when(cmd, tmp_path, after_line=None, delay=delay)
    if code == 0:
        pytest.skip(f"the run finished before the kill at {delay:.1f} s (seed {seed})")
    assert code == -signal.SIGKILL, output[-2000:]
    saved = (tmp_path / "run" / "checkpoints" / "last.state.pt").is_file()  # a state to resume from, or none yet
    again = run_entry("train", *TRAIN_ARGS, base=tmp_path, run_dir=tmp_path / "run")
    assert again.returncode == 0, f"seed {seed}, kill at {delay:.2f} s\n" + again.stdout[-3000:] + again.stderr[-3000:]
    assert ("Resumed from" in again.stdout + again.stderr) == saved  # resumed exactly when there was a state
    assert_same_weights(tmp_path / "run" / "checkpoints" / "last.safetensors",
                        reference / "checkpoints" / "last.safetensors")
    ours, theirs = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "run", reference))
    assert ours["metrics"] == theirs["metrics"] and ours["steps"] == theirs["steps"]


# ----------------------------------------------------------------------------------------------- prune.py
@pytest.fixture(scope="module")
def prune_reference(tmp_path_factory):
    """An uninterrupted prune run with a given plan (the plan, unlike the measured latencies, is deterministic)."""
    base = tmp_path_factory.mktemp("prune-reference")
    plan = base / "plan.json"
    plan.write_text(json.dumps({"remove": ["blocks.2.1", "blocks.3.1.bn1.act", "blocks.4.2.bn2.act"]}))
    args = [*PRUNE_ARGS, f"prune.plan={plan}"]
    proc = run_entry("prune", *args, base=base, run_dir=base / "run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((base / "run" / "results.json").read_text())
    return base, args, results


def baseline_checkpoint(base: Path) -> Path:
    (directory,) = (base / "outputs" / "baselines").iterdir()
    return directory / "checkpoints" / "best.safetensors"


@pytest.mark.parametrize("phase", PHASES)
def test_prune_killed_in_each_phase_completes_with_the_same_results(prune_reference, phase, tmp_path):
    reference, args, expected = prune_reference
    seed = random.randrange(10**6)
    delay = random.Random(seed).uniform(0.0, 0.8 * expected["timings_s"][phase])
    cmd = entry_cmd("prune", *args, base=tmp_path, run_dir=tmp_path / "run")
    code, output = kill_when(cmd, tmp_path, after_line=f"{phase} ...", delay=delay)
    context = f"phase {phase}, kill {delay:.2f} s after it started (seed {seed})"
    assert code == -signal.SIGKILL, context + "\n" + output[-2000:]
    assert not (tmp_path / "run" / "results.json").exists(), context
    again = run_entry("prune", *args, base=tmp_path, run_dir=tmp_path / "run")
    assert again.returncode == 0, context + "\n" + again.stdout[-3000:] + again.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    rerun = again.stdout + again.stderr
    done = PHASES[:PHASES.index(phase)]  # the phases that finished before the kill: their work is reused, not redone
    if "baseline" in done:
        assert "training the baseline" not in rerun, context
    if "latency_table" in done:
        assert results["table"]["measured_now"] == 0, context
    if "importance" in done:
        assert results["importance_cached"] is True, context
    assert results["plan"] == expected["plan"], context
    assert results["pruned"]["metrics"] == expected["pruned"]["metrics"], context
    assert results["baseline"]["metrics"] == expected["baseline"]["metrics"], context
    assert_same_weights(baseline_checkpoint(tmp_path), baseline_checkpoint(reference))
    assert_same_weights(tmp_path / "run" / "pruned.safetensors", reference / "run" / "pruned.safetensors")


def test_prune_killed_after_the_baseline_saved_a_checkpoint_resumes_it(prune_reference, tmp_path):
    """A baseline killed after its first ``best`` checkpoint is resumed, never taken as finished."""
    reference, args, expected = prune_reference
    delay = random.uniform(0.0, 0.2)
    cmd = entry_cmd("prune", *args, base=tmp_path, run_dir=tmp_path / "run")
    code, output = kill_when(cmd, tmp_path, after_file="outputs/baselines/*/checkpoints/best.safetensors",
                             delay=delay)
    assert code == -signal.SIGKILL and "latency_table ..." not in output, output[-2000:]
    again = run_entry("prune", *args, base=tmp_path, run_dir=tmp_path / "run")
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "resuming the interrupted baseline training" in out
    assert_same_weights(baseline_checkpoint(tmp_path), baseline_checkpoint(reference))
    assert json.loads((tmp_path / "run" / "results.json").read_text())["baseline"]["metrics"] == \
        expected["baseline"]["metrics"]


def test_sigterm_while_building_the_table_exits_143_and_the_rerun_completes(prune_reference, tmp_path):
    _, args, expected = prune_reference
    cmd = entry_cmd("prune", *args, base=tmp_path, run_dir=tmp_path / "run")
    code, output = kill_when(cmd, tmp_path, after_line="latency_table ...", delay=0.3, sig=signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "Stopped by signal 15; run the same command again to continue." in output
    again = run_entry("prune", *args, base=tmp_path, run_dir=tmp_path / "run")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["plan"] == expected["plan"]


# --------------------------------------------------------------------------------- writes that fail half-way
FULL_DISK = """
import json, resource, signal, sys, torch
sys.path.insert(0, {root!r})
import zoo
from zoo.files import write_sealed_json
from zoo.latency import LatencyCache
from zoo.training import state as ckpt

folder = {folder!r}
model = zoo.create_model("mobilenetv2_035", num_classes=10)
cache = LatencyCache({{"device_name": "cpu"}}, folder)
small = {{"median_ms": 1.0, "p10_ms": 1.0, "min_ms": 1.0}}
cache.merge_write({{"a": small}})
write_sealed_json(folder + "/results.json", {{"metrics": {{"val/acc1": 1.0}}}})
zoo.save_checkpoint(zoo.create_model("mobilenetv2_035", num_classes=2), folder + "/model.safetensors")
ckpt.save_state({{"model_name": "m", "step": 1}}, folder + "/last.state.pt")
print("written", flush=True)
sys.stdin.readline()  # the test snapshots the folder now
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))  # the disk is full after 20 kB of any file
writes = {{
    "cache": lambda: cache.merge_write({{f"k{{i}}": small for i in range(2000)}}),
    "results": lambda: write_sealed_json(folder + "/results.json", {{"rows": list(range(20000))}}),
    "checkpoint": lambda: zoo.save_checkpoint(model, folder + "/model.safetensors"),
    "state": lambda: ckpt.save_state({{"model_name": "m", "model": model.state_dict()}}, folder + "/last.state.pt"),
}}
for name, write in writes.items():
    try:
        write()
        print(name, "no error")
    except Exception as exc:
        print(name, "failed", type(exc).__name__)
"""


def test_writes_that_fail_half_way_leave_the_previous_file(tmp_path):
    code = FULL_DISK.format(root=str(Path(__file__).resolve().parents[2]), folder=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_for(tmp_path))
    assert proc.stdout.readline().strip() == "written", proc.stderr.read()[-3000:]
    before = snapshot(tmp_path)
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err[-3000:]
    lines = out.strip().splitlines()
    assert len(lines) == 4 and all(" failed " in line for line in lines), out
    assert snapshot(tmp_path) == before  # every previous file intact, no temp file left
    from zoo.latency import LatencyCache

    assert set(LatencyCache({"device_name": "cpu"}, tmp_path).load()) == {"a"}


REQUEUE_CHILD = """
import os, signal, sys
from omegaconf import OmegaConf
from submitit.core.utils import UncompletedJobError
from zoo.jobs.cli import run_job
from zoo.signals import ignore_stop_for_requeue, on_stop_signals

cfg = OmegaConf.create({"paths": {"output_dir": sys.argv[1]}})

def outcome(error):
    def run(cfg):
        raise error
    try:
        run_job(cfg, run, lambda results: None)
    except SystemExit as stop:
        return f"exit: {stop.code}"

def wrapped():
    try:
        raise UncompletedJobError("Job not requeued because: timed-out too many times.")
    except UncompletedJobError as cause:
        try:
            raise RuntimeError("the job's own wrapping") from cause
        except RuntimeError as error:
            return error

print(outcome(ConnectionResetError("Connection lost")))
with on_stop_signals(lambda signum, frame: print("handled", signum)):  # the hook runs while training, say
    ignore_stop_for_requeue()
os.kill(os.getpid(), signal.SIGTERM)  # SLURM stopping the requeued step: ignored, also once training's handler is gone
print(outcome(ConnectionResetError("Connection lost")))
print(outcome(UncompletedJobError("Job not requeued because: timed-out too many times.")))
print(outcome(wrapped()))
"""


def test_a_job_stopped_by_its_own_requeue_records_no_failure(tmp_path):
    """After submitit's checkpoint hook (just before ``scontrol requeue``) SIGTERM is ignored and what the job raises
    (W&B's service killed by the step's SIGTERM: a connection reset) ends it as SystemExit, not as a failed job;
    before it, and where submitit declines to requeue (UncompletedJobError, also as a cause), errors are failures."""
    pytest.importorskip("submitit")
    child = subprocess.run([sys.executable, "-c", REQUEUE_CHILD, str(tmp_path)], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.splitlines() == ["exit: 1", "exit: requeued; stopped by ConnectionResetError", "exit: 1",
                                         "exit: 1"], child.stderr[-2000:]
