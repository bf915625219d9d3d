"""Depth-pruning any timm model: a spread of architectures from timm, each pruned by ``python prune.py model=timm
model.name=<name>`` on the embedded digits at 32 px, over seeds; and the cost of a discovered model's whole run
against the declared family of the same architecture.

Per architecture and seed, one table row: the units discovered (removable blocks and sub-layers), the table's
predicted speed-up ceiling, the measured (and predicted) speed-up at the 1.5x target and whether it is within
``prune.target_tolerance``, every plan the measured-target loop timed (``tried``), top-1 before (the unpruned
baseline) and after (pruned and fine-tuned), and the run's time. A run that is refused (a model that cannot reach the
target) is a row with its reason. Every row is kept in the result file as it is made, with the fingerprint of its
inputs (settings, versions, device and a digest of the code a run executes): ``--resume FILE`` keeps the rows whose
inputs match and runs the rest.

Targets: at least 12 architectures from at least 8 timm families prune to the measured target in every seed; the whole
``prune.py`` of ``timm/mobilenetv2_050`` (discovered) within 1.5x the time of the declared ``mobilenetv2_050``'s
(median of alternating pairs).

    python -m studies.timm_prune --out results [--seeds 3] [--resume results/timm_prune_cpu.json]   # hours
    python -m studies.timm_prune --quick        # two tiny architectures, one seed, one cost pair (minutes)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    Check,
    CommandLine,
    count,
    judge,
    markdown_table,
    out_folder,
    read_json,
    result_of,
    results_dir,
    write_result,
)
from studies.jobs import ROOT, job_command
from zoo.errors import run_command
from zoo.files import json_digest, read_sealed_json

TARGET, MIN_ARCHS, MIN_FAMILIES, COST_LIMIT = 1.5, 12, 8, 1.5
ARCHS = {  # timm name: the options that fit it to 32 px digits (a ViT is built for its input size). One of each family
    # first, so that a partial run (rows are kept as they are made) covers every family before a second member.
    "resnet18": [], "regnetx_004": [], "convnext_atto": [], "efficientnet_b0": [], "mobilenetv3_large_100": [],
    "ghostnet_100": [], "deit_tiny_patch16_224": ["+model.overrides.img_size=32"], "poolformer_s12": [],
    "edgenext_xx_small": [], "pvt_v2_b0": [], "mambaout_femto": [], "dla34": [],
    "mixer_s16_224": ["+model.overrides.img_size=32"], "resnext50_32x4d": [], "resnet34": [], "regnety_004": [],
    "convnext_femto": [], "vit_tiny_patch16_224": ["+model.overrides.img_size=32"],
}
QUICK_ARCHS = {"resnet18": [], "deit_tiny_patch16_224": ["+model.overrides.img_size=16"]}
COMMON = ["data=digits", "data.image_size=32", "trainer.max_epochs=6", "finetune.epochs=2", "logger=none",
          "trainer.progress=false", f"prune.target_speedup={TARGET}"]
QUICK = ["data=digits", "data.image_size=16", "trainer.max_epochs=1", "trainer.limit_train_batches=4",
         "finetune.epochs=1", "prune.batch_size=4", "prune.calib_batches=1", "logger=none", "trainer.progress=false",
         "prune.target_speedup=1.25", "++prune.table={warmup_s: 0.2, min_rounds: 3, max_rounds: 6}",
         "++prune.measure={warmup_s: 0.2, min_rounds: 3, max_rounds: 6}"]
COST_PAIR = {"declared": ["model=mobilenetv2_050"], "discovered": ["model=timm", "model.name=mobilenetv2_050"]}


def prune_run(overrides: list[str], folder: Path, log_dir: Path) -> tuple[int, dict[str, Any] | None, str, float]:
    """``python prune.py`` in `folder` (baselines and caches under `log_dir`): exit status, results, output, seconds."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    command = job_command("prune.py", [*overrides, f"paths.log_dir={log_dir}", f"hydra.run.dir={folder}"])
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    results = read_sealed_json(folder / "results.json") if (folder / "results.json").is_file() else None
    return proc.returncode, results, proc.stdout + proc.stderr, seconds


