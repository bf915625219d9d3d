"""Depth and INT8 together: do the speed-ups multiply, and does planning on INT8 latencies pay?

Two parts per CNN family (its reference member; ``--models`` to choose), batch 1. On the CPU (one thread) the
runtimes are ``onnxruntime`` and ``onnxruntime_int8``: onnxruntime's static QDQ quantisation (per-channel int8
weights, uint8 activations, min/max ranges; :mod:`zoo.quantization`). On a GPU (``--device cuda``) they are
``tensorrt`` and ``tensorrt_int8`` (TensorRT's explicit quantisation of the same kind of QDQ file, symmetric; see
:data:`PLATFORMS`); below, "float32 table" and "INT8 table" are the platform's pair:

**speed** (224 px, random weights): the float32 table (``onnxruntime``) and the INT8 table (``onnxruntime_int8``)
are built, each table's prediction error is measured on the same random plans (raw and anchored, beside its noise
floor), the DP chooses a 2.0x plan on each table (the fewest units that meet the budget: a speed-only plan), and
five networks are timed side by side in one interleaved session: the float32 baseline, the INT8 baseline, the
float32-table plan in float32 and in INT8, and the INT8-table plan in INT8. Speed-ups are against the float32
baseline in the same session. Which removals are worth less under INT8: each segment variant's saving (share of
the baseline) in the INT8 table against the float32 table, by kind (a block, an activation merge).

**quality** (the default digits task, 48 px, ``--seeds`` seeds, default 5): the baseline is trained once
(``train.py``); per seed, ``prune.py prune.quantize=int8 prune.target_speedup=2.0`` plans on the INT8 table and again
with ``prune.int8_table=false`` on the float32 table (both fine-tuned with the default short fine-tune, both networks
quantised after it and evaluated in onnxruntime); then the five networks of that seed are timed side by side as
above. Compared paired by seed (scipy's t test; Holm over the family's comparisons): the INT8-table plan against
the float32-table plan, in INT8 top-1 and in measured INT8 speed-up.

Targets (:func:`checks`): MobileNetV2-1.0 at 224 px, depth 2.0 + INT8 >= 3.0x the float32 baseline; on digits
>= 2.5x with at most 1 point of top-1 lost against the pruned float32 network (mean over seeds); each INT8 table's
anchored error (mean and max) within the float32 table's (or within 1.5x the noise floor, if larger); the
INT8-table plan not significantly less accurate than the float32-table plan (Holm), and at least as fast in INT8
(mean over seeds, within the noise floor). What a family cannot do is recorded with the reason.

Resumable: every finished part (and every finished seed) is written to the result file with the fingerprint of its
inputs (model, sizes, protocol, versions; for the digits seeds also the baseline's weights, which a fresh machine
retrains: its seeds are kept only if the baseline comes out bit for bit the same); a rerun keeps what matches and
recomputes the rest, saying which.

    python -m studies.int8_depth --device cpu                   # every CNN family (hours on 2 cores)
    python -m studies.int8_depth --models mobilenetv2_100 [--parts speed,quality] [--seeds 5] [--quick]
        [--resume results/int8_depth_cpu.json] [--workdir DIR] [--device cuda]
    python -m studies.int8_depth --summarise results/int8_depth_cpu.json   # verdicts again, no measuring
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import zoo
from benchmarks.common import (
    Budget,
    Check,
    CommandLine,
    count,
    environment,
    families,
    judge,
    names_from,
    out_folder,
    read_json,
    result_of,
    results_dir,
    smoke_model,
    speed_plan,
    write_result,
)
from studies.jobs import python_job
from studies.stats import compare, verdicts
from zoo.errors import run_command
from zoo.files import json_digest, read_sealed_json
from zoo.jobs.prune_config import INT8_PAIRS
from zoo.latency import NetworkTimingSettings, TableSettings, build_table, prediction_error, random_plans
from zoo.latency.accuracy import pruned_network, time_interleaved
from zoo.latency.device import timing_context
from zoo.latency.runtime import in_runtime
from zoo.pruning.importance import weights_digest

PROTOCOL = 1
TARGET = 2.0
SPEED_SIZE = 224
COMBINED = {"speed": 3.0, "quality": 2.5}  # depth + INT8 against the float32 baseline (MobileNetV2-1.0)
TARGET_MODEL = "mobilenetv2_100"
MAX_DROP = 1.0  # top-1 points: the INT8 pruned network against the float32 pruned network
NOISE_FACTOR = 1.5
PLATFORMS = {"cpu": "onnxruntime", "cuda": "tensorrt"}  # device type: its prune.runtime (INT8_PAIRS: its two tables)
FORMS = {"fp32_baseline": ("baseline", "fp32"), "int8_baseline": ("baseline", "int8"),
         "fp32_plan_fp32": ("fp32_plan", "fp32"), "fp32_plan_int8": ("fp32_plan", "int8"),
         "int8_plan_int8": ("int8_plan", "int8")}  # form: (network, table kind)
TABLES = ("fp32", "int8")


def runtimes_on(kind: str) -> dict[str, str]:
    """The float32 and INT8 runtimes of device type `kind` (``prune.quantize=int8``'s pair for its runtime)."""
    return dict(zip(TABLES, INT8_PAIRS[PLATFORMS[kind]]))
QUICK_TARGET = 1.15  # --quick: 64 px, where stem and head cap the float32 table at 1.12-1.31x (four runs, 2026-12-05)
QUICK_DATA = ["data.image_size=16", "data.train_samples=200", "trainer.max_epochs=1", "trainer.limit_train_batches=3"]
QUICK_PRUNE = ["finetune.epochs=1", "prune.calib_batches=1", "prune.target_corrections=1",
               "++prune.table={warmup_s: 0.1, entry_warmup_s: 0.0, min_rounds: 3, max_rounds: 4}",
               "++prune.measure={warmup_s: 0.1, net_warmup_s: 0.0, min_rounds: 3, max_rounds: 4}"]


def cnn_models() -> list[str]:
    """Every classification family's reference member."""
    return [f.reference for f in families(task="classification")]


def timing_settings(quick: bool) -> tuple[TableSettings, NetworkTimingSettings]:
    if quick:
        return (TableSettings(warmup_s=0.1, entry_warmup_s=0.0, min_rounds=3, max_rounds=4, threads=1),
                NetworkTimingSettings(warmup_s=0.1, net_warmup_s=0.0, min_rounds=3, max_rounds=4))
    return TableSettings(threads=1), NetworkTimingSettings(min_rounds=10, max_rounds=40, max_time_s=180.0)


# ---------------------------------------------------------------------------------------------- side by side
def five_way(networks: dict[str, torch.nn.Module], example: torch.Tensor, settings: NetworkTimingSettings,
             estimator: str, device: str = "cpu") -> dict[str, Any]:
    """The five forms (:data:`FORMS`) timed in one interleaved session (one CPU thread) in `device`'s runtimes
    (:data:`PLATFORMS`); speed-ups against float32."""
    dev = torch.device(device)
    runtimes, example = runtimes_on(dev.type), example.to(dev)
    with timing_context(dev, torch.float32, 1):
        calls = [in_runtime(networks[net].to(dev).eval(), (example,), {}, runtimes[kind], dev, 1, what=form)
                 for form, (net, kind) in FORMS.items()]
    benches = time_interleaved(calls, (example,), {}, dev, torch.float32, 1, settings)
    ms = {form: bench.summary()[f"{estimator}_ms"] for form, bench in zip(FORMS, benches)}
    spread = {form: bench.summary()["rel_uncertainty"] for form, bench in zip(FORMS, benches)}
    return {"ms": ms, "rel_uncertainty": spread, "statistic": estimator,
            "speedup": {form: ms["fp32_baseline"] / value for form, value in ms.items()},
            "int8_alone": ms["fp32_baseline"] / ms["int8_baseline"],
            "depth_alone": ms["fp32_baseline"] / ms["fp32_plan_fp32"],
            "depth_in_int8": ms["int8_baseline"] / ms["int8_plan_int8"]}


# -------------------------------------------------------------------------------------------------- speed
def table_error(table: Any, plans: list[dict[str, Any]], settings: NetworkTimingSettings) -> dict[str, Any]:
    """Raw and anchored prediction errors of `table` over `plans` (beside its noise floor)."""
    evaluation = prediction_error(table, plans, settings)
    results = evaluation.results[1:]
    raw = [abs(r.error(False)) for r in results]
    anchored = [abs(r.anchored_error()) for r in results]
    return {"n_plans": len(plans), "mean_error": statistics.fmean(raw), "max_error": max(raw),
            "mean_error_anchored": statistics.fmean(anchored), "max_error_anchored": max(anchored),
            "noise_floor": evaluation.noise_floor, "entries": table.n_records, "build_s": round(table.build_s, 1)}


def removal_worth(tables: dict[str, Any]) -> dict[str, Any]:
    """Each segment variant's saving as a share of its table's baseline, float32 against INT8, by kind of removal
    (``block``: a block or sub-layer; ``activation``: only merges; the mean over the kind's variants); the variants
    whose worth falls most."""
    rows = []
    for fp32_costs, int8_costs in zip(tables["fp32"].segment_costs(), tables["int8"].segment_costs()):
        fp32, int8 = dict(fp32_costs), dict(int8_costs)
        for variant in fp32:
            if not variant or variant not in int8:
                continue
            share = {name: (costs[frozenset()] - costs[variant]) / tables[name].predict({"remove": []})
                     for name, costs in (("fp32", fp32), ("int8", int8))}
            kind = "activation" if all(unit.endswith(".act") for unit in variant) else "block"
            rows.append({"variant": sorted(variant), "kind": kind, "fp32_share": share["fp32"],
                         "int8_share": share["int8"]})
    by_kind = {}
    for kind in ("block", "activation"):
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            fp32, int8 = sum(r["fp32_share"] for r in mine), sum(r["int8_share"] for r in mine)
            by_kind[kind] = {"variants": len(mine), "fp32_share_mean": fp32 / len(mine),
                             "int8_share_mean": int8 / len(mine), "int8_over_fp32": int8 / fp32 if fp32 > 0 else None}
    falls = sorted(rows, key=lambda r: r["int8_share"] - r["fp32_share"])[:5]
    return {"by_kind": by_kind, "largest_falls": falls}


def speed_part(model: str, quick: bool, cache_dir: Path, device: str = "cpu") -> dict[str, Any]:
    """Tables, their errors, the two plans and the five-way session at :data:`SPEED_SIZE` (random weights)."""
    table_settings, network_settings = timing_settings(quick)
    size = 64 if quick else SPEED_SIZE
    tables = {name: build_table(model, batch_size=1, input_size=size, device=device, cache_dir=str(cache_dir),
                                settings=replace(table_settings, runtime=runtimes_on(torch.device(device).type)[name]))
              for name in TABLES}
    reach = {n: round(t.predict({"remove": []}) / (t.fixed_cost() + sum(min(c for _, c in costs)
                                                                        for costs in t.segment_costs())), 3)
             for n, t in tables.items()}
    target = TARGET
    if quick:  # a smoke run: tiny, quickly timed tables, whose ceiling is a timing outcome (1.12-1.31x in float32)
        target = min(QUICK_TARGET, round(1.0 + (min(reach.values()) - 1.0) / 2, 3))
    plans = {name: speed_plan(table, target) for name, table in tables.items()}
    if None in plans.values():
        return {"model": model, "input_size": size, "target": target, "max_predicted_speedup": reach,
                "unreachable": f"no {target}x plan: the largest predicted speed-up is {reach} (what cannot be "
                "removed: stem, head, the stages' first blocks)"}
    randoms = random_plans(tables["fp32"].segments, 3 if quick else 10, seed=1, merge=tables["fp32"].merge)
    errors = {name: table_error(table, randoms, network_settings) for name, table in tables.items()}
    networks = {"baseline": pruned_network(tables["fp32"], {"remove": [], "merge": True}),
                "fp32_plan": pruned_network(tables["fp32"], plans["fp32"]),
                "int8_plan": pruned_network(tables["fp32"], plans["int8"])}
    session = five_way(networks, tables["fp32"].example, network_settings, table_settings.estimator, device)
    return {"model": model, "input_size": size, "target": target, "plans": {n: {"removed": sorted(p["remove"]),
                                                               "predicted_speedup": tables[n].predict(
                                                                   {"remove": []}) / tables[n].predict(p)}
                                                           for n, p in plans.items()},
            "table_errors": errors, "session": session, "removal_worth": removal_worth(tables)}


# ------------------------------------------------------------------------------------------------ quality


def quality_overrides(model: str, quick: bool) -> list[str]:
    """The digits task (the baseline's training: model, data, trainer)."""
    return [f"model={model}", "data=digits", *(QUICK_DATA if quick else [])]


def quality_seed(model: str, seed: int, baseline: Path, quick: bool, workdir: Path, device: str = "cpu"
                 ) -> dict[str, Any]:
    """The seed's two prune runs (INT8 table, float32 table) and its five-way session."""
    common = [*quality_overrides(model, quick), *(QUICK_PRUNE if quick else []), f"checkpoint={baseline}",
              f"prune.device={device}", "prune.batch_size=1", "prune.threads=1",
              f"prune.runtime={PLATFORMS[torch.device(device).type]}",
              "prune.quantize=int8", f"prune.target_speedup={QUICK_TARGET if quick else TARGET}",
              f"trainer.seed={seed}", f"prune.seed={seed}", f"prune.cache_dir={workdir / 'cache'}"]
    runs = {}
    for planner in TABLES:
        run_dir = workdir / f"{model}-{planner}-table-seed{seed}"
        results = python_job("prune.py", [*common, f"prune.int8_table={planner == 'int8'}", "prune.force=true"],
                             run_dir, workdir)
        runs[planner] = {"dir": str(run_dir), "plan": results["plan"]["remove"],
                         "fp32_acc1": results["pruned"]["metrics"]["val/acc1"],
                         "int8_acc1": results["int8"]["pruned"]["metrics"]["val/acc1"],
                         "baseline_fp32_acc1": results["baseline"]["metrics"]["val/acc1"],
                         "baseline_int8_acc1": results["int8"]["baseline"]["metrics"]["val/acc1"],
                         "int8_top1_agreement": results["int8"]["pruned"]["top1_agreement"],
                         "size_mb": {side: {"fp32": results["int8"][side]["fp32_size_mb"],
                                            "int8": results["int8"][side]["int8_size_mb"]}
                                     for side in ("baseline", "pruned")},
                         "runtimes": {rt: {k: row[k] for k in ("baseline_ms", "pruned_ms", "measured_speedup")}
                                      for rt, row in results["runtimes"].items()}}
    _, network_settings = timing_settings(quick)
    networks = {"baseline": zoo.fuse(zoo.load(baseline).eval()),
                "fp32_plan": zoo.fuse(zoo.load(Path(runs["fp32"]["dir"]) / "pruned.safetensors").eval()),
                "int8_plan": zoo.fuse(zoo.load(Path(runs["int8"]["dir"]) / "pruned.safetensors").eval())}
    size = 16 if quick else 48
    example = torch.randn(1, 3, size, size)
    session = five_way(networks, example, network_settings, TableSettings().estimator, device)
    return {"seed": seed, "runs": runs, "session": session}


def train_baseline(model: str, quick: bool, workdir: Path) -> Path:
    """The digits baseline, trained once in `workdir` (its best checkpoint)."""
    run_dir = workdir / f"{model}-baseline"
    done = run_dir / "results.json"
    if done.is_file():
        return Path(read_sealed_json(done)["checkpoint"])
    results = python_job("train.py", quality_overrides(model, quick), run_dir, workdir)
    return Path(results["checkpoint"])


def quality_statistics(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Paired by seed, Holm-corrected: the INT8-table plan against the float32-table plan in INT8 top-1 and in
    INT8 speed-up (positive: the INT8 table is better); means of the targets' quantities."""
    acc = [s["runs"]["int8"]["int8_acc1"] - s["runs"]["fp32"]["int8_acc1"] for s in seeds]
    speed = [s["session"]["speedup"]["int8_plan_int8"] - s["session"]["speedup"]["fp32_plan_int8"] for s in seeds]
    tests = verdicts([{"name": "int8 top-1", **compare(acc, None)},
                      {"name": "int8 speed-up", **compare(speed, None)}])
    drop = [s["runs"]["int8"]["fp32_acc1"] - s["runs"]["int8"]["int8_acc1"] for s in seeds]
    return {"comparisons": tests, "mean_int8_drop": statistics.fmean(drop),
            "mean_combined_speedup": statistics.fmean(s["session"]["speedup"]["int8_plan_int8"] for s in seeds),
            "mean_noise": statistics.fmean(max(s["session"]["rel_uncertainty"].values()) for s in seeds)}


def quality_fingerprint(key: dict[str, Any], baseline_weights: str) -> str:
    """What a stored seed depends on: the part's inputs and the digits baseline's weights (a retrained baseline that
    differs in any bit makes every stored seed stale)."""
    return json_digest({**key, "baseline_weights": baseline_weights}, 20)


def quality_part(model: str, seeds: int, quick: bool, workdir: Path, stored: dict[str, Any] | None,
                 key: dict[str, Any], save: Any, device: str = "cpu") -> dict[str, Any]:
    """The digits part, resumed seed by seed from `stored` when its fingerprint matches."""
    baseline = train_baseline(model, quick, workdir)
    weights = weights_digest(zoo.load(baseline))
    fingerprint = quality_fingerprint(key, weights)
    done = [s for s in (stored or {}).get("seeds", []) if (stored or {}).get("fingerprint") == fingerprint]
    if stored and stored.get("fingerprint") != fingerprint:
        reason = ("another baseline (its weights differ: retrained elsewhere, not bit for bit)"
                  if stored.get("key") == key else "other inputs")
        print(f"{model} quality: the stored seeds were measured on {reason}; recomputed", flush=True)
    part = {"fingerprint": fingerprint, "key": key, "baseline_weights": weights, "seeds": done}
    for seed in range(len(done), seeds):
        start = time.perf_counter()
        part["seeds"].append(quality_seed(model, seed, baseline, quick, workdir, device))
        print(f"{model} quality: seed {seed} in {time.perf_counter() - start:.0f} s", flush=True)
        save(part)
    part["statistics"] = quality_statistics(part["seeds"])
    return part


# ----------------------------------------------------------------------------------------------------- run
def versions(kind: str = "cpu") -> dict[str, str]:
    """The versions a part's numbers depend on (on a GPU also the two TensorRT runtimes')."""
    import onnxruntime

    from zoo.latency.runtime import runtime_version

    found = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
    if kind != "cpu":
        found.update({f"{table}_runtime": runtime_version(runtime) for table, runtime in runtimes_on(kind).items()})
    return found


def platform_of(device: str) -> tuple[str | None, str | None]:
    """(the device to run on, or None; why not): ``auto`` is the GPU where CUDA and both of its runtimes are there,
    else the CPU; a device is refused, with the reason, when its float32 or INT8 runtime cannot run here."""
    from zoo.latency.runtime import RuntimeFailure, check_runtime

    if device == "auto":
        gpu = platform_of("cuda")
        return gpu if gpu[0] else platform_of("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in PLATFORMS:
        return None, f"device={device}: this benchmark runs on {' or '.join(PLATFORMS)}"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return None, f"device={device}: no CUDA device here (on the CPU: --device cpu)"
    try:
        for runtime in runtimes_on(dev.type).values():
            check_runtime(runtime, dev)
    except RuntimeFailure as failure:
        return None, f"device={device}: {failure}"
    return str(dev), None


def result_path(quick: bool, out: str | Path | None, platform: str = "cpu") -> Path:
    """``int8_depth[_quick][_cuda].json``: a GPU run never overwrites the CPU's file."""
    return results_dir(out) / f"int8_depth{'_quick' if quick else ''}{'' if platform == 'cpu' else '_' + platform}.json"


def run(quick: bool = False, device: str = "cpu", models: list[str] | None = None, parts: tuple[str, ...] = (
        "speed", "quality"), seeds: int = 5, workdir: str | Path | None = None, out: str | Path | None = None,
        budget: Budget | None = None, resume: str | Path | None = None) -> dict[str, Any]:
    """Every model's parts; writes ``int8_depth.json`` after each piece (:func:`result_path`: ``_quick`` with quick,
    ``_cuda`` on a GPU).
    Finished parts whose inputs match are kept from `resume` (a committed result), else from the file it writes; the
    other models of that file are carried over as they are."""
    device, why_not = platform_of(device)
    if device is None:
        return {"suite": "int8_depth", "skipped": why_not}
    kind = torch.device(device).type
    models = models or ([smoke_model()] if quick else cnn_models())
    seeds = 1 if quick else seeds
    path = result_path(quick, out, kind)
    source = Path(resume) if resume else path
    stored = json.loads(source.read_text()) if source.is_file() else {}
    if stored and stored.get("platform", "cpu") != kind:  # another device's numbers: neither kept nor carried
        print(f"{source}: measured on {stored.get('platform', 'cpu')}, not {kind}: not reused", flush=True)
        stored = {}
    target = QUICK_TARGET if quick else TARGET
    if stored and stored.get("target") != target:  # every part's plans were chosen for the stored target
        print(f"{source}: measured at target {stored.get('target')}x, not {target}x: recomputed", flush=True)
        stored = {}
    work = Path(workdir or Path.home() / ".cache" / "depthzoo" / ("int8_depth_quick" if quick else "int8_depth"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"suite": "int8_depth", "quick": quick, "protocol": PROTOCOL, "target": target,
                              "platform": kind, "runtimes": runtimes_on(kind),
                              "env": environment(torch.device(device), torch.float32, 1, 1), "versions": versions(kind),
                              "models": {m: dict(parts_of) for m, parts_of in stored.get("models", {}).items()}}
    for model in models:  # a model not run now keeps its stored parts: a run of one model loses nobody's numbers
        result["models"].setdefault(model, {})
    if stored.get("versions") and stored["versions"] != result["versions"]:  # carried parts say what measured them
        for model in set(result["models"]) - set(models):
            result["models"][model].setdefault("versions", stored.get("versions"))
    start = time.perf_counter()

    def save() -> None:
        result["time_s"] = round(time.perf_counter() - start, 1)
        judge("int8_depth", result)
        write_result(path.stem, result, out)

    for model in models:
        row = result["models"][model]
        for part in parts:
            key = {"model": model, "part": part, "protocol": PROTOCOL, "quick": quick, **result["versions"],
                   **({"platform": kind} if kind != "cpu" else {}),  # (CPU parts keep their stored fingerprints)
                   **({"seeds_of": seeds} if part == "quality" else {})}
            stored_part = row.get(part) or {}
            if part == "speed" and stored_part.get("fingerprint") == json_digest(key, 20):
                print(f"{model} speed: kept (same inputs)", flush=True)
                continue
            if budget is not None and not budget.allows():
                row.setdefault(part, {"skipped": budget.reason()})
                continue
            try:
                if part == "speed":
                    measured = speed_part(model, quick, work / "cache", device)
                    row[part] = {"fingerprint": json_digest(key, 20), **measured}
                else:
                    key = {k: v for k, v in key.items() if k != "seeds_of"}

                    def keep(partial: dict[str, Any], model: str = model) -> None:
                        result["models"][model]["quality"] = partial
                        save()

                    row[part] = quality_part(model, seeds, quick, work, stored_part, key, keep, device)
            except Exception as error:  # noqa: BLE001 - a family that cannot is recorded, with the reason
                row[part] = {"error": f"{type(error).__name__}: {str(error)[:1500]}"}
            save()
    save()
    return result


# ------------------------------------------------------------------------------------------------ verdicts
def checks(result: dict[str, Any]) -> list[Check]:
    """The issue's targets on what was measured (None: not measured, or a family that could not)."""
    out, target = [], result["target"]
    for model, row in result["models"].items():
        speed, quality = row.get("speed") or {}, row.get("quality") or {}
        session = speed.get("session") or {}
        if model == TARGET_MODEL and result.get("platform", "cpu") == "cpu":  # the targets are the CPU's
            out.append(Check(f"{model} {speed.get('input_size', SPEED_SIZE)} px: depth {target} + INT8 speed-up",
                             session.get("speedup", {}).get("int8_plan_int8"), ">=", COMBINED["speed"]))
            stats = quality.get("statistics") or {}
            out.append(Check(f"{model} digits: depth {target} + INT8 speed-up (mean over seeds)",
                             stats.get("mean_combined_speedup"), ">=", COMBINED["quality"]))
            out.append(Check(f"{model} digits: INT8 top-1 lost against the pruned float32 network (mean)",
                             stats.get("mean_int8_drop"), "<=", MAX_DROP))
        errors = speed.get("table_errors") or {}
        for stat in ("mean", "max"):
            fp32, int8 = errors.get("fp32", {}), errors.get("int8", {})
            limit = max(fp32.get(f"{stat}_error_anchored", 0.0),
                        NOISE_FACTOR * max(fp32.get("noise_floor", 0.0), int8.get("noise_floor", 0.0)))
            out.append(Check(f"{model}: INT8 table's anchored {stat} error within the float32 table's",
                             int8.get(f"{stat}_error_anchored"), "<=", limit))
        tests = {t["name"]: t for t in (quality.get("statistics") or {}).get("comparisons", [])}
        acc = tests.get("int8 top-1")
        out.append(Check(f"{model} digits: INT8-table plan not significantly less accurate in INT8 (Holm)",
                         None if acc is None else acc["verdict"], "!=", "worse"))
        speed_test = tests.get("int8 speed-up")
        floor = (quality.get("statistics") or {}).get("mean_noise", 0.0)
        out.append(Check(f"{model} digits: INT8-table plan at least as fast in INT8 (mean, within the noise)",
                         None if speed_test is None else speed_test["mean"], ">=", -NOISE_FACTOR * floor * target))
    return out


def markdown(result: dict[str, Any]) -> str:
    """Per model: the five-way sessions (224 px; digits, mean over seeds), table errors, quality, statistics."""
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    lines = ["| model | part | fp32 baseline ms | INT8 alone | depth alone (fp32) | depth in INT8 | fp32-table plan "
             "in INT8 | **INT8-table plan in INT8** |", "|---|---|---|---|---|---|---|---|"]
    for model, row in result["models"].items():
        speed, quality = row.get("speed") or {}, row.get("quality") or {}
        sessions = [("224 px" if not result["quick"] else "quick", speed.get("session"))]
        sessions += [(f"digits seed {s['seed']}", s["session"]) for s in quality.get("seeds", [])]
        for label, s in sessions:
            if s:
                lines.append(f"| {model} | {label} | {s['ms']['fp32_baseline']:.3f} | {s['int8_alone']:.2f}x | "
                             f"{s['depth_alone']:.2f}x | {s['depth_in_int8']:.2f}x | "
                             f"{s['speedup']['fp32_plan_int8']:.2f}x | **{s['speedup']['int8_plan_int8']:.2f}x** |")
        for part in ("speed", "quality"):
            problem = (row.get(part) or {}).get("error") or (row.get(part) or {}).get("skipped") or (
                row.get(part) or {}).get("unreachable")
            if problem:
                lines.append(f"| {model} | {part} | {problem} | | | | | |")
    lines += ["", "Table errors (same random plans, anchored mean / max; noise floor):", "",
              "| model | float32 table | INT8 table | a variant's mean saving (share of the baseline), float32 -> "
              "INT8 |",
              "|---|---|---|---|"]
    for model, row in result["models"].items():
        errors = (row.get("speed") or {}).get("table_errors")
        if errors:
            cells = [f"{e['mean_error_anchored']:.1%} / {e['max_error_anchored']:.1%} ({e['noise_floor']:.1%})"
                     for e in (errors["fp32"], errors["int8"])]
            worth = row["speed"]["removal_worth"]["by_kind"]
            ratio = "; ".join(f"{k}s: {w['fp32_share_mean']:+.1%} -> {w['int8_share_mean']:+.1%}"
                              for k, w in worth.items())
            lines.append(f"| {model} | {cells[0]} | {cells[1]} | {ratio} |")
    lines += ["", "Digits quality (top-1 %, mean over seeds; INT8 after the short fine-tune):", "",
              "| model | seeds | baseline fp32 / INT8 | fp32-table plan fp32 / INT8 | INT8-table plan fp32 / INT8 | "
              "INT8-table vs fp32-table: top-1, speed-up (Holm) |", "|---|---|---|---|---|---|"]
    for model, row in result["models"].items():
        quality = row.get("quality") or {}
        if not quality.get("seeds"):
            continue

        def mean(planner: str, key: str, q: dict[str, Any] = quality) -> float:
            return statistics.fmean(s["runs"][planner][key] for s in q["seeds"])

        tests = {t["name"]: t for t in quality["statistics"]["comparisons"]}
        verdict = ", ".join(f"{tests[n]['mean']:+.2f} ({tests[n]['verdict']}, p {tests[n]['p_holm']:.2f})"
                            for n in ("int8 top-1", "int8 speed-up"))
        lines.append(f"| {model} | {len(quality['seeds'])} | {mean('int8', 'baseline_fp32_acc1'):.2f} / "
                     f"{mean('int8', 'baseline_int8_acc1'):.2f} | {mean('fp32', 'fp32_acc1'):.2f} / "
                     f"{mean('fp32', 'int8_acc1'):.2f} | {mean('int8', 'fp32_acc1'):.2f} / "
                     f"{mean('int8', 'int8_acc1'):.2f} | {verdict} |")
    judged = verdicts_of(result)
    lines += ["", "Targets: " + "; ".join(f"{label}: {'-' if v is None else 'pass' if v else 'FAIL'}"
                                          for label, v in judged.items()),
              "", f"{result['env']['device']}, " + ", ".join(f"{name} {version}" for name, version in
                                                          result["versions"].items() if name != "torch")
              + "".join(f" ({model}: {row['versions']})" for model, row in result["models"].items()
                        if row.get("versions"))
              + f", batch 1{', one thread' if result.get('platform', 'cpu') == 'cpu' else ''}, "
              f"status {result.get('status', '-')}."]
    return "\n".join(lines)


def verdicts_of(result: dict[str, Any]) -> dict[str, bool | None]:
    from benchmarks.common import verdicts as judge_checks

    return judge_checks(checks(result))


def command_line() -> CommandLine:
    parser = CommandLine("studies.int8_depth", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=names_from(zoo.list_models(), "model"), default=None,
                        help="comma-separated (default: every CNN family's reference)")
    parser.add_argument("--parts", type=names_from(("speed", "quality"), "part"), default=["speed", "quality"])
    parser.add_argument("--seeds", type=count, default=5)
    parser.add_argument("--workdir", type=out_folder, default=None,
                        help="baselines, runs and tables (default ~/.cache/depthzoo)")
    parser.add_argument("--out", type=out_folder, default=None)
    parser.add_argument("--resume", type=result_of("int8_depth"), default=None, metavar="JSON",
                        help="keep the finished parts of this result (e.g. results/int8_depth_cpu.json) where their "
                        "inputs match")
    parser.add_argument("--summarise", type=result_of("int8_depth"), default=None, metavar="JSON",
                        help="judge a stored result again and print it")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                        help="cpu (onnxruntime), cuda (TensorRT) or auto")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    if args.summarise:
        print(markdown(judge("int8_depth", read_json(args.summarise))))
        return
    result = run(args.quick, args.device, args.models, tuple(args.parts), args.seeds, args.workdir, args.out,
                 resume=args.resume)
    print(markdown(result))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
