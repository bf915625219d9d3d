"""prune.py with prune.heal=linear: the plan's runs of removed blocks healed by fused channel maps (results.json says
which, the fit's cost, and the one-shot metrics healed and not), the measured speed-up as without healing; a given
plan whose run cannot be healed refused with the reason, exit 2."""

from __future__ import annotations

import json

from ..helpers import TINY_LM, TINY_PRUNE, prune_in_process


def test_prune_py_heals_the_plan_and_reports_one_shot_metrics_beside_the_unhealed(tmp_path):
    plan = tmp_path / "plan.json"  # two runs of removed blocks and an activation (which no patch is for)
    plan.write_text(json.dumps({"remove": ["blocks.3.1", "blocks.3.2", "blocks.5.1", "blocks.4.1.bn1.act"]}))
    out = prune_in_process(*TINY_PRUNE, "logger=none", "prune.heal=linear", f"prune.plan={plan}", "prune.export=onnx",
                           base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["export"]["passed"] is True  # the ONNX file carries the healed weights: its logits are ours
    heal = results["heal"]
    assert [(p["before"], p["gap"]) for p in heal["patches"]] == [("blocks.3.0", ["blocks.3.1", "blocks.3.2"]),
                                                                   ("blocks.5.0", ["blocks.5.1"])]
    assert not heal["unhealed"] and all(p["error_healed"] < p["error_unhealed"] for p in heal["patches"])
    latency = heal["latency"]  # the same plan unhealed, timed beside it (the patch adds no op)
    assert latency["healed_ms"] == results["runtimes"]["eager"]["pruned_ms"] and latency["unhealed_ms"] > 0
    assert latency["verdict"] == ("tie" if abs(latency["ratio"] - 1) <= latency["noise"] else
                                  "slower" if latency["ratio"] > 1 else "faster")
    assert not {"unhealed", "unhealed_eager"} & set(results["measurements"])
    assert set(heal["one_shot"]) == {"healed", "unhealed"} and all("val/acc1" in m for m in heal["one_shot"].values())
    assert heal["fit_seconds"] >= 0 and heal["calibration_batches"] == 1
    assert set(heal["finetuned"]) == {"healed", "unhealed"}  # the same plan fine-tuned unhealed, same seed
    assert heal["finetuned"]["healed"]["val/acc1"] == results["pruned"]["metrics"]["val/acc1"]
    assert heal["finetuned"]["unhealed"]["val/acc1"] >= 0 and (tmp_path / "run" / "finetune_unhealed").is_dir()


def test_a_given_plan_whose_run_cannot_be_healed_is_refused(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"remove": ["layer1.1"]}))
    tiny = [o for o in TINY_PRUNE if not o.startswith("model=")]
    out = prune_in_process(*tiny, "logger=none", "model=timm", "model.name=resnet18", "prune.heal=linear",
                           f"prune.plan={plan}", base=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:]
    assert "no Linear or full Conv of layer1.0 reaches the stream after it unchanged" in out.stdout
    assert "training the baseline" not in out.stdout  # refused on the untrained architecture, before any training
    assert not (tmp_path / "run" / "results.json").exists()


def test_the_default_search_judges_its_finalists_healed(tmp_path):
    """A target well inside the table's ceiling and no measured-target correction: the search's own plan ships (a
    corrected search asking beyond the ceiling takes the fastest plan, which no judge chose)."""
    out = prune_in_process(*TINY_PRUNE, "logger=none", "prune.heal=linear", "prune.target_speedup=1.2",
                           "prune.target_corrections=0", "finetune.epochs=0", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    judged = results["search_result"]
    assert results["search"] == "interaction" and judged["finalists_judged_by"] == "healed_loss"
    assert judged["recovered"] is not None and judged["recovered"] == judged["recovered"]  # a number, not NaN
    assert "heal" in results and set(results["heal"]["one_shot"]) == {"healed", "unhealed"}


def test_healing_and_a_recovery_judge_are_refused_together_before_any_work(tmp_path):
    out = prune_in_process(*TINY_PRUNE, "logger=none", "prune.heal=linear", "prune.recovery_steps=5", base=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:]
    assert "choose one" in out.stdout and not (tmp_path / "run" / "results.json").exists()
    assert "training the baseline" not in out.stdout


def test_prune_py_heals_a_retnet_plan_through_the_previous_sublayer(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"remove": ["blocks.1.retention"]}))
    out = prune_in_process(*TINY_LM, "logger=none", "prune.heal=linear", f"prune.plan={plan}", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    heal = json.loads((tmp_path / "run" / "results.json").read_text())["heal"]
    assert [(p["gap"], p["into"]) for p in heal["patches"]] == [(["blocks.1.retention"], "blocks.0.ffn.down_proj")]
    assert all("val/ppl" in m for stage in ("one_shot", "finetuned") for m in heal[stage].values())


def test_a_plain_least_squares_fit_without_enough_calibration_is_refused_before_any_work(tmp_path):
    """prune.heal_ridge=0 needs, for the op a gap's patch goes into, at least as many calibration rows as it has
    channels; a RetNet's (one row per token) with one calibration sequence of 32 tokens has 64 channels."""
    tiny = [o for o in TINY_LM if not o.startswith(("data.batch_size", "prune.calib_batches"))]
    out = prune_in_process(*tiny, "logger=none", "prune.heal=linear", "prune.heal_ridge=0", "data.batch_size=1",
                           "prune.calib_batches=1", base=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:]
    assert "prune.heal_ridge=0 with prune.calib_batches=1 batches of data.batch_size=1" in out.stdout
    assert "only with a ridge" in out.stdout and "training the baseline" not in out.stdout
