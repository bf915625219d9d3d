"""The GPU check: one prepared script for a GPU machine (PyTorch, timm and numpy only; no network), < 8 minutes.

``python benchmarks/gpu_check.py`` (CUDA) or ``python benchmarks/gpu_check.py --device cpu`` (a dry run of every
step that does not need CUDA, on tiny sizes; part of the tests). Steps, each recorded even if another fails:

1. ``measurement``: CUDA events vs a synchronised wall clock, CUDA-graph replay, AMP bf16, channels_last.
2. ``lut``: latency tables of MobileNetV2-1.4 and TResNet-M at batch 128 and their prediction error over random
   plans (with the noise floor).
3. ``prune_search``: DP search at targets 1.5 and 2.0 on synthetic inputs (label-free importance), plans applied
   and measured side by side with the unpruned network: measured vs target speed-up.
4. ``retnet_decode``: RetNet per-token decode latency vs context length (and the KV-cache Transformer's).
5. ``fla``: flash-linear-attention's fused retention vs our PyTorch path, when ``fla`` is importable.

Results: ``$OUT/gpu_check.json`` when ``$OUT`` is set, else ``benchmarks/results/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo  # noqa: E402
from zoo.importance import score_variants  # noqa: E402
from zoo.latency import CalibrationSettings, TableSettings, build_table, measure  # noqa: E402
from zoo.latency.calibrate import time_networks  # noqa: E402
from zoo.latency.device import synchronize  # noqa: E402
from zoo.latency.table import prepare  # noqa: E402
from zoo.search import BudgetError, Choice, dp_search  # noqa: E402
from zoo.surgery import apply_plan  # noqa: E402

GPU = {"batch": 128, "size": 224, "lut_models": ("mobilenetv2_140", "tresnet_m"), "plans": 8,
       "prune_model": "mobilenetv2_140", "calib_batch": 32}
DRY = {"batch": 2, "size": 64, "lut_models": ("mobilenetv2_035",), "plans": 2, "prune_model": "mobilenetv2_035",
       "calib_batch": 4}
DRY_TABLE = TableSettings(warmup_s=0.2, entry_warmup_s=0.01, min_rounds=3, max_rounds=5)
DRY_TIMING = CalibrationSettings(warmup_s=0.2, net_warmup_s=0.02, min_rounds=3, max_rounds=5)


def check_measurement(device: str, cfg: dict) -> dict[str, Any]:
    """Timing modes on one model: events agree with a synchronised wall clock; graphs, bf16, channels_last run."""
    model = zoo.create_model("mobilenetv2_140" if device == "cuda" else "mobilenetv2_035").eval()
    x = torch.randn(cfg["batch"], 3, cfg["size"], cfg["size"])
    quick = {"warmup_s": 1.0 if device == "cuda" else 0.2, "max_time_s": 5.0, "rel_tol": 0.02}
    rows = {"eager_fp32": measure(model, x, device, **quick)}
    if device == "cuda":
        rows["graph_fp32"] = measure(model, x, device, cuda_graph=True, **quick)
        rows["eager_bf16"] = measure(model, x, device, dtype="bfloat16", **quick)
        rows["eager_bf16_cl"] = measure(model, x, device, dtype="bfloat16", channels_last=True, **quick)
        rows["graph_bf16_cl"] = measure(model, x, device, dtype="bfloat16", channels_last=True, cuda_graph=True,
                                        **quick)
    out: dict[str, Any] = {k: v.to_dict() for k, v in rows.items()}
    out["wall_vs_events"] = wall_clock_ratio(model, x, device, rows["eager_fp32"].median_ms)
    return out


@torch.inference_mode()
def wall_clock_ratio(model: torch.nn.Module, x: torch.Tensor, device: str, median_ms: float, calls: int = 50
                     ) -> dict[str, float]:
    """Mean synchronised wall time per call over `calls` calls, vs the events' median (should be close)."""
    dev = torch.device(device)
    net, x = copy.deepcopy(model).to(dev), x.to(dev)
    for _ in range(5):
        net(x)
    synchronize(dev)
    start = time.perf_counter()
    for _ in range(calls):
        net(x)
    synchronize(dev)
    wall_ms = (time.perf_counter() - start) / calls * 1e3
    return {"wall_ms": wall_ms, "measured_median_ms": median_ms, "ratio": wall_ms / median_ms}


