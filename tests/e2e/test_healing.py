"""prune.py with prune.heal=linear: the plan's runs of removed blocks healed by fused channel maps (results.json says
which, the fit's cost, and the one-shot metrics healed and not), the measured speed-up as without healing; a given
plan whose run cannot be healed refused with the reason, exit 2."""

from __future__ import annotations

import json

from ..helpers import TINY_PRUNE, prune_in_process


def test_prune_py_heals_the_plan_and_reports_one_shot_metrics_beside_the_unhealed(tmp_path):
    plan = tmp_path / "plan.json"  # two runs of removed blocks and an activation (which no patch is for)
    plan.write_text(json.dumps({"remove": ["blocks.3.1", "blocks.3.2", "blocks.5.1", "blocks.4.1.bn1.act"]}))
    out = prune_in_process(*TINY_PRUNE, "logger=none", "prune.heal=linear", f"prune.plan={plan}", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    heal = results["heal"]
    assert [(p["before"], p["gap"]) for p in heal["patches"]] == [("blocks.3.0", ["blocks.3.1", "blocks.3.2"]),
                                                                   ("blocks.5.0", ["blocks.5.1"])]
    assert not heal["unhealed"] and all(p["error_healed"] < p["error_unhealed"] for p in heal["patches"])
    latency = heal["latency"]  # the same plan unhealed, timed beside it (the patch adds no op)
    assert latency["healed_ms"] == results["runtimes"]["eager"]["pruned_ms"] and latency["unhealed_ms"] > 0
    assert latency["verdict"] == ("tie" if abs(latency["ratio"] - 1) <= latency["noise"] else
                                  "slower" if latency["ratio"] > 1 else "faster")
    assert not {"unhealed", "unhealed_eager"} & set(results["measurements"])


def test_a_given_plan_whose_run_cannot_be_healed_is_refused(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"remove": ["layer1.1"]}))
    tiny = [o for o in TINY_PRUNE if not o.startswith("model=")]
    out = prune_in_process(*tiny, "logger=none", "model=timm", "model.name=resnet18", "prune.heal=linear",
                           f"prune.plan={plan}", base=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:]
    assert "no Linear or full Conv of layer1.0 reaches its output unchanged" in out.stdout
    assert not (tmp_path / "run" / "results.json").exists()
