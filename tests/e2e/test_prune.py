"""prune.py as a user runs it, in a subprocess: tiny digits and bytes runs with their W&B run and lineage, SIGTERM and
resume, torchrun, the language-model layer-removal rules, and the default run's measured target. The prune job's
results, planning and refusals in this process are in ``tests/unit/test_prune_job.py``; its slower runs on the
shared baseline (a second job reusing its caches, given plans, a memory budget, recovery steps) are here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo

from ..helpers import (
    ROOT,
    TINY_LM,
    TINY_PRUNE,
    assert_tiny_prune_results,
    entry_cmd,
    env_for,
    prune_in_process,
    run_prune,
)
from ..wandb_reader import find_run_files, read_run

TINY = TINY_PRUNE


@pytest.fixture(scope="module")
def digits_prune(tmp_path_factory):
    base = tmp_path_factory.mktemp("prune_digits")
    proc = run_prune(*TINY, "prune.export=onnx", base=base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return base, proc


def test_prune_py_digits_end_to_end(digits_prune):
    base, proc = digits_prune
    assert_tiny_prune_results(base, proc.stdout)


def test_memory_budget_is_met_or_refused(digits_prune, tmp_path):
    base, _ = digits_prune
    first = json.loads((base / "run" / "results.json").read_text())
    budget = first["predicted_peak_memory_mb"]
    assert budget > 0
    proc = prune_in_process(*TINY, f"prune.max_memory_mb={budget}", "finetune.epochs=0",
                            "prune.target_corrections=0", "prune.search=dp", base=base,
                     run_dir=tmp_path / "fits")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "fits" / "results.json").read_text())["predicted_peak_memory_mb"] <= budget
    proc = prune_in_process(*TINY, "prune.max_memory_mb=0.000001", base=base, run_dir=tmp_path / "no")
    assert proc.returncode == 2 and "cannot be met" in proc.stdout + proc.stderr


def test_recovery_steps_judge_the_finalists_after_training(digits_prune, tmp_path):
    """prune.recovery_steps > 0: the interaction search's finalists are scored after that many SGD steps on the
    training batches beyond the calibration ones; the chosen plan's recovered loss is recorded (one-shot: none)."""
    base, _ = digits_prune
    first = json.loads((base / "run" / "results.json").read_text())
    assert first["search_result"]["recovered"] is None  # the default judges one-shot
    proc = prune_in_process(*TINY, "prune.recovery_steps=3", "finetune.epochs=0", "prune.target_corrections=0",
                            base=base, run_dir=tmp_path / "run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    recovered = results["search_result"]["recovered"]
    assert results["search_result"]["method"] == "interaction" and recovered is not None
    assert math.isfinite(recovered) and recovered > 0


def test_second_job_reuses_baseline_table_and_importance(digits_prune):
    base, _ = digits_prune
    proc = prune_in_process(*TINY, "prune.target_speedup=1.25", "prune.target_corrections=0", "prune.search=dp",
                            base=base, run_dir=base / "run2")  # (the DP: the reuse is the point, not the search)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((base / "run2" / "results.json").read_text())
    assert results["table"]["measured_now"] == 0 and results["importance_cached"] is True
    assert "training the baseline" not in proc.stdout + proc.stderr
    assert len(list((base / "outputs" / "baselines").iterdir())) == 1


def test_given_plan_file_and_bad_plan_file(digits_prune, tmp_path):
    base, _ = digits_prune
    good = tmp_path / "plan.json"
    good.write_text(json.dumps({"remove": ["blocks.2.1", "blocks.3.1.bn1.act"]}))
    proc = prune_in_process(*TINY, f"prune.plan={good}", "finetune.epochs=0", base=base,
                     run_dir=tmp_path / "given")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "given" / "results.json").read_text())["plan"]["remove"] == [
        "blocks.2.1", "blocks.3.1.bn1.act"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"remove": ["body.layer1.0"]}))
    proc = prune_in_process(*TINY, f"prune.plan={bad}", base=base, run_dir=tmp_path / "bad")
    assert proc.returncode == 2 and "not depth units" in proc.stdout + proc.stderr


def test_prune_wandb_run_holds_tables_plan_and_results(digits_prune):
    base, _ = digits_prune
    results = json.loads((base / "run" / "results.json").read_text())
    (run_file,) = find_run_files(base / "run")
    run = read_run(run_file)
    assert run.exit_code == 0
    assert run.summary["pruned/latency_ms"] == pytest.approx(results["pruned"]["latency_ms"])
    assert run.summary["prune/measured_speedup"] == pytest.approx(results["measured_speedup"])
    assert json.loads(run.summary["prune/plan_json"])["remove"] == results["plan"]["remove"]
    logged = {k for row in run.history for k in row}
    for media in ("prune/lookup_table", "prune/plan", "prune/pareto"):
        assert f"{media}/_type" in logged
    assert any(k.startswith("train/") for k in logged)  # the fine-tuning curves
    media = list((run_file.parent / "files" / "media").rglob("*"))
    assert any(p.suffix == ".png" for p in media) and any(p.name.endswith(".table.json") for p in media)


