"""A census of timm: which architectures discovery makes prunable, and that every unit it offers is proven.

Every architecture in ``timm.list_models()`` with at most ``--max-params`` parameters (counted on the meta device) is
built without weights and discovered at a small input (3x64x64; where the model does not run there, built with
``img_size=64``; else at timm's own input size), through the same pipeline as ``create_model("timm/<name>")``. Per
architecture, one row: built? traced? the units (blocks listed, removable blocks, removable sub-layers), every
removable unit **proven again on a second draw** (other random parameters and input: ``zoo.models.discovery.recheck``),
the model with every removable unit removed at once runs (finite, same output shape), or why it is refused, in a
reason category. Each architecture runs in a worker process with a time limit (a hang or a crash is a row, not the
end of the census); rows are written as they are made, each with the fingerprint of its inputs (timm and torch
versions, discovery's code digest, the input sizes, the limits), so ``--resume FILE`` keeps matching rows and runs
the rest. Architectures are visited one per timm module in turn, so a partial census covers every family early.

Targets: **zero** offered units that fail their second proof, over the whole census; at least 75 % of the
architectures that build and trace are prunable; every architecture under the limit examined.

    python -m studies.timm_census --out results --resume results/timm_census.json [--hours 2] [--jobs 2]   # hours
    python -m studies.timm_census --quick          # a dozen architectures (minutes)
"""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from benchmarks.common import (
    Check,
    CommandLine,
    count,
    judge,
    markdown_table,
    out_folder,
    positive,
    read_json,
    result_of,
    results_dir,
    write_result,
)
from zoo.errors import run_command
from zoo.files import json_digest

MAX_PARAMS = 100_000_000
SMALL = 64  # the census's image size: small, and large enough for every stride-32 network
TIME_LIMIT_S = 300.0  # one architecture's discovery, recheck and removal, in its worker
PRUNABLE_SHARE = 0.75
QUICK = ["resnet18", "deit_tiny_patch16_224", "convnext_atto", "efficientvit_b0", "cait_xxs24_224", "fastvit_t8",
         "mobilenetv2_050", "poolformer_s12", "coat_lite_tiny", "mixer_s16_224", "levit_128s", "vgg11"]
CATEGORIES = (  # (category, what the reasons of its units say), first match wins; what would lift it is in the docs
    ("over the time limit", "time limit"),
    ("does not build", "does not build"),
    ("does not trace", "torch.export cannot trace"),
    ("does not run at a small input", "does not run at"),
    ("graph differs from the model", "traced graph does not compute"),
    ("no same-shape addition", "no same-shape addition"),
    ("stream passes through a non-elementwise op", "its stream passes through"),
    ("module called more than once", "times in one forward"),
    ("branch computed in no module", "in no module that can be zeroed"),
    ("too many additions in one block", "residual additions"),
    ("removal is not its branch zeroed", "is not its branch contributing nothing"),
    ("removal does not run", "does not run ("),
    ("addition in the model's own forward", "in the model's own forward"),
    ("no residual edge", "no residual edge"),
)


def category(reason: str) -> str:
    return next((name for name, text in CATEGORIES if text in reason), "other")


def family_of(arch: str) -> str:
    import timm

    return next(module for module in timm.list_modules() if arch in timm.list_models(module=module))


def visiting_order(archs: list[str]) -> list[str]:
    """One architecture per timm module in turn (modules in name order, each module's models in timm's order)."""
    import timm

    by_module = [[a for a in timm.list_models(module=m) if a in set(archs)] for m in sorted(timm.list_modules())]
    order = []
    for i in range(max((len(group) for group in by_module), default=0)):
        order += [group[i] for group in by_module if i < len(group)]
    return order


def inputs(arch: str, max_params: int) -> dict[str, Any]:
    """What a row depends on (a stored row is kept only while these match)."""
    import timm

    from zoo.models.discovered import code_digest

    return {"arch": arch, "small": SMALL, "max_params": max_params, "time_limit_s": TIME_LIMIT_S,
            "timm": timm.__version__, "torch": torch.__version__, "code": code_digest()}


def param_count(arch: str) -> int:
    import timm

    with torch.device("meta"):
        model = timm.create_model(arch, pretrained=False)
    return sum(p.numel() for p in model.parameters())


def _attempts(arch: str) -> list[tuple[dict[str, Any], tuple[int, ...] | None]]:
    """(options, input size) to try in turn: the small input as built, built for it, timm's own input size."""
    import timm

    cfg = timm.get_pretrained_cfg(arch)
    channels = (cfg.input_size if cfg is not None else (3, 224, 224))[0]
    return [({}, (channels, SMALL, SMALL)), ({"img_size": SMALL}, (channels, SMALL, SMALL)), ({}, None)]


