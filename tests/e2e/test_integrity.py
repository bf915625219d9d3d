"""Study integrity: run identity and directory reuse, unique run directories, loud failures, one way to prune,
caches that cannot lie, verdicts that are computed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from zoo.errors import RunConflictError
from zoo.files import read_sealed_json, write_sealed_json
from zoo.jobs import runs

from ..helpers import ROOT, TINY_TRAIN, entry_cmd, env_for


def test_two_processes_cannot_work_in_one_directory(tmp_path):
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from zoo.jobs import runs; "
            f"c = runs.claim({str(tmp_path)!r}, 'train', {{'a': 1}}); "
            "print('claimed', flush=True); time.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        with pytest.raises(RunConflictError, match="Another process is running in"):
            runs.claim(tmp_path, "train", {"a": 1})
    finally:
        holder.kill()
        holder.wait()
    runs.claim(tmp_path, "train", {"a": 1}).release()  # free once the holder is gone


def test_parallel_launches_in_one_second_get_their_own_directories(tmp_path):
    cmd = entry_cmd("train", *TINY_TRAIN, "trainer.limit_train_batches=1", "trainer.limit_val_batches=1",
                    "logger=none", base=tmp_path)
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=env_for(tmp_path), cwd=tmp_path) for _ in range(4)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    run_dirs = list((tmp_path / "outputs" / "train" / "runs").iterdir())
    assert len(run_dirs) == 4 and all((d / "results.json").is_file() for d in run_dirs)


# ------------------------------------------------------------------------------------------ loud failures
def test_a_multirun_with_a_failing_job_runs_every_job_then_exits_1(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [*entry_cmd("train", "-m", *TINY_TRAIN, "logger=none", "data.batch_size=5000,32", base=tmp_path),
           f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_for(tmp_path), cwd=tmp_path, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    (good,) = [d for d in sweep.iterdir() if d.name.startswith("data.batch_size=32,")]
    (bad,) = [d for d in sweep.iterdir() if d.name.startswith("data.batch_size=5000,")]
    assert (good / "results.json").is_file(), output[-3000:]  # the job after the failing one ran
    failed = json.loads((bad / "failed.json").read_text())
    assert failed["error"] == "DataError" and "fewer than one batch" in failed["message"]
    assert "data.batch_size=5000" in failed["overrides"] and failed["traceback"] is None  # a user error
    assert "1 of 2 job(s) failed" in output and "data.batch_size=5000" in output


def test_a_job_that_crashes_keeps_its_traceback_and_fails_the_multirun(tmp_path):
    """An exception that is not a user error (here a value no check catches, failing inside the forward pass) is
    kept with its traceback in failed.json and the log, and still fails the multirun after every job ran."""
    sweep = tmp_path / "sweep"
    cmd = [*entry_cmd("train", "-m", *TINY_TRAIN, "logger=none", "+model.overrides.drop_rate=abc,0.0",
                      base=tmp_path), f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_for(tmp_path), cwd=tmp_path, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    (crashed,) = [d for d in sweep.iterdir() if "drop_rate=abc" in d.name]
    failed = json.loads((crashed / "failed.json").read_text())
    assert failed["error"] == "TypeError" and "Traceback (most recent call last)" in failed["traceback"]
    assert "unexpected error (a bug)" in output and "Traceback" in (crashed / "train.log").read_text()
    assert len(list(sweep.glob("*/results.json"))) == 1


# ------------------------------------------------------------------------------------- one way to prune


def test_build_table_waits_for_the_device_lock(tmp_path):
    from zoo.latency.cache import device_lock

    env = {**env_for(tmp_path), "DEPTHZOO_CACHE": str(tmp_path / "root")}
    cmd = [sys.executable, "-m", "zoo.latency", "model=mobilenetv2_035", "input_size=16", "device=cpu",
           "warmup_s=0", "min_rounds=1", "max_rounds=1", f"cache_dir={tmp_path / 'tables'}"]
    import os

    previous = os.environ.get("DEPTHZOO_CACHE")
    os.environ["DEPTHZOO_CACHE"] = env["DEPTHZOO_CACHE"]
    try:
        with device_lock(torch.device("cpu")):
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                    cwd=ROOT)
            time.sleep(12)
            assert proc.poll() is None, proc.communicate()[0][-2000:]  # still waiting for the lock we hold
            assert not list((tmp_path / "tables").glob("*.json"))
        output = proc.communicate(timeout=240)[0]
    finally:
        os.environ.pop("DEPTHZOO_CACHE") if previous is None else os.environ.update(DEPTHZOO_CACHE=previous)
    assert proc.returncode == 0, output[-2000:]
    assert "another process is timing on this device" in output


def test_latency_cache_that_is_damaged_is_reported_once_and_rebuilt(tmp_path):
    from zoo.latency import LatencyCache, LatencyCacheWarning, TableSettings, build_table

    settings = TableSettings(warmup_s=0.05, entry_warmup_s=0.0, min_rounds=2, max_rounds=2)
    kwargs = dict(input_size=16, device="cpu", cache_dir=str(tmp_path), settings=settings)
    first = build_table("mobilenetv2_035", **kwargs)
    path = LatencyCache(first.condition, tmp_path).path
    key = next(iter(first.records))
    payload = read_sealed_json(path)
    tampered = json.loads(path.read_text())  # its checksum kept, one entry changed
    tampered["entries"][key]["p10_ms"] = 1e-6  # plausible, but not what was measured
    truncated = path.read_text()[:200]
    for damaged in ("truncated", "tampered", "foreign"):
        if damaged == "foreign":  # intact and sealed, but written for another condition
            write_sealed_json(path, {**payload, "key": {**payload["key"], "batch_size": 99}})
        else:
            path.write_text(truncated if damaged == "truncated" else json.dumps(tampered))
        with pytest.warns(LatencyCacheWarning) as caught:
            again = build_table("mobilenetv2_035", **kwargs)
        assert len([w for w in caught if w.category is LatencyCacheWarning]) == 1
        assert again.n_measured == first.n_records and again.records[key]["p10_ms"] > 1e-6
        assert LatencyCache(first.condition, tmp_path).load()  # rewritten intact


def test_a_training_run_from_before_run_records_can_be_continued(tmp_path):
    """Checkpoints written before this change still load and resume: a run directory without run.json whose saved
    config lacks the keys added since (inputs, trainer.force) is adopted by trainer.resume=auto; a different config
    is still refused."""
    from zoo.training import state as ckpt

    from ..helpers import run_in_process

    args = [*TINY_TRAIN, "trainer.max_epochs=2", "logger=none", f"hydra.run.dir={tmp_path / 'run'}",
            f"paths.log_dir={tmp_path / 'outputs'}"]
    assert run_in_process("train", *args).code == 0
    run_dir = tmp_path / "run"
    state_file = run_dir / "checkpoints" / "last.state.pt"
    state = ckpt.load_state(state_file)
    state["epoch"], state["config"] = 1, {k: v for k, v in state["config"].items() if k != "inputs"}
    state["config"]["trainer"].pop("force")
    state.pop("format")
    ckpt.save_state(state, state_file)  # as an earlier version wrote it: mid-run, no run record
    for name in ("run.json", "results.json"):
        (run_dir / name).unlink()
    refused = run_in_process("train", *args, "trainer.resume=auto", "trainer.seed=3")
    assert refused.code == 2 and "no recorded config" in refused.output
    assert not (run_dir / "run.json").exists()
    again = run_in_process("train", *args, "trainer.resume=auto")
    assert again.code == 0, again.output[-3000:]
    assert "written before run records existed" in again.output and "Resumed from" in again.output
    assert json.loads((run_dir / "results.json").read_text())["epochs"] == 2
