"""What a prune run reports: ``results.json`` (see docs/pruning.md for every field), the console summary, and the
lookup and importance tables, the plan and the surrogate's Pareto plot in W&B."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from ..pruning.search import pareto_front
from .plan import plans_scored_by


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def metric_view(metrics: dict[str, float]) -> dict[str, float]:
    """Validation metrics as results.json holds them: ``val/<name>``, rounded to 5 decimals."""
    return {(k if k.startswith("val/") else f"val/{k}"): round(float(v), 5) for k, v in metrics.items()}


def assemble_results(cfg: Any, table: Any, plan: dict, result: Any, baseline: nn.Module, pruned: nn.Module,
                     base_metrics: dict, pruned_metrics: dict, measured: dict, timings: dict, checkpoint: Path,
                     correction: Any, importance_cached: bool) -> dict[str, Any]:
    """The ``results.json`` of a prune run (see the prune docs for every field)."""
    predicted = table.predict(plan)
    memory = table.predict_memory(plan)
    estimate = f"{table.settings.estimator}_ms"  # the statistic the table's entries use (p10 by default)
    base_ms, pruned_ms = measured["baseline"][estimate], measured["pruned"][estimate]
    eager_base, eager_pruned = measured["baseline_eager"][estimate], measured["pruned_eager"][estimate]
    return {
        "model": cfg.model.name,
        "tag": getattr(baseline, "zoo_tag", None),
        "data": cfg.data.name,
        "device": table.condition["device_name"],
        "condition": table.condition,
        "workload": cfg.prune.workload,
        "target_speedup": cfg.prune.target_speedup,
        "target_latency_ms": cfg.prune.target_latency_ms,
        "search": cfg.prune.search,
        "importance": cfg.prune.importance,
        "plan": plan,
        "search_result": None if result is None else {"latency_ms": result.latency, "damage": result.damage,
                                                      "method": result.method, "recovered": result.recovered,
                                                      "plans_scored_by": plans_scored_by(cfg),
                                                      "finalists_judged_by": None if result.recovered is None else
                                                      "healed_loss" if cfg.prune.heal == "linear" else
                                                      "recovered_loss"},
        "latency_statistic": table.settings.estimator,
        "latency_form": table.condition.get("form", "eager"),
        "baseline": {"latency_ms": base_ms, "latency_eager_ms": eager_base,
                     "predicted_latency_ms": table.predict({"remove": []}), "params": count_params(baseline),
                     "metrics": metric_view(base_metrics)},
        "pruned": {"latency_ms": pruned_ms, "latency_eager_ms": eager_pruned, "params": count_params(pruned),
                   "metrics": metric_view(pruned_metrics)},
        "predicted_latency_ms": predicted,
        "predicted_peak_memory_mb": None if memory is None else memory / 2**20,
        "max_memory_mb": cfg.prune.max_memory_mb,
        "prediction_error": predicted / pruned_ms - 1.0,
        "predicted_speedup": table.predict({"remove": []}) / predicted,
        "speedup_prediction_error": (table.predict({"remove": []}) / predicted) / (base_ms / pruned_ms) - 1.0,
        "measured_speedup": base_ms / pruned_ms,
        "measured_speedup_eager": eager_base / eager_pruned,
        "measurements": measured,
        "table": {"entries": table.n_records, "measured_now": table.n_measured, "cached": table.n_cached,
                "build_s": round(table.build_s, 3),
                "correction": None if correction is None else correction.summary()},
        "importance_cached": importance_cached,
        "timings_s": timings,
        "checkpoint": str(checkpoint),
        "notes": notes(count_params(baseline), count_params(pruned)),
    }


def notes(baseline_params: int, pruned_params: int) -> list[str]:
    """What a reader of the results might misread, said plainly."""
    found = []
    if pruned_params > baseline_params:
        found.append(f"The pruned network has more parameters than the baseline ({pruned_params:,} vs "
                     f"{baseline_params:,}): a merged conv is one larger kernel (k1 + k2 - 1 wide) with more weights "
                     "than the chain it replaces, yet it runs faster because it is one layer instead of several, "
                     "with no activations or intermediate tensors in between. Depth, not size, is what went down.")
    return found


def format_summary(results: dict[str, Any]) -> str:
    """A readable console table of a prune run."""
    base, pruned = results["baseline"], results["pruned"]
    metric = next(iter(k for k in ("val/acc1", "val/ppl", "val/loss") if k in pruned["metrics"]), None)
    rows = [("", "baseline", "pruned"),
            ("latency ms (measured)", f"{base['latency_ms']:.3f}", f"{pruned['latency_ms']:.3f}"),
            ("latency ms (predicted)", f"{base['predicted_latency_ms']:.3f}", f"{results['predicted_latency_ms']:.3f}"),
            ("params", f"{base['params']:,}", f"{pruned['params']:,}")]
    if metric:
        rows.append((metric, f"{base['metrics'].get(metric, float('nan')):.3f}", f"{pruned['metrics'][metric]:.3f}"))
    lines = [f"{a:<24}{b:>14}{c:>14}" for a, b, c in rows]
    lines.append(f"measured speed-up {results['measured_speedup']:.2f}x (target {results['target_speedup']}x) on "
                 f"{results['device']}; predicted {results['predicted_speedup']:.2f}x "
                 f"({results['speedup_prediction_error']:+.1%}); latency prediction error "
                 f"{results['prediction_error']:+.1%} (includes the machine's drift since the table was measured); "
                 f"{len(results['plan']['remove'])} unit(s) removed")
    for runtime, row in (results.get("runtimes") or {}).items():
        lines.append(f"{runtime:<12} baseline {row['baseline_ms']:.3f} ms, pruned {row['pruned_ms']:.3f} ms: "
                     f"{row['measured_speedup']:.2f}x measured, {row['predicted_speedup']:.2f}x predicted "
                     f"({row['speedup_prediction_error']:+.1%})" + ("  <- the plan was chosen here"
                                                                     if row.get("chosen_here") else ""))
    int8 = results.get("int8")
    if int8:
        metric = next(k for k in int8["pruned"]["metrics"] if k.endswith("acc1"))
        how = {"torch_export": "torch.compile, PT2E", "tensorrt": "TensorRT's symmetric QDQ, evaluated in onnxruntime"}\
            .get(int8.get("scheme") or int8.get("format"), "onnxruntime, static QDQ")
        lines.append(f"int8 ({how}): {metric} baseline {int8['baseline']['metrics'][metric]:.2f}, "
                     f"pruned {int8['pruned']['metrics'][metric]:.2f} (float {results['pruned']['metrics'][metric]:.2f}"
                     f"); pruned model {int8['pruned']['fp32_size_mb']:.2f} -> {int8['pruned']['int8_size_mb']:.2f} MB")
    export = results.get("export")
    if export:
        lines.append(f"export {export['path']}: " + (
            f"within {export['rtol']:g} of PyTorch ({export['max_rel_diff']:.1e}, {export['checked_with']})"
            if export["passed"] else f"written, {export['checked_with']}" if export["passed"] is None
            else f"FAILED: {export.get('error', 'beyond the tolerance')}"))
    lines += [f"note: {note}" for note in results.get("notes", [])]
    return "\n".join(lines)


def log_to_wandb(logger: Any, table: Any, options: list, damages: list, plan: dict, results: dict) -> None:
    """Lookup and importance tables, the plan, the surrogate's Pareto front with the chosen point, final metrics."""
    run = getattr(logger, "run", None)
    flat = {f"prune/{k}": v for k, v in results.items() if isinstance(v, (int, float))}
    for side in ("baseline", "pruned"):
        flat.update({f"{side}/latency_ms": results[side]["latency_ms"], f"{side}/params": results[side]["params"]})
        flat.update({f"{side}/{k}": v for k, v in results[side]["metrics"].items()})
    logger.summary(flat)
    if run is None:
        return
    import wandb

    table_rows = [[seg.name, "|".join(sorted(v)) or "unchanged", cost, damages[i].get(v, 0.0)]
                for i, (seg, costs) in enumerate(zip(table.segments, table.segment_costs())) for v, cost in costs]
    run.log({
        "prune/lookup_table": wandb.Table(columns=["segment", "variant", "latency_ms", "damage"], data=table_rows),
        "prune/plan": wandb.Table(columns=["removed unit"], data=[[u] for u in plan["remove"]]),
        "prune/pareto": wandb.Image(plan_front_figure(table, options, results)),
    })
    run.summary["prune/plan_json"] = json.dumps(plan)