def examine(arch: str) -> dict[str, Any]:
    """One architecture's row (run in a worker)."""
    import timm

    from zoo.models.discovered import make_prunable
    from zoo.models.discovery import DiscoveryError, recheck
    from zoo.models.timm_any import discovered, input_size_of
    from zoo.pruning.surgery import apply_plan

    torch.set_num_threads(1)
    row: dict[str, Any] = {"built": False, "traced": False, "prunable": False}
    failures = []
    for options, size in _attempts(arch):
        try:
            model = timm.create_model(arch, pretrained=False, **options).eval()
        except Exception as exc:  # noqa: BLE001 - a model that does not build with these options is a row
            failures.append(f"does not build with {options} ({type(exc).__name__}: {str(exc)[:160]})")
            continue
        row["built"] = True
        size = size or input_size_of(model, options)
        try:
            with torch.no_grad():
                model(torch.randn(1, *size))
        except Exception as exc:  # noqa: BLE001 - try the next size
            failures.append(f"does not run at {size} with {options} ({type(exc).__name__}: {str(exc)[:160]})")
            continue
        try:
            _, found = discovered(arch, options, model, size)
        except DiscoveryError as exc:
            failures.append(str(exc))
            break  # it runs at this size but does not trace: another size does not help
        row.update(traced=True, options=options, input_size=list(size), seconds=round(found.seconds, 2),
                   additions=found.additions, blocks=sum(u.kind == "block" for u in found.units),
                   removable_blocks=sum(u.kind == "block" and u.removable for u in found.removable()),
                   removable_sublayers=sum(u.kind == "sublayer" for u in found.removable()),
                   left_out=len(found.left_out))
        row["prunable"] = bool(found.removable())
        reasons = [u.reason for u in [*found.units, *found.left_out] if u.reason]
        row["reasons"] = dict(Counter(category(r) for r in reasons))
        if not row["prunable"]:
            row["reason"] = reasons[0] if reasons else (
                "no same-shape addition" if not found.additions else "no residual edge among its additions")
            row["category"] = category(row["reason"])
            return row
        again = recheck(model, found, seed=1)
        row["recheck_max_error"] = max((u.error for u in again.values() if u and u.error is not None), default=None)
        row["recheck_failed"] = sorted(n for n, u in again.items() if u is None or not u.removable)
        row["proof_dtypes"] = dict(Counter(u.dtype for u in found.removable()))
        pruned = make_prunable(model, size, None, found)
        offered = [u.name for u in pruned.depth_unit_specs() if u.removable]
        row["offered_unproven"] = sorted(set(offered) - {u.name for u in found.removable()})
        try:
            with torch.no_grad():
                whole = model(torch.randn(2, *size))
                slim = apply_plan(pruned, {"remove": offered}, inplace=False).eval()(torch.randn(2, *size))
            row["all_removed_runs"] = bool(slim.shape == whole.shape and torch.isfinite(slim).all())
        except Exception as exc:  # noqa: BLE001 - a plan that does not run is a finding, not the census's end
            row["all_removed_runs"] = False
            row["all_removed_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return row
    row["reason"] = failures[-1] if failures else "does not build"
    row["category"] = category(row["reason"])
    return row


def _guarded(arch: str) -> dict[str, Any]:
    try:
        return examine(arch)
    except Exception as exc:  # noqa: BLE001 - a crash is a row with its traceback's last line
        last = traceback.format_exc().strip().splitlines()[-1]
        return {"built": False, "traced": False, "prunable": False, "category": "other",
                "reason": f"the census raised {type(exc).__name__}: {last[:300]}"}


class Workers:
    """One worker process at a time, replaced after a time-out (a hang) or every 20 architectures (memory)."""

    def __init__(self) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.pool = None
        self.used = 0

    def run(self, arch: str, limit_s: float) -> dict[str, Any]:
        if self.pool is None or self.used >= 20:
            self.close()
            self.pool, self.used = self.context.Pool(1), 0
        self.used += 1
        job = self.pool.apply_async(_guarded, (arch,))
        try:
            return job.get(timeout=limit_s)
        except multiprocessing.TimeoutError:
            self.close()
            return {"built": True, "traced": False, "prunable": False, "category": "over the time limit",
                    "reason": f"over the time limit ({limit_s:.0f} s) for discovery, recheck and removal"}
        except Exception as exc:  # noqa: BLE001 - a worker killed (out of memory) is a row too
            self.close()
            return {"built": False, "traced": False, "prunable": False, "category": "other",
                    "reason": f"the worker died ({type(exc).__name__}: {str(exc)[:200]})"}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def summarise(rows: list[dict[str, Any]], listed: int, under: int) -> dict[str, Any]:
    done = [r for r in rows if not r.get("over_limit")]
    traced = [r for r in done if r.get("traced")]
    prunable = [r for r in traced if r.get("prunable")]
    unproven = sum(len(r.get("recheck_failed", [])) + len(r.get("offered_unproven", [])) for r in prunable)
    refusals = Counter(r.get("category", "other") for r in done if not r.get("prunable"))
    return {"listed": listed, "under_limit": under, "examined": len(done), "built": sum(r.get("built", False)
            for r in done), "traced": len(traced), "prunable": len(prunable),
            "prunable_share": round(len(prunable) / len(traced), 4) if traced else None,
            "units_offered": sum(r.get("removable_blocks", 0) + r.get("removable_sublayers", 0) for r in prunable),
            "units_failing_recheck": unproven,
            "all_removed_runs": sum(bool(r.get("all_removed_runs")) for r in prunable),
            "families_examined": len({r["family"] for r in done}),
            "families_prunable": len({r["family"] for r in prunable}),
            "refusals": dict(refusals.most_common())}


def _row(arch: str, key: str, max_params: int, workers: Workers) -> dict[str, Any]:
    """One architecture examined afresh (in a worker process of `workers`)."""
    started = time.perf_counter()
    params = param_count(arch)
    row = {"arch": arch, "family": family_of(arch), "params": params, "key": key}
    if params > max_params:
        row["over_limit"] = True
    else:
        row.update(workers.run(arch, TIME_LIMIT_S))
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def run(quick: bool = False, out: str | None = None, resume: str | None = None, hours: float | None = None,
        max_params: int = MAX_PARAMS, jobs: int = 1, **_: Any) -> dict[str, Any]:
    """The census (each row kept from `resume` where its inputs match), `jobs` architectures at a time, written as
    rows come in (in the visiting order: a row waits for the rows before it)."""
    import timm

    archs = QUICK if quick else visiting_order(timm.list_models())
    name = "timm_census_quick" if quick else "timm_census"
    stored = {r["key"]: r for r in (read_json(resume).get("rows", []) if resume else [])}
    result: dict[str, Any] = {"suite": "timm_census", "quick": quick, "small": SMALL, "max_params": max_params,
                              "timm": timm.__version__, "torch": torch.__version__, "rows": []}
    deadline = time.monotonic() + hours * 3600 if hours else math.inf
    pools = [Workers() for _ in range(jobs)]
    free = list(pools)
    lock = threading.Lock()

    def examine_in_turn(arch: str, key: str) -> dict[str, Any] | None:
        if time.monotonic() > deadline:
            return None
        with lock:
            workers = free.pop()
        try:
            return _row(arch, key, max_params, workers)
        finally:
            with lock:
                free.append(workers)

    keys = [json_digest(inputs(arch, max_params), 16) for arch in archs]
    try:
        with ThreadPoolExecutor(jobs) as executor:
            futures = [None if key in stored else executor.submit(examine_in_turn, arch, key)
                       for arch, key in zip(archs, keys)]
            for i, (arch, key, future) in enumerate(zip(archs, keys, futures)):
                row = stored[key] if future is None else future.result()
                if row is None:
                    result["stopped"] = f"the --hours budget ran out after {i} of {len(archs)} architectures"
                    for later in futures[i:]:
                        if later is not None:
                            later.cancel()
                    break
                if future is not None:
                    verdict = "over limit" if row.get("over_limit") else "prunable" if row.get("prunable") else \
                        row.get("category")
                    print(f"timm_census [{i + 1}/{len(archs)}] {arch}: {verdict} ({row['wall_s']} s)", flush=True)
                result["rows"].append(row)
                if i % 5 == 0 or i == len(archs) - 1:
                    write_result(name, result, out)
    finally:
        for workers in pools:
            workers.close()
    under = len([a for a in archs if (r := next((x for x in result["rows"] if x["arch"] == a), None)) is None
                 or not r.get("over_limit")])
    result["summary"] = summarise(result["rows"], len(archs), under)
    judge("timm_census", result)
    write_result(name, result, out)
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    summary = result.get("summary") or {}
    complete = result.get("quick") is False and "stopped" not in result
    return [Check("offered units that fail their proof on a second draw", summary.get("units_failing_recheck"),
                  "==", 0),
            Check("prunable share of the architectures that build and trace", summary.get("prunable_share"), ">=",
                  PRUNABLE_SHARE),
            Check("architectures under the limit examined", summary.get("examined") if complete else None, "==",
                  summary.get("under_limit"))]


def markdown(result: dict[str, Any]) -> str:
    summary = result["summary"]
    lines = [f"{k}: {v}" for k, v in summary.items() if k != "refusals"]
    refusals = [{"category": k, "architectures": v} for k, v in summary["refusals"].items()]
    examples = {}
    for row in result["rows"]:
        if not row.get("prunable") and not row.get("over_limit"):
            examples.setdefault(row.get("category", "other"), row["arch"])
    for item in refusals:
        item["example"] = examples.get(item["category"], "")
    return "\n".join([*lines, "", markdown_table(refusals, ["category", "architectures", "example"]), "",
                      f"Status: {result.get('status')}."])


def command_line() -> CommandLine:
    parser = CommandLine("studies.timm_census", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=out_folder, default=None)
    parser.add_argument("--resume", type=result_of("timm_census", ["rows"]), default=None, metavar="JSON")
    parser.add_argument("--hours", type=positive, default=None, help="stop starting new architectures after this long")
    parser.add_argument("--max-params", type=count, default=MAX_PARAMS)
    parser.add_argument("--jobs", type=count, default=1, help="architectures examined at once (one process each)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, args.out, args.resume, args.hours, args.max_params, args.jobs)))
    print(f"result: {results_dir(args.out)}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