def units_of(arch: str, overrides: list[str]) -> dict[str, Any]:
    """The discovered units of `arch` built as the runs build it: removable blocks, sub-layers, its timm family."""
    import zoo

    options = {o.split("=", 1)[0].removeprefix("+model.overrides."): int(o.split("=", 1)[1])
               for o in overrides if o.startswith("+model.overrides.")}
    with torch.device("meta"):  # the family from the class's module; units from a real (small) build
        family = type(zoo.create_model(f"timm/{arch}", num_classes=10, **options)).__module__.rsplit(".", 1)[-1]
    model = zoo.create_model(f"timm/{arch}", num_classes=10, **options)
    units = [u for u in model.depth_unit_specs() if u.removable]
    return {"family": family, "blocks": sum(u.kind == "block" for u in units),
            "sublayers": sum(u.kind == "sublayer" for u in units)}


def row_inputs(arch: str, overrides: list[str], seed: int, common: list[str]) -> dict[str, Any]:
    """What a row's numbers depend on: the architecture and its options, the seed, the common settings, the library
    versions and the device (a row is kept on --resume only while these match)."""
    import platform

    import timm

    from benchmarks.common import machine

    return {"arch": arch, "overrides": overrides, "seed": seed, "common": common, "torch": torch.__version__,
            "timm": timm.__version__, "python": platform.python_version(), "device": machine("cpu").get("device"),
            "code": run_code()}


@cache
def run_code() -> str:
    """A digest of the code a prune.py run executes (``zoo/``, ``prune.py``, ``conf/``): a row made by other code is
    not kept. Docstrings and comments are not part of it. Read once per process (every row's key, the result and the
    stored cost pairs share it), not parsed again for each row."""
    from studies.prune_quality import files_digest

    conf = json_digest({str(f.relative_to(ROOT)): f.read_text() for f in sorted((ROOT / "conf").rglob("*.yaml"))})
    return f"{files_digest(ROOT / 'zoo', ROOT / 'prune.py')}-{conf}"


def one_row(arch: str, overrides: list[str], seed: int, common: list[str], root: Path) -> dict[str, Any]:
    """One prune.py run of `arch` at `seed`, and its row."""
    folder = root / f"{arch}-seed{seed}"
    code, results, output, seconds = prune_run(
        ["model=timm", f"model.name={arch}", *overrides, *common, f"trainer.seed={seed}", f"prune.seed={seed}"],
        folder, root / "outputs")
    row: dict[str, Any] = {"arch": arch, "seed": seed, "seconds": round(seconds, 1), "exit": code,
                           **units_of(arch, overrides)}
    if results is None:
        lines = [line for line in output.splitlines() if "Error" in line or "error:" in line]
        row["refused"] = (lines[-1] if lines else output[-300:]).split("] - ")[-1][:400]
        return row
    check = results["target_check"]
    row.update(ceiling=results.get("ceiling_speedup"), measured_speedup=round(results["measured_speedup"], 3),
               predicted_speedup=round(results["predicted_speedup"], 3), met=bool(check["met"]),
               removed=len(results["plan"]["remove"]),
               tried=[{k: c[k] for k in ("searched_for", "predicted_speedup", "measured_speedup", "removed")}
                      for c in check.get("corrections") or []],
               acc_before=results["baseline"]["metrics"].get("val/acc1"),
               acc_after=results["pruned"]["metrics"].get("val/acc1"))
    return row


def cost_pairs(pairs: int, common: list[str], root: Path) -> dict[str, Any]:
    """The whole prune.py of the discovered and the declared MobileNetV2-0.5, cold (a fresh folder each), in turns."""
    seconds: dict[str, list[float]] = {name: [] for name in COST_PAIR}
    for pair in range(pairs):
        for name, model in COST_PAIR.items():
            folder = root / f"cost-{name}-{pair}"
            code, _, output, took = prune_run([*model, *common], folder / "run", folder / "outputs")
            if code != 0:
                raise RuntimeError(f"the {name} MobileNetV2 run failed ({code}): {output[-1500:]}")
            seconds[name].append(round(took, 1))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {"seconds": seconds, "median_s": medians, "ratio": round(medians["discovered"] / medians["declared"], 3)}


