"""Pruning studies: a joblib sweep sharing one baseline and one latency table, and its report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.jobs.sweep_report import ReportError, make_report

from ..helpers import ROOT, TINY_PRUNE, run_entry


def run_sweep(base: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``prune.py -m`` over the tiny config, outputs and caches under `base`."""
    return run_entry("prune", "-m", *TINY_PRUNE, *overrides, base=base, timeout=timeout)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A 2x2 joblib sweep in the default (time-stamped) sweep directory; its jobs' processes must agree on it."""
    base = tmp_path_factory.mktemp("study")
    proc = run_sweep(base, "prune.target_speedup=1.25,1.5", "prune.search=dp,greedy", "hydra/launcher=joblib",
                     "hydra.launcher.n_jobs=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sweep_dir,) = list((base / "outputs" / "prune" / "multiruns").iterdir())
    (base / "sweep").symlink_to(sweep_dir)
    return base, proc


def job_results(base: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((base / "sweep").glob("*/results.json"))]


def test_joblib_sweep_writes_results_and_report(sweep):
    base, _ = sweep
    results = job_results(base)
    assert len(results) == 4
    assert {(r["target_speedup"], r["search"]) for r in results} == {(1.25, "dp"), (1.25, "greedy"), (1.5, "dp"),
                                                                      (1.5, "greedy")}
    for name in ("report.csv", "report.md", "pareto.png"):
        assert (base / "sweep" / name).stat().st_size > 0
    report = (base / "sweep" / "report.md").read_text()
    assert "## mobilenetv2_035" in report and report.count("| dp |") == 2 and report.count("| greedy |") == 2


def test_jobs_share_one_baseline_one_table_and_group_their_wandb_runs(sweep):
    base, proc = sweep
    results = job_results(base)
    baselines = list((base / "outputs" / "baselines").iterdir())
    assert len(baselines) == 1 and len(list(baselines[0].glob("trained.json"))) == 1
    measured = [r["table"]["measured_now"] for r in results]
    assert sorted(measured)[:-1] == [0, 0, 0] and max(measured) > 0  # one job measured, three read the cache
    assert sum(not r["importance_cached"] for r in results) == 1
    from ..wandb_reader import find_run_files, read_run

    runs = [read_run(f).run for f in find_run_files(base)]
    runs = [r for r in runs if r["name"] != "report"]
    assert len(runs) == 4 and len({r["group"] for r in runs}) == 1 and len({r["name"] for r in runs}) == 4


def test_rerun_skips_finished_jobs(sweep):
    base, _ = sweep
    before = {p: p.stat().st_mtime for p in (base / "sweep").glob("*/results.json")}
    proc = run_sweep(base, "prune.target_speedup=1.25,1.5", "prune.search=dp,greedy", "logger=none",
                     f"hydra.sweep.dir={(base / 'sweep').resolve()}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p: p.stat().st_mtime for p in (base / "sweep").glob("*/results.json")} == before
    assert (proc.stdout + proc.stderr).count("already finished") == 4


def test_rerun_with_more_values_runs_exactly_the_new_jobs(sweep, tmp_path):
    """Job directories are named after their overrides: a longer override list reuses the jobs it repeats."""
    base, _ = sweep
    copy = tmp_path / "sweep"
    shutil.copytree((base / "sweep").resolve(), copy, symlinks=True)
    before = {p.parent.name: p.read_bytes() for p in copy.glob("*/results.json")}
    proc = run_sweep(base, "prune.target_speedup=1.25,1.5,2.0", "prune.search=dp,greedy", "logger=none",
                     f"hydra.sweep.dir={copy}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = {p.parent.name: p.read_bytes() for p in copy.glob("*/results.json")}
    assert len(after) == 6 and {k: after[k] for k in before} == before  # the four old jobs untouched
    assert (proc.stdout + proc.stderr).count("already finished") == 4
    targets = {json.loads(v)["target_speedup"] for k, v in after.items() if k not in before}
    assert targets == {2.0}


def test_a_sweep_with_an_unreachable_target_runs_every_job_reports_and_exits_1(sweep, tmp_path):
    base, _ = sweep
    sweep_dir = tmp_path / "failing"
    proc = run_sweep(base, "prune.target_speedup=50,1.25", "logger=none", f"hydra.sweep.dir={sweep_dir}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert len(list(sweep_dir.glob("*/results.json"))) == 1  # the job after the failing one ran
    report = (sweep_dir / "report.md").read_text()
    assert "| failed | " in report and "prune.target_speedup=50" in report and "BudgetError" in report
    assert "1 of 2 job(s) failed" in output


def test_report_lists_failed_and_missing_jobs_and_refuses_mixed_devices(sweep, tmp_path):
    base, _ = sweep
    copy = tmp_path / "sweep"
    shutil.copytree((base / "sweep").resolve(), copy)
    jobs = sorted(p.parent for p in copy.glob("*/results.json"))
    (jobs[0] / "results.json").unlink()
    (jobs[0] / "failed.json").write_text(json.dumps({"error": "BudgetError", "message": "cannot be reached"}))
    (jobs[1] / "results.json").unlink()
    result = make_report(copy)
    assert len(result["rows"]) == 2
    problems = {(p["job"], p["status"]) for p in result["problems"]}
    assert problems == {(jobs[0].name, "failed"), (jobs[1].name, "missing")}
    assert "cannot be reached" in (copy / "report.md").read_text()
    other = json.loads((jobs[2] / "results.json").read_text())
    other["condition"] = {**other["condition"], "device_name": "NVIDIA H200"}
    other["device"] = "NVIDIA H200"
    (jobs[2] / "results.json").write_text(json.dumps(other))
    with pytest.raises(ReportError, match="different devices"):
        make_report(copy)
    mixed = make_report(copy, allow_mixed_devices=True, log_wandb=True)
    assert len(mixed["rows"]) == 2
    from ..wandb_reader import find_run_files, read_run

    (report_run,) = [read_run(f) for f in find_run_files(copy / "wandb")]
    assert report_run.run["name"] == "report" and report_run.exit_code == 0
    assert any("report/table/_type" in row for row in report_run.history)
    cli = subprocess.run([sys.executable, "-m", "zoo", "report", str(tmp_path / "nope")], capture_output=True,
                         text=True)
    assert cli.returncode == 2 and "does not exist" in cli.stderr


def test_slurm_launcher_config_composes():
    proc = subprocess.run([sys.executable, str(ROOT / "prune.py"), "hydra/launcher=slurm",
                           "hydra.launcher.partition=gpu", "--cfg", "hydra"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SlurmLauncher" in proc.stdout and "partition: gpu" in proc.stdout and "gpus_per_node: 1" in proc.stdout
    assert "max_num_timeout: 3" in proc.stdout  # requeued at its time limit: the job resumes from its cache


def test_an_optuna_study_searches_two_objectives_and_reports_its_front(tmp_path):
    """``prune.py -m experiment=mbv2_digits_optuna``: Hydra's Optuna sweeper (NSGA-II) runs 4 trials over the
    pruning settings, each returning (val/acc1, measured latency); Optuna writes its Pareto solutions and the report
    draws the measured front."""
    import yaml

    space = ("hydra.sweeper.params={prune.target_speedup:'interval(1.1,1.6)',prune.search:'choice(dp,greedy)',"
             "prune.importance:'choice(loss,block_influence)'}")
    proc = run_sweep(tmp_path, "experiment=mbv2_digits_optuna", "model=mobilenetv2_035", "prune.batch_size=2",
                     "finetune.epochs=1", "hydra.sweeper.n_trials=4", "hydra.sweeper.sampler.population_size=4",
                     space, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sweep_dir,) = list((tmp_path / "outputs" / "prune" / "multiruns").iterdir())
    results = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/results.json"))]
    assert len(results) == 4 and len({r["target_speedup"] for r in results}) == 4  # sampled, not a grid
    assert all(1.1 <= r["target_speedup"] <= 1.6 and r["search"] in ("dp", "greedy") for r in results)
    solutions = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())["solutions"]
    measured = {(r["pruned"]["metrics"]["val/acc1"], r["pruned"]["latency_ms"]) for r in results}
    assert solutions and all(tuple(s["values"]) in measured for s in solutions)  # what the jobs returned
    report = (sweep_dir / "report.md").read_text()
    assert "Pareto front (measured)" in report and (sweep_dir / "pareto.png").stat().st_size > 0
