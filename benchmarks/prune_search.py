"""The pruning search on a GPU: DP plans at target speed-ups 1.5 and 2.0 on synthetic inputs (label-free similarity
importance, the latency table of the GPU check's condition), each plan merged, fused and timed side by side with the
unpruned network. Target: the measured speed-up >= 0.9 x the target.

    python -m benchmarks run prune_search --device cuda    # every classification family, batch 128 (GPU check)
    python -m benchmarks run prune_search --device cpu --quick   # the smoke model at batch 2

The conditions: every classification family's member at batch 128 fp32 (``latency_table.gpu_member``), and
MobileNetV2-1.4 also in bf16 channels_last. Tables come from the GPU check's cache (built by ``latency_table``).
"""

from __future__ import annotations

from typing import Any

import torch

import zoo
from benchmarks.common import Budget, Check, within_budget, write_result
from benchmarks.latency_table import Condition, bf16_channels_last, gpu_conditions, gpu_settings, table_for
from zoo.latency.accuracy import time_networks
from zoo.latency.measure import prepare
from zoo.pruning.importance import score_variants
from zoo.pruning.search import BudgetError, Choice, dp_search
from zoo.pruning.surgery import apply_plan

TARGETS = (1.5, 2.0)
SPEEDUP_SHARE = 0.9  # a pruned network reaches its target speed-up at >= 0.9 x target
EXTRA_CONDITIONS = {"mobilenetv2": lambda model: [bf16_channels_last(model)]}  # tuning, keyed by family name


def conditions(quick: bool) -> list[Condition]:
    return gpu_conditions(quick, EXTRA_CONDITIONS)


def prune_one(cond: Condition, device: str, quick: bool) -> dict[str, Any]:
    """DP plans at each target on synthetic data; measured speed-up of the merged, fused networks."""
    torch.manual_seed(0)
    table = table_for(cond, device, quick)
    _, timing, size = gpu_settings(quick)
    calib_batch = 4 if quick else 32
    dev = next(table.model.parameters()).device
    inputs = torch.randn(calib_batch, 3, size, size, device=dev)
    batches = [(inputs, torch.zeros(calib_batch, dtype=torch.long, device=dev))]  # labels unused
    damages = score_variants(table.model, table.segments, batches, score="similarity")
    options = [[Choice(v, cost, max(0.0, damage[v])) for v, cost in costs]
               for costs, damage in zip(table.segment_costs(), damages)]
    baseline_pred = table.predict({"remove": []})
    out: dict[str, Any] = {"model": cond.model, "condition": table.condition, "baseline_predicted_ms": baseline_pred}
    nets, labels = [zoo.fuse(table.model)], ["baseline"]
    for target in TARGETS:
        try:
            result = dp_search(options, baseline_pred / target - table.fixed_cost())
        except BudgetError as exc:
            out[f"target_{target}"] = {"error": str(exc)}
            continue
        plan = {"remove": result.removed(options), "merge": True}
        nets.append(zoo.fuse(apply_plan(table.model, plan, inplace=False)))
        labels.append(f"target_{target}")
        out[f"target_{target}"] = {"removed": len(plan["remove"]), "predicted_ms": table.predict(plan), "plan": plan}
    prepared = [prepare(net, dev, cond.channels_last) for net in nets]
    benches = time_networks(prepared, table.example, {}, table, timing)
    estimate = f"{table.settings.estimator}_ms"
    out["baseline_ms"] = base_ms = benches[0].summary()[estimate]
    for label, bench in zip(labels[1:], benches[1:]):
        ms = bench.summary()[estimate]
        out[label].update({"measured_ms": ms, "measured_speedup": base_ms / ms,
                           "prediction_error": out[label]["predicted_ms"] / ms - 1.0})
    return out


def run(quick: bool = False, device: str = "cuda", out: str | None = None, budget: Budget | None = None
        ) -> dict[str, Any]:
    device = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    result = {"suite": "prune_search", "quick": quick, "device": device, "targets": list(TARGETS),
              "conditions": within_budget(conditions(quick), lambda c: c.label, lambda c: prune_one(c, device, quick),
                                          budget)}
    write_result("prune_search", result, out)
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    """Each condition's plan at each target: measured speed-up >= 0.9 x target (None: not measured, e.g. skipped
    or no plan reaches the target)."""
    return [Check(f"{label} target_{target} >= {SPEEDUP_SHARE} x target",
                  p.get(f"target_{target}", {}).get("measured_speedup"), ">=", SPEEDUP_SHARE * target)
            for label, p in result["conditions"].items() for target in TARGETS]


def markdown(result: dict[str, Any]) -> str:
    lines = ["| condition | baseline ms | " + " | ".join(f"target {t}" for t in TARGETS) + " |",
             "|---|---:|" + "---|" * len(TARGETS)]
    for label, p in result["conditions"].items():
        if "skipped" in p:
            lines.append(f"| {label} | skipped: {p['skipped']} |" + " |" * len(TARGETS))
            continue
        cells = []
        for target in TARGETS:
            r = p.get(f"target_{target}", {})
            cells.append(f"{r['measured_ms']:.2f} ms, **{r['measured_speedup']:.2f}x** ({r['removed']} removed; "
                         f"predicted {r['prediction_error']:+.1%})" if "measured_speedup" in r
                         else r.get("error", "not run"))
        lines.append(f"| {label} | {p['baseline_ms']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