def run(quick: bool = False, device: str = "cpu", out: str | None = None, seeds: int | None = None,
        resume: str | None = None, workdir: str | None = None, **_: Any) -> dict[str, Any]:
    """The cost pairs, then every architecture at every seed (each kept from `resume` where its inputs match); the
    result is written after the pairs and after every row, so a run stopped part-way keeps what it made."""
    archs, common = (QUICK_ARCHS, QUICK) if quick else (ARCHS, COMMON)
    seeds = seeds or (1 if quick else 3)
    stored = {r["key"]: r for r in (read_json(resume).get("rows", []) if resume else [])
              if r.get("exit") in (0, 2)}  # a run that crashed (a full disk, a bug) is run again, never kept
    root = Path(workdir or tempfile.mkdtemp(prefix="timm_prune-"))
    name = "timm_prune_quick" if quick else "timm_prune"
    result: dict[str, Any] = {"suite": "timm_prune", "quick": quick, "target": TARGET, "common": common,
                              "seeds": seeds, "code": run_code(), "rows": []}
    result["cost"] = stored_cost(resume, common) or cost_pairs(1 if quick else 2, common, root)  # first: minutes
    write_result(name, result, out)
    for seed in range(seeds):  # seed-major: a partial result covers every architecture once before any twice
        for arch, overrides in archs.items():
            key = json_digest(row_inputs(arch, overrides, seed, common), 16)
            row = stored.get(key) or {**one_row(arch, overrides, seed, common, root), "key": key}
            took = "kept" if key in stored else f"{row['seconds']} s"
            print(f"timm_prune: {arch} seed {seed}: {row.get('measured_speedup', row.get('refused'))} ({took})",
                  flush=True)
            result["rows"].append(row)
            write_result(name, result, out)
    result["summary"] = summarise(result["rows"])
    judge("timm_prune", result)
    write_result(name, result, out)
    return result


def stored_cost(resume: str | None, common: list[str]) -> dict[str, Any] | None:
    """The cost pairs of a stored result made with the same common settings and code (else None: measured again)."""
    if not resume:
        return None
    stored = read_json(resume)
    same = stored.get("common") == common and stored.get("code") == run_code()
    return stored.get("cost") if same and stored.get("cost") else None


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per architecture: its family and units, seeds that met the target, mean (sd) speed-up and top-1 before and
    after, mean time."""
    out = []
    for arch in dict.fromkeys(r["arch"] for r in rows):
        mine = [r for r in rows if r["arch"] == arch]
        done = [r for r in mine if "measured_speedup" in r]

        def stat(key: str, done: list[dict[str, Any]] = done) -> str:
            values = [r[key] for r in done if r.get(key) is not None]
            if not values:
                return "-"
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.2f} ({sd:.2f})"

        out.append({"arch": arch, "family": mine[0]["family"], "blocks": mine[0]["blocks"],
                    "sublayers": mine[0]["sublayers"], "ceiling": stat("ceiling"), "seeds": len(mine),
                    "met": sum(r.get("met", False) for r in mine), "speedup": stat("measured_speedup"),
                    "top1_before": stat("acc_before"), "top1_after": stat("acc_after"), "seconds": stat("seconds"),
                    "refused": next((r["refused"] for r in mine if "refused" in r), None)})
    return out


def checks(result: dict[str, Any]) -> list[Check]:
    summary = result.get("summary") or summarise(result.get("rows") or [])
    need = result.get("seeds") or 1  # every seed the run was asked for: a partial run is not judged on fewer
    pruned = [s for s in summary if s["seeds"] >= need and s["met"] == s["seeds"]]
    archs = len(pruned) if summary else None
    families = len({s["family"] for s in pruned}) if summary else None
    ratio = (result.get("cost") or {}).get("ratio")
    return [Check(f"architectures that prune to the measured {result.get('target', TARGET)}x in every seed", archs,
                  ">=", MIN_ARCHS),
            Check("timm families among them", families, ">=", MIN_FAMILIES),
            Check("whole prune.py, discovered over declared MobileNetV2-0.5", ratio, "<=", COST_LIMIT)]


def markdown(result: dict[str, Any]) -> str:
    columns = ["arch", "family", "blocks", "sublayers", "ceiling", "seeds", "met", "speedup", "top1_before",
               "top1_after", "seconds"]
    table = markdown_table(result["summary"], columns)
    refused = [f"- {s['arch']}: {s['refused']}" for s in result["summary"] if s["refused"]]
    cost = result.get("cost") or {}
    return "\n".join([table, *refused, "", f"Whole prune.py, discovered / declared MobileNetV2-0.5: "
                      f"{cost.get('ratio')} ({cost.get('median_s')}). Status: {result.get('status')}."])


def command_line() -> CommandLine:
    parser = CommandLine("studies.timm_prune", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=count, default=None)
    parser.add_argument("--out", type=out_folder, default=None)
    parser.add_argument("--resume", type=result_of("timm_prune", ["rows"]), default=None, metavar="JSON")
    parser.add_argument("--workdir", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, "cpu", args.out, args.seeds, args.resume, args.workdir)))
    print(f"result: {results_dir(args.out)}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