def table_record(table: Any) -> dict[str, Any]:
    """The latency table the search used, as JSON (``latency_table.json``): its condition, fixed part and every
    segment variant's cost."""
    return {"condition": table.condition, "fixed_ms": table.fixed_cost(),
            "segments": [{"name": seg.name, "variants": [{"removed": sorted(v), "ms": cost} for v, cost in costs]}
                         for seg, costs in zip(table.segments, table.segment_costs())]}


def log_lineage(logger: Any, results: dict, files: dict[str, Path]) -> dict[str, dict[str, str]]:
    """The run's baseline weights, latency table, plan and pruned checkpoint (with its model card) as W&B artifacts,
    each naming the digests of those it was made from in its metadata (so offline runs are linked too); an online
    run also declares the baseline and the table as its inputs (W&B's lineage graph). Returns name -> type and
    digest (``results.json``: ``lineage``), or {} without a W&B run."""
    run = getattr(logger, "run", None)
    if run is None:
        return {}
    import wandb

    model, logged = results["model"], {}

    def log(kind: str, name: str, paths: list[Path], metadata: dict[str, Any], use: bool = False) -> str:
        artifact = wandb.Artifact(name, type=kind, metadata=metadata)
        for path in paths:
            artifact.add_file(str(path))
        run.log_artifact(artifact)
        if use and not getattr(run, "offline", True):
            run.use_artifact(artifact)
        logged[name] = {"type": kind, "digest": artifact.digest}
        return artifact.digest

    baseline = log("model", f"{model}-baseline", [files["baseline"]],
                   {"source": results["baseline"].get("source"), "metrics": results["baseline"]["metrics"]}, use=True)
    table = log("latency-table", f"{model}-latency-table", [files["latency_table"]],
                {"condition": results["condition"], "baseline": baseline}, use=True)
    plan = log("plan", f"{model}-plan", [files["plan"]],
               {"baseline": baseline, "latency_table": table, "search": results["search"],
                "importance": results["importance"], "target_speedup": results["target_speedup"]})
    log("model", f"{model}-pruned", [files["checkpoint"], *([files["card"]] if "card" in files else [])],
        {"baseline": baseline, "latency_table": table, "plan": plan, "measured_speedup": results["measured_speedup"],
         "metrics": results["pruned"]["metrics"]})
    return logged


def plan_front_figure(table: Any, options: list, results: dict) -> Any:
    """Predicted latency vs retained importance along the DP front, with the chosen and measured points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixed = table.fixed_cost()
    front = pareto_front(options)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([fixed + lat for lat, _ in front], [-d for _, d in front], "o-", ms=3, label="DP front (predicted)")
    if results.get("search_result"):
        ax.plot(results["predicted_latency_ms"], -results["search_result"]["damage"], "r*", ms=12, label="chosen plan")
        ax.axvline(results["pruned"]["latency_ms"], color="g", ls="--", label="measured latency")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("-(importance lost)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