def check_lut(device: str, cfg: dict) -> dict[str, Any]:
    """Build each table (cold), calibrate on random plans, report errors beside the noise floor."""
    out = {}
    settings = None if device == "cuda" else DRY_TABLE
    for name in cfg["lut_models"]:
        model = zoo.create_model(name).eval()
        start = time.perf_counter()
        table = build_table(model, batch_size=cfg["batch"], input_size=cfg["size"], device=device,
                            settings=settings, cache_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_check"))
        build_s = time.perf_counter() - start
        evaluation = table.calibrate(cfg["plans"], settings=None if device == "cuda" else DRY_TIMING)
        out[name] = {"entries": table.n_entries, "measured": table.n_measured, "build_s": build_s,
                     "condition": table.condition, **evaluation.summary(), "table": evaluation.format()}
    return out


def check_prune_search(device: str, cfg: dict, targets: tuple[float, ...] = (1.5, 2.0)) -> dict[str, Any]:
    """DP plans at each target on synthetic data; measured speed-up of the merged, fused networks."""
    torch.manual_seed(0)
    name, size = cfg["prune_model"], cfg["size"]
    model = zoo.create_model(name).eval()
    settings = None if device == "cuda" else DRY_TABLE
    table = build_table(model, batch_size=cfg["batch"], input_size=size, device=device, settings=settings,
                        cache_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_check"))
    dev = next(table.model.parameters()).device
    inputs = torch.randn(cfg["calib_batch"], 3, size, size, device=dev)
    batches = [(inputs, torch.zeros(cfg["calib_batch"], dtype=torch.long, device=dev))]  # labels unused
    damages = score_variants(table.model, table.segments, batches, score="similarity")
    options = [[Choice(v, cost, max(0.0, damage[v])) for v, cost in costs]
               for costs, damage in zip(table.segment_costs(), damages)]
    baseline_pred = table.predict({"remove": []})
    out: dict[str, Any] = {"model": name, "condition": table.condition, "baseline_predicted_ms": baseline_pred}
    nets, labels = [zoo.fuse(table.model)], ["baseline"]
    for target in targets:
        try:
            result = dp_search(options, baseline_pred / target - table.fixed_cost())
        except BudgetError as exc:
            out[f"target_{target}"] = {"error": str(exc)}
            continue
        plan = {"remove": result.removed(options), "merge": True}
        pruned = apply_plan(table.model, plan, inplace=False)
        nets.append(zoo.fuse(pruned))
        labels.append(f"target_{target}")
        out[f"target_{target}"] = {"removed": len(plan["remove"]), "predicted_ms": table.predict(plan)}
    channels_last = table.condition["layout"] == "channels_last"
    prepared = [prepare(net, dev, channels_last) for net in nets]
    benches = time_networks(prepared, table.example, {}, table, CalibrationSettings() if device == "cuda"
                            else DRY_TIMING)
    base_ms = benches[0].summary()["median_ms"]
    out["baseline_ms"] = base_ms
    for label, bench in zip(labels[1:], benches[1:]):
        ms = bench.summary()["median_ms"]
        target = float(label.split("_")[1])
        out[label].update({"measured_ms": ms, "measured_speedup": base_ms / ms,
                           "reached": base_ms / ms >= 0.9 * target})
    return out


def check_retnet_decode(device: str) -> dict[str, Any]:
    from benchmarks import retnet_decode

    result = retnet_decode.run(quick=device != "cuda", device=device)
    return {"latency_ratio_longest_to_shortest": result["latency_ratio_longest_to_shortest"],
            "decode": result["decode"], "train": result["train"]}


@torch.inference_mode()
def check_fla(device: str) -> dict[str, Any]:
    """Fused retention kernels vs the PyTorch path: same logits, and each one's chunkwise forward latency."""
    try:
        import fla  # noqa: F401
    except ImportError:
        return {"skipped": "flash-linear-attention is not installed"}
    if device != "cuda":
        return {"skipped": "flash-linear-attention needs CUDA"}
    torch.manual_seed(0)
    ours = zoo.create_model("retnet_small", use_fla=False).cuda().eval()
    fused = zoo.create_model("retnet_small", use_fla=True).cuda().eval()
    fused.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 256, (4, 2048), device="cuda")
    a, b = ours(ids, mode="chunkwise"), fused(ids, mode="chunkwise")
    diff = ((a - b).abs().max() / a.abs().max()).item()
    times = {name: measure(lambda m=m: m(ids, mode="chunkwise"), (), "cuda", warmup_s=1.0, max_time_s=5.0).median_ms
             for name, m in (("torch", ours), ("fla", fused))}
    return {"max_rel_diff": diff, "chunkwise_ms": times, "speedup": times["torch"] / times["fla"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", nargs="+", default=["measurement", "lut", "prune_search", "retnet_decode", "fla"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; run with --device cpu for the dry run", file=sys.stderr)
        return 2
    cfg = GPU if args.device == "cuda" else DRY
    out_dir = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run)",
                              "torch": torch.__version__, "steps": {}}
    steps = {"measurement": lambda: check_measurement(args.device, cfg), "lut": lambda: check_lut(args.device, cfg),
             "prune_search": lambda: check_prune_search(args.device, cfg),
             "retnet_decode": lambda: check_retnet_decode(args.device), "fla": lambda: check_fla(args.device)}
    for name in args.steps:
        start = time.perf_counter()
        try:
            report["steps"][name] = {"ok": True, **steps[name]()}
        except Exception as exc:  # noqa: BLE001 - a failing step is recorded and the others still run
            report["steps"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()}
        report["steps"][name]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"[gpu_check] {name}: {'ok' if report['steps'][name]['ok'] else 'FAILED'} "
              f"({report['steps'][name]['seconds']} s)", flush=True)
        (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    return 0 if all(step["ok"] for step in report["steps"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