def test_the_prune_run_logs_its_lineage_as_linked_artifacts(digits_prune):
    """Baseline weights, latency table, plan and pruned checkpoint (with its card) are artifacts of the offline run;
    each names the digests of what it was made from."""
    base, _ = digits_prune
    results = json.loads((base / "run" / "results.json").read_text())
    (run_file,) = find_run_files(base / "run")
    artifacts = {a["name"]: a for a in read_run(run_file).artifacts if a["type"] != "run_table"}  # not wandb.Table's
    names = [f"mobilenetv2_035-{kind}" for kind in ("baseline", "latency-table", "plan", "pruned")]
    assert sorted(artifacts) == sorted(names)
    baseline, table, plan, pruned = (artifacts[n] for n in names)
    assert [a["type"] for a in (baseline, table, plan, pruned)] == ["model", "latency-table", "plan", "model"]
    assert baseline["files"] == ["best.safetensors"] and pruned["files"] == ["README.md", "pruned.safetensors"]
    assert table["metadata"]["baseline"] == baseline["digest"]
    assert plan["metadata"]["baseline"] == baseline["digest"] and plan["metadata"]["latency_table"] == table["digest"]
    assert pruned["metadata"]["plan"] == plan["digest"] and pruned["metadata"]["baseline"] == baseline["digest"]
    assert results["lineage"][names[3]]["digest"] == pruned["digest"]
    table_file = json.loads((base / "run" / "latency_table.json").read_text())
    assert [s["name"] for s in table_file["segments"]] and table_file["fixed_ms"] > 0


@pytest.mark.parametrize("workload", ["forward", "decode"])
def test_prune_py_bytes_language_model(workload, tmp_path):
    proc = run_prune(*TINY_LM, f"prune.workload={workload}", "prune.export=torch_export", base=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["workload"] == workload and results["plan"]["remove"]
    expected_form = {"forward": "parallel", "decode": "recurrent"}[workload]  # the decode step for decode pruning
    assert results["export"]["form"] == expected_form and results["export"]["passed"]
    assert (tmp_path / "run" / "pruned.pt2").is_file()
    assert all(name.endswith((".retention", ".ffn")) for name in results["plan"]["remove"])
    assert "val/ppl" in results["pruned"]["metrics"]
    assert results["predicted_speedup"] > 1.0 and results["measured_speedup"] > 0  # measured times: the serial tier
    (run_file,) = find_run_files(tmp_path / "run")
    assert read_run(run_file).summary["pruned/val/ppl"] == pytest.approx(results["pruned"]["metrics"]["val/ppl"])


def with_changes(overrides: list[str], *changes: str) -> list[str]:
    """`overrides` with `changes` replacing the entries for the same keys (Hydra refuses duplicates)."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in overrides if o.split("=", 1)[0] not in keys] + list(changes)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_sigterm_during_fine_tuning_then_rerun_resumes_to_the_same_weights(tmp_path):
    """SIGTERM while fine-tuning saves ``last`` and exits 143; the same command then keeps the plan, really trains
    the remaining epochs, and ends with the weights of a run that was never interrupted."""
    import signal
    import time

    # no measured-target corrections: they re-search on a noisy timing, and this test compares two runs' plans
    args = with_changes(TINY, "logger=none", "finetune.epochs=3", "trainer.limit_train_batches=null",
                        "prune.target_corrections=0")
    reference = run_prune(*args, base=tmp_path, run_dir=tmp_path / "reference")
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    run_dir = tmp_path / "killed"
    cmd = entry_cmd("prune", *args, base=tmp_path, run_dir=run_dir)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for(tmp_path),
                            cwd=tmp_path)
    state_file = run_dir / "finetune" / "checkpoints" / "last.state.pt"
    deadline = time.time() + 240
    while not state_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "Run the same command again: fine-tuning resumes" in output and not (run_dir / "results.json").exists()
    from zoo.training import state as ckpt

    stopped_at = ckpt.load_state(state_file)["step"]
    assert 0 < stopped_at < ckpt.load_state(tmp_path / "reference" / "finetune" / "checkpoints" /
                                            "last.state.pt")["step"]
    rerun = run_prune(*args, base=tmp_path, run_dir=run_dir)
    out = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, out[-3000:]
    assert "Resumed from" in out and "resuming with the plan this run chose" in out
    first, again = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "reference", run_dir))
    assert again["plan"] == first["plan"] and again["search_result"] is None
    assert again["pruned"]["metrics"] == first["pruned"]["metrics"]
    ours, theirs = _tensors(run_dir / "pruned.safetensors"), _tensors(tmp_path / "reference" / "pruned.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    rerun = run_prune(*args, base=tmp_path, run_dir=run_dir)  # finished: skipped, nothing rewritten
    assert rerun.returncode == 0 and "already finished" in rerun.stdout + rerun.stderr


def test_torchrun_prune_two_cpu_processes(tmp_path):
    """torchrun prune.py: table, importance and search once (rank 0), DDP fine-tuning, one results.json."""
    from safetensors.torch import save_file

    weights = tmp_path / "timm_mobilenetv2_035.safetensors"  # timm-format weights: the baseline as it is
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in zoo.create_model("mobilenetv2_035", num_classes=10).state_dict().items()},
              str(weights))
    env = env_for(tmp_path)
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(ROOT / "prune.py"), "trainer=ddp", *TINY, f"paths.log_dir={tmp_path / 'logs'}",
            f"prune.cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run([*base, f"checkpoint={weights}", f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["world_size"] == 2 and results["plan"]["remove"]
    assert results["baseline"]["source"] == str(weights) and not (tmp_path / "logs" / "baselines").exists()
    assert results["table"]["measured_now"] > 0 and len(find_run_files(tmp_path / "run")) == 1
    assert (proc.stdout + proc.stderr).count("latency_table done") == 1  # once, on rank 0
    pruned = zoo.load(results["checkpoint"])
    assert pruned.zoo_plan["remove"] == results["plan"]["remove"]

    proc = subprocess.run([*base, f"hydra.run.dir={tmp_path / 'run2'}"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)  # no weights and no cached baseline: refused, not hung
    assert proc.returncode != 0 and "Under torchrun, prune.py starts from given weights" in proc.stdout + proc.stderr


@pytest.mark.parametrize("rule", [["prune.search=sleb"], ["prune.search=angular", "prune.importance=block_influence"]],
                         ids=["sleb", "angular-block-influence"])
def test_prune_py_layer_removal_rules_of_language_models(rule, tmp_path):
    """SLEB's iterative removal and Gromov et al.'s contiguous run (with ShortGPT's Block Influence as the logged
    importance) prune a RetNet end to end: whole sub-layers only, predicted faster (this tier runs beside another
    worker, so a measured speed-up is asserted only in the serial tier)."""
    proc = run_prune(*TINY_LM, *rule, base=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    search = rule[0].split("=")[1]
    assert results["search"] == search and results["search_result"]["method"] == search
    removed = results["plan"]["remove"]
    assert removed and all(name.endswith((".retention", ".ffn")) for name in removed)
    if search == "angular":  # one contiguous run of sub-layers, in depth order
        order = [f"blocks.{i}.{kind}" for i in range(2) for kind in ("retention", "ffn")]
        positions = sorted(order.index(name) for name in removed)
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    assert results["predicted_speedup"] > 1.0 and results["measured_speedup"] > 0


@pytest.mark.serial  # asserts a measured speed-up: never beside another worker
def test_the_default_run_keeps_its_measured_target(tmp_path):
    """``python prune.py`` as the README runs it (every default: MobileNetV2-0.5 on digits, target 1.5x, the
    interaction search): the final side-by-side measurement of the pruned network is within prune.target_tolerance
    of the target."""
    proc = run_prune(base=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    check = results["target_check"]
    assert results["search"] == "interaction" and check["wanted_speedup"] == 1.5 and check["tolerance"] == 0.05
    assert abs(results["measured_speedup"] / 1.5 - 1) <= 0.05, check
    assert check["met"] is True


def test_prune_py_and_train_py_take_any_timm_model_by_its_name(tmp_path):
    """``python prune.py model=timm model.name=resnet18`` and ``python train.py model=timm model.name=resnet18`` as a
    user runs them: the discovered model trained, pruned, saved and reloaded by its timm name."""
    out = run_prune(*TINY[1:], "model=timm", "model.name=resnet18", "logger=none", "prune.target_speedup=1.3",
                    base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model"] == "timm/resnet18" and "discovered from the graph" in results["depth_units"]
    assert zoo.load(results["checkpoint"]).zoo_plan["remove"] == results["plan"]["remove"]
    from ..helpers import run_train

    trained = run_train("model=timm", "model.name=resnet18", "data.image_size=16", "trainer.max_epochs=1",
                        "trainer.limit_train_batches=2", "trainer.progress=false", "logger=none",
                        run_dir=tmp_path / "train")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert json.loads((tmp_path / "train" / "results.json").read_text())["model"] == "timm/resnet18"

