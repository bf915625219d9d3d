"""Pruning quality: does the search and its importance make a measurable difference, at equal measured latency?

For each family, on a task that is not near its ceiling (real data that exists offline):

1. train the baseline until its validation metric stops improving (``trainer.patience``; cached, shared by seeds);
2. build its latency table on the device (cached) and, per seed, choose a plan for 1.5x and 2.0x with every method:
   the DP with each importance (``loss``, ``similarity``, ``finetune``, ``block_influence`` = a latency-aware
   ShortGPT), greedy and random (``loss``), SLEB-style iterative removal and Gromov et al.'s angular run;
3. measure every distinct plan beside the baseline in one interleaved session per target (equal *measured* latency is
   what the rows are compared at);
4. per (method, target, seed): quality one-shot (the plan applied and merged, no training), after a short and after
   the full fine-tune (each a real ``prune.py`` fine-tune: distillation from the baseline, linearisation), and its
   agreement with the baseline (top-1 agreement and KL(baseline || pruned), per image or per token).

A seed changes the calibration batches (so the importance), the random search and the fine-tuning's data order;
the baseline is the same. Statistics: mean and standard deviation over seeds, and per seed the paired difference of
each method against random (and the best DP against greedy), reported in seed standard deviations.

Verdicts (computed): ``baseline_below_ceiling`` (classification: at most 97 % top-1); ``separates`` (random's one-shot
2.0x plans lose at least 5 points, or 20 % perplexity, on average); ``dp_wins`` per reference (the best DP importance
at 2.0x after the short fine-tune beats random / greedy by more than two standard errors of the paired difference).

Each cell is stored in the work directory under a key of everything that determines it (family config, baseline
weights, method, seed, target, plan, fine-tune lengths), so an interrupted run continues and a changed input is
recomputed.

    python -m benchmarks.prune_quality [--quick] [--families a,b] [--seeds 3] [--workdir DIR] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import markdown_table, results_dir, write_result
from benchmarks.prune_speedup import compose

FAMILIES: dict[str, list[str]] = {  # family: overrides of its task (a converged baseline, not at its ceiling)
    "mobilenetv2_050": ["model=mobilenetv2_050", "data=digits", "data.image_size=16", "data.train_samples=300",
                        "data.batch_size=32", "data.shift=1", "trainer.max_epochs=150", "trainer.patience=15",
                        "prune.batch_size=8", "finetune.epochs=10"],
    "retnet_tiny4": ["model=retnet_tiny", "++model.overrides.depth=4", "data=bytes", "data.seq_len=64",
                     "data.train_samples=1024", "optim.lr=2e-3", "optim.weight_decay=0.01", "trainer.max_epochs=120",
                     "trainer.patience=8", "prune.batch_size=4", "finetune.epochs=5"],
    # BiT-50 and TResNet-M: their depth structure (every block and activation) at a reduced width, so that a
    # converged baseline and 48 fine-tunes fit a 2-core CPU (full width: 30-70 s per epoch here). TResNet-M at
    # quarter width did not separate methods (random one-shot 2.0x plans lost 3.3 points); at an eighth it does.
    "resnetv2_50x1_bit_w0.5": ["model=resnetv2_50x1_bit", "++model.overrides.width_factor=0.5", "data=digits",
                               "data.image_size=16", "data.train_samples=300", "data.batch_size=32", "data.shift=1",
                               "trainer.max_epochs=120", "trainer.patience=12", "prune.batch_size=8",
                               "finetune.epochs=6"],
    "tresnet_m_w0.125": ["model=tresnet_m", "++model.overrides.width_factor=0.125", "data=digits",
                         "data.image_size=32", "data.train_samples=300", "data.batch_size=32", "data.shift=1",
                         "trainer.max_epochs=120", "trainer.patience=12", "prune.batch_size=8", "finetune.epochs=6"],
}
METHODS: dict[str, tuple[str, str]] = {  # method: (prune.search, prune.importance)
    "dp_loss": ("dp", "loss"), "dp_similarity": ("dp", "similarity"), "dp_finetune": ("dp", "finetune"),
    "dp_block_influence": ("dp", "block_influence"), "greedy": ("greedy", "loss"), "random": ("random", "loss"),
    "sleb": ("sleb", "loss"), "angular": ("angular", "loss"),
}
DP_METHODS = tuple(m for m, (search, _) in METHODS.items() if search == "dp")
TARGETS = (1.5, 2.0)
STAGES = ("one_shot", "short", "full")
SHORT_EPOCHS = 1
COMMON = ["logger=none", "trainer.progress=false", "trainer.save_checkpoints=false", "prune.calib_batches=4",
          "++prune.lut={warmup_s: 0.5, min_rounds: 5, max_rounds: 15}"]
MEASURE = {"warmup_s": 0.5, "min_rounds": 7, "max_rounds": 11, "runs_per_round": 3}
QUICK_MEASURE = {"warmup_s": 0.1, "min_rounds": 3, "max_rounds": 3, "runs_per_round": 2}
QUICK = ["data.image_size=8", "data.train_samples=64", "trainer.max_epochs=2", "trainer.patience=null",
         "finetune.epochs=1", "prune.batch_size=2", "prune.calib_batches=1",
         "++prune.lut={warmup_s: 0.1, min_rounds: 3, max_rounds: 3}"]
CEILING_ACC, SEPARATION_POINTS, SEPARATION_PPL = 97.0, 5.0, 0.20


# ------------------------------------------------------------------------------------------------- quality
@torch.no_grad()
def outputs_on(model: torch.nn.Module, loader: Any, limit: int | None = None) -> list[torch.Tensor]:
    """The model's logits on every validation batch (eval mode)."""
    model.eval()
    return [model(inputs).float() for i, (inputs, _) in enumerate(loader) if limit is None or i < limit]


@torch.no_grad()
def agreement(reference: list[torch.Tensor], model: torch.nn.Module, loader: Any, limit: int | None = None
              ) -> dict[str, float]:
    """Top-1 agreement (%) with the reference logits and mean KL(reference || model) per image or token (nats)."""
    agree = kl = count = 0.0
    for ref, out in zip(reference, outputs_on(model, loader, limit)):
        ref, out = ref.reshape(-1, ref.shape[-1]), out.reshape(-1, out.shape[-1])
        agree += (ref.argmax(-1) == out.argmax(-1)).sum().item()
        kl += F.kl_div(out.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="sum").item()
        count += ref.shape[0]
    return {"agreement": 100.0 * agree / max(count, 1.0), "kl": kl / max(count, 1.0)}


def quality(model: torch.nn.Module, data: Any, reference: list[torch.Tensor], limit: int | None) -> dict[str, float]:
    """Validation metrics (as prune.py reports them) and agreement with the baseline."""
    from zoo.training import evaluate

    metrics = evaluate(model.eval(), data.val, task=data.task, limit_batches=limit)
    keep = ("acc1", "loss") if data.task == "classification" else ("ppl", "bpb", "loss")
    return {**{k: metrics[k] for k in keep}, **agreement(reference, model, data.val, limit)}


def metric_name(task: str) -> str:
    return "acc1" if task == "classification" else "ppl"


# -------------------------------------------------------------------------------------------------- cells
class Family:
    """One family's task: its composed config, data, converged baseline, latency table and baseline outputs."""

    def __init__(self, name: str, overrides: list[str], root: Path):
        from zoo.importance import weights_digest
        from zoo.jobs.prune import build_lut, load_or_train_baseline
        from zoo.jobs.runs import fingerprint
        from zoo.training import build_loaders

        self.name, self.overrides, self.root = name, overrides, root
        self.loaders: dict[int, Any] = {}
        self.loss_options: dict[int, Any] = {}
        self.cfg = self.compose(seed=None)
        self.config = self._plain(self.cfg)
        self.data = build_loaders(self.cfg.data, seed=self.cfg.trainer.seed)
        start = time.perf_counter()
        self.baseline, self.source = load_or_train_baseline(self.cfg, self.data, self.config)
        self.baseline.eval()
        self.baseline_s = time.perf_counter() - start
        self.baseline_record = self._baseline_record()
        self.table = build_lut(self.cfg, self.baseline, self.data)
        self.limit = self.cfg.trainer.limit_val_batches
        self.reference = outputs_on(self.baseline, self.data.val, self.limit)
        self.base_quality = quality(self.baseline, self.data, self.reference, self.limit)
        self.key = {"family": name, "overrides": overrides, "config": fingerprint(self.config),
                    "baseline": weights_digest(self.baseline)}

    def compose(self, seed: int | None, extra: list[str] = ()) -> Any:
        """The family's prune config (`seed`: the fine-tuning, data order and search seed; None: the baseline's)."""
        seeded = [] if seed is None else [f"trainer.seed={seed}", f"prune.seed={seed}"]
        return compose([*self.overrides, *COMMON, *seeded, *extra, f"paths.log_dir={self.root}",
                        f"prune.cache_dir={self.root}/cache"], self.root / "runs" / self.name)

    @staticmethod
    def _plain(cfg: Any) -> dict:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(cfg, resolve=True)

    def _baseline_record(self) -> dict[str, Any]:
        """How the baseline was trained: epochs, whether it converged (patience), its best validation metric."""
        from zoo.files import read_sealed_json

        marker = Path(self.source).parent.parent / "trained.json"
        done = read_sealed_json(marker) if marker.is_file() else {}
        epochs, most = done.get("epochs"), self.cfg.trainer.max_epochs
        converged = done.get("converged", None if epochs is None else epochs < most)  # (older records: by epochs)
        return {"source": self.source, "epochs": epochs, "max_epochs": most, "converged": converged,
                "best_epoch": done.get("best_epoch"),
                "patience": self.cfg.trainer.patience, "train_s": round(self.baseline_s, 1),
                "train_samples": self.data.info.get("train_samples"), "val_samples": self.data.info.get("val_samples")}

    def seeded(self, seed: int, method: str, target: float) -> tuple[Any, Any]:
        """(config, data) of one cell: the seed's data order and calibration batches, the method's search."""
        from zoo.training import build_loaders

        search_name, importance = METHODS[method]
        cfg = self.compose(seed, [f"prune.search={search_name}", f"prune.importance={importance}",
                                  f"prune.target_speedup={target}"])
        if seed not in self.loaders:
            self.loaders[seed] = build_loaders(cfg.data, seed=seed)
        return cfg, self.loaders[seed]

    def plan(self, method: str, target: float, seed: int) -> dict[str, Any]:
        """The method's plan for `target` with this seed's calibration batches (importance cached per batches)."""
        from zoo.jobs.prune import MODEL_SEARCHES, build_options, choose_plan, importance_of, model_search_inputs

        cfg, data = self.seeded(seed, method, target)
        damages, _ = importance_of(cfg, self._plain(cfg), self.baseline, self.table, data)
        options = build_options(self.table, damages)
        inputs = model_search_inputs(cfg, self.baseline, self.table, data, options) \
            if cfg.prune.search in MODEL_SEARCHES else None
        plan, _ = choose_plan(cfg, self.table, options, inputs)
        return {"remove": sorted(plan["remove"]), "merge": plan["merge"]}

    def surrogate(self, seed: int, plan: dict[str, Any]) -> float:
        """The DP's objective for `plan` under the ``loss`` importance of this seed: the sum over segments of the
        calibration-loss increase of the plan's variant, each measured alone (what the search assumes adds up)."""
        from zoo.jobs.prune import build_options, importance_of

        if seed not in self.loss_options:
            cfg, data = self.seeded(seed, "dp_loss", TARGETS[0])
            self.loss_options[seed] = build_options(self.table, importance_of(cfg, self._plain(cfg), self.baseline,
                                                                              self.table, data)[0])
        removed = set(plan["remove"])
        total = 0.0
        for seg in self.loss_options[seed]:
            units = set().union(*(c.removed for c in seg))
            total += next(c.damage for c in seg if c.removed == frozenset(removed & units))
        return total

    def qualities(self, method: str, target: float, seed: int, plan: dict[str, Any]) -> dict[str, dict]:
        """Quality one-shot, after the short fine-tune and after the full one."""
        from zoo import surgery
        from zoo.jobs.prune import finetune
        from zoo.training.logger import NullLogger

        cfg, data = self.seeded(seed, method, target)
        one_shot = surgery.apply_plan(self.baseline, plan, inplace=False)
        found = {"one_shot": quality(one_shot, self.data, self.reference, self.limit)}
        for stage, epochs in (("short", SHORT_EPOCHS), ("full", cfg.finetune.epochs)):
            staged = self.compose(seed, [f"finetune.epochs={epochs}"]) if epochs != cfg.finetune.epochs else cfg
            with tempfile.TemporaryDirectory(dir=self.root) as scratch:
                model, _ = finetune(staged, self.baseline, plan, data, NullLogger(), Path(scratch),
                                    self._plain(staged))
            found[stage] = quality(model, self.data, self.reference, self.limit)
        found["epochs"] = {"short": SHORT_EPOCHS, "full": cfg.finetune.epochs}
        return found


def cached_cell(family: Family, key: dict[str, Any], compute: Any) -> dict[str, Any]:
    """A cell's result from the work directory when stored under the same key, else computed and stored."""
    from zoo.errors import CorruptFileError
    from zoo.files import json_digest, read_sealed_json, write_sealed_json

    path = family.root / "cells" / f"{json_digest(key, 20)}.json"
    try:
        stored = read_sealed_json(path)
        if stored.get("key") == json.loads(json.dumps(key)):
            return stored["value"]
    except CorruptFileError:
        pass
    value = compute()
    write_sealed_json(path, {"key": key, "value": value})
    return value


def measure_plans(family: Family, plans: dict[str, dict[str, Any]], settings: dict[str, Any]
                  ) -> dict[str, dict[str, float]]:
    """Every distinct plan beside the baseline, in one interleaved session: latency (ms) and measured speed-up."""
    from zoo import surgery
    from zoo.jobs.prune import measure_side_by_side
    from zoo.latency import CalibrationSettings

    nets = {"baseline": family.baseline}
    nets.update({name: surgery.apply_plan(family.baseline, plan, inplace=False).eval() for name, plan in plans.items()})
    measured = measure_side_by_side(family.table, nets, CalibrationSettings(**settings), unfused=False)
    base = measured["baseline"]["median_ms"]
    return {name: {"latency_ms": measured[name]["median_ms"], "speedup": base / measured[name]["median_ms"],
                   "predicted_ms": family.table.predict(plans[name]) if name in plans else family.table.predict(
                       {"remove": []}), "rel_uncertainty": measured[name].get("rel_uncertainty")}
            for name in measured}


def plan_name(plan: dict[str, Any]) -> str:
    from zoo.files import json_digest

    return "plan-" + json_digest(plan, 10)


def run_family(name: str, overrides: list[str], seeds: list[int], root: Path, methods: list[str],
               targets: tuple[float, ...], measure: dict[str, Any] = MEASURE) -> dict[str, Any]:
    """Every cell of one family: plans, their measured latency, and quality at each stage."""
    family = Family(name, overrides, root)
    cells, plans = [], {}
    for target in targets:
        for seed in seeds:
            for method in methods:
                try:
                    plan = family.plan(method, target, seed)
                except Exception as exc:  # noqa: BLE001 - a rule that cannot reach the target is a result, not a crash
                    cells.append({"method": method, "target": target, "seed": seed, "error": f"{exc}"[:300]})
                    continue
                plans[plan_name(plan)] = plan
                cells.append({"method": method, "target": target, "seed": seed, "plan": plan_name(plan),
                              "removed": len(plan["remove"]), "surrogate_loss": family.surrogate(seed, plan)})
    latency: dict[str, dict[str, float]] = {}
    for target in targets:
        names = sorted({c["plan"] for c in cells if c["target"] == target and "plan" in c})
        measured = measure_plans(family, {n: plans[n] for n in names}, measure)
        latency[f"baseline@{target}"] = measured.pop("baseline")  # each target's session has its own baseline
        latency.update(measured)
    for cell in cells:
        if "plan" not in cell:
            continue
        key = {**family.key, "method": cell["method"], "seed": cell["seed"], "target": cell["target"],
               "plan": plans[cell["plan"]], "short_epochs": SHORT_EPOCHS}
        cell.update(cached_cell(family, key, lambda c=cell: family.qualities(
            c["method"], c["target"], c["seed"], plans[c["plan"]])))
        cell.update({k: latency[cell["plan"]][k] for k in ("latency_ms", "speedup", "predicted_ms")})
    return {"family": name, "overrides": overrides, "task": family.data.task, "metric": metric_name(family.data.task),
            "baseline": {**family.baseline_record, **family.base_quality,
                         "latency_ms": latency[f"baseline@{targets[-1]}"]["latency_ms"]},
            "data_info": {k: v for k, v in family.data.info.items() if isinstance(v, (int, float, str))},
            "condition": {k: family.table.condition.get(k) for k in ("device_name", "batch_size", "input_size",
                                                                     "dtype", "threads", "clock", "runtime", "torch")},
            "plans": plans, "latency": latency, "cells": cells}


# ------------------------------------------------------------------------------------------------ statistics
def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def higher_is_better(metric: str) -> bool:
    return metric not in ("ppl", "bpb", "kl", "loss")


def summarise(family: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (target, method, stage): mean and sd over seeds of the metric, agreement, KL and speed-up."""
    rows = []
    metric = family["metric"]
    for target in sorted({c["target"] for c in family["cells"]}):
        for method in METHODS:
            done = [c for c in family["cells"] if c["target"] == target and c["method"] == method and "plan" in c]
            failed = [c for c in family["cells"] if c["target"] == target and c["method"] == method and "error" in c]
            if not done and not failed:
                continue
            for stage in STAGES:
                row = {"family": family["family"], "target": target, "method": method, "stage": stage,
                       "seeds": len(done), "failed": len(failed)}
                for key in (metric, "agreement", "kl"):
                    row[f"{key}_mean"], row[f"{key}_sd"] = mean_sd([c[stage][key] for c in done])
                row["speedup_mean"], row["speedup_sd"] = mean_sd([c["speedup"] for c in done])
                row["latency_ms_mean"], _ = mean_sd([c["latency_ms"] for c in done])
                row["relative_latency_mean"], row["relative_latency_sd"] = mean_sd([1.0 / c["speedup"] for c in done])
                row["removed_mean"], _ = mean_sd([c["removed"] for c in done])
                rows.append(row)
    return rows


def paired(family: dict[str, Any], method: str, reference: str, target: float, stage: str) -> dict[str, Any] | None:
    """Per-seed difference of `method` against `reference` (positive: `method` is better), its mean, sd, standard
    error and size in seed standard deviations (pooled sd of the two cells)."""
    metric = family["metric"]
    sign = 1.0 if higher_is_better(metric) else -1.0
    by_seed = {m: {c["seed"]: c[stage][metric] for c in family["cells"]
                   if c["method"] == m and c["target"] == target and "plan" in c} for m in (method, reference)}
    seeds = sorted(set(by_seed[method]) & set(by_seed[reference]))
    if len(seeds) < 2:
        return None
    diffs = [sign * (by_seed[method][s] - by_seed[reference][s]) for s in seeds]
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    pooled = math.sqrt((statistics.variance([by_seed[method][s] for s in seeds])
                        + statistics.variance([by_seed[reference][s] for s in seeds])) / 2)
    se = sd / math.sqrt(len(seeds))
    return {"method": method, "reference": reference, "target": target, "stage": stage, "seeds": len(seeds),
            "diff_mean": mean, "diff_sd": sd, "diff_se": se,
            "in_seed_sds": mean / pooled if pooled > 0 else (math.inf if mean > 0 else -math.inf if mean < 0 else 0.0),
            "wins": bool(mean > 2 * se) if se > 0 else mean > 0}


def best_dp(rows: list[dict[str, Any]], metric: str, target: float, stage: str = "short") -> str | None:
    """The DP importance with the best mean quality at (target, stage)."""
    candidates = [r for r in rows if r["method"] in DP_METHODS and r["target"] == target and r["stage"] == stage
                  and r[f"{metric}_mean"] is not None]
    if not candidates:
        return None
    pick = max if higher_is_better(metric) else min
    return pick(candidates, key=lambda r: r[f"{metric}_mean"])["method"]


def verdicts(family: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, computed: the task is below its ceiling and separates methods; where the best DP stands."""
    metric, base = family["metric"], family["baseline"]
    target = max(TARGETS) if any(c["target"] == max(TARGETS) for c in family["cells"]) else max(
        c["target"] for c in family["cells"])
    random_one_shot = next((r for r in rows if r["method"] == "random" and r["target"] == target
                            and r["stage"] == "one_shot"), None)
    out: dict[str, Any] = {"target": target}
    if family["task"] == "classification":
        out["baseline_below_ceiling"] = base["acc1"] <= CEILING_ACC
        loss = None if random_one_shot is None else base["acc1"] - random_one_shot["acc1_mean"]
        out["random_one_shot_cost"] = loss
        out["separates"] = loss is not None and loss >= SEPARATION_POINTS
    else:
        out["baseline_below_ceiling"] = base["bpb"] > 0  # a language model's ceiling (0 bits per byte) is not reached
        rise = None if random_one_shot is None else random_one_shot["ppl_mean"] / base["ppl"] - 1.0
        out["random_one_shot_cost"] = rise
        out["separates"] = rise is not None and rise >= SEPARATION_PPL
    best = best_dp(rows, metric, target)
    out["best_dp"] = best
    out["comparisons"] = [p for ref in ("random", "greedy") for stage in STAGES
                          if best and (p := paired(family, best, ref, target, stage))]
    short = {p["reference"]: p["wins"] for p in out["comparisons"] if p["stage"] == "short"}
    out["dp_wins_short"] = short
    return out


def with_statistics(family: dict[str, Any]) -> dict[str, Any]:
    """The family's rows, every method paired against random (per target and stage), and its verdicts."""
    family["rows"] = summarise(family)
    family["pairs"] = [p for target in sorted({c["target"] for c in family["cells"]}) for stage in STAGES
                       for method in METHODS if method != "random"
                       if (p := paired(family, method, "random", target, stage))]
    family["verdicts"] = verdicts(family, family["rows"])
    family["diagnostics"] = diagnostics(family)
    return family


def rank_correlation(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (None with fewer than 3 pairs or a constant side)."""
    from scipy.stats import spearmanr

    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return float(spearmanr(xs, ys).statistic)


def diagnostics(family: dict[str, Any]) -> list[dict[str, Any]]:
    """Per target, over every plan of every method and seed: does the DP's additive surrogate rank plans as their
    one-shot validation loss does, and does one-shot quality rank them as the fine-tuned quality does?"""
    metric, sign = family["metric"], (1.0 if higher_is_better(family["metric"]) else -1.0)
    out = []
    for target in sorted({c["target"] for c in family["cells"]}):
        done = [c for c in family["cells"] if c["target"] == target and "plan" in c and "surrogate_loss" in c]
        if not done:
            continue
        out.append({"target": target, "plans": len(done),
                    "surrogate_vs_one_shot_loss": rank_correlation([c["surrogate_loss"] for c in done],
                                                                    [c["one_shot"]["loss"] for c in done]),
                    "one_shot_vs_short": rank_correlation([sign * c["one_shot"][metric] for c in done],
                                                          [sign * c["short"][metric] for c in done]),
                    "one_shot_vs_full": rank_correlation([sign * c["one_shot"][metric] for c in done],
                                                         [sign * c["full"][metric] for c in done]),
                    "removed_vs_short": rank_correlation([-float(c["removed"]) for c in done],
                                                         [sign * c["short"][metric] for c in done])})
    return out


def summarise_again(path: str | Path, out: str | None = None) -> dict[str, Any]:
    """Recompute the statistics, verdicts and plot of a stored result from its cells (nothing is measured again)."""
    result = json.loads(Path(path).read_text())
    result["families"] = [with_statistics(family) for family in result["families"]]
    figure = plot(result, results_dir(out) / "prune_quality.png")
    result["plot"] = str(figure) if figure else None
    write_result("prune_quality", result, out)
    return result


# ------------------------------------------------------------------------------------------------------- plot
def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Quality vs measured latency per method (mean with error bars over seeds), one panel per family and stage.

    Latency is relative to the baseline timed in the same interleaved session (1 / measured speed-up): this machine's
    absolute milliseconds drift between sessions by more than the differences between methods."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = result["families"]
    if not families:
        return None
    fig, axes = plt.subplots(len(families), len(STAGES), figsize=(5 * len(STAGES), 4 * len(families)), squeeze=False)
    for row_axes, family in zip(axes, families):
        metric = family["metric"]
        for ax, stage in zip(row_axes, STAGES):
            for method in METHODS:
                rows = [r for r in family["rows"] if r["method"] == method and r["stage"] == stage
                        and r[f"{metric}_mean"] is not None]
                if rows:
                    ax.errorbar([r["relative_latency_mean"] for r in rows], [r[f"{metric}_mean"] for r in rows],
                                xerr=[r["relative_latency_sd"] for r in rows], yerr=[r[f"{metric}_sd"] for r in rows],
                                marker="o", capsize=3, label=method)
            ax.axhline(family["baseline"][metric], color="k", ls="--", lw=1, label="baseline")
            ax.set_title(f"{family['family']}: {stage.replace('_', '-')}")
            ax.set_xlabel("measured latency / baseline's (1 / speed-up, same session)")
            ax.set_ylabel(metric)
            if metric == "ppl":
                ax.set_yscale("log")
        row_axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# -------------------------------------------------------------------------------------------------------- run
def default_task(model: str) -> list[str]:
    """The digits task of the CNN families, for a model without its own entry in FAMILIES."""
    return [f"model={model}", "data=digits", "data.image_size=16", "data.train_samples=300", "data.batch_size=32",
            "data.shift=1", "trainer.max_epochs=100", "trainer.patience=10", "prune.batch_size=8"]


def run(quick: bool = False, device: str = "auto", out: str | None = None, families: list[str] | None = None,
        seeds: int | None = None, workdir: str | None = None, methods: list[str] | None = None) -> dict[str, Any]:
    """Every family's cells, statistics and verdicts (3 seeds; 2 with `quick`), written to ``prune_quality.json``."""
    seeds = seeds or (2 if quick else 3)
    names = families or (["mobilenetv2_035"] if quick else list(FAMILIES))
    methods = methods or list(METHODS)
    # quick: the lower target, which whole-segment rules (sleb) reach on the tiny task whatever its 3-round table
    # measured; at 2.0x, removing every removable block of MobileNetV2-0.35 at 8 px sits near the budget
    targets = TARGETS[:1] if quick else TARGETS
    root = Path(workdir or tempfile.mkdtemp(prefix="prune_quality-"))
    start = time.perf_counter()
    result: dict[str, Any] = {"suite": "prune_quality", "quick": quick, "seeds": seeds, "workdir": str(root),
                              "families": []}
    for name in names:
        overrides = [*(FAMILIES.get(name) or default_task(name)), *(QUICK if quick else [])]
        overrides = [*overrides, f"prune.device={device}"]
        family = run_family(name, overrides, list(range(seeds)), root, methods, targets,
                            QUICK_MEASURE if quick else MEASURE)
        result["families"].append(with_statistics(family))
        result["seconds"] = round(time.perf_counter() - start, 1)
        write_result("prune_quality", result, out)  # after every family: a long run keeps what it finished
    figure = plot(result, results_dir(out) / "prune_quality.png")
    result["plot"] = str(figure) if figure else None
    write_result("prune_quality", result, out)
    return result


def fmt(value: Any, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(result: dict[str, Any]) -> str:
    parts = []
    for family in result["families"]:
        metric, base, v = family["metric"], family["baseline"], family["verdicts"]
        parts.append(f"#### {family['family']} ({family['task']}, {metric}; baseline {fmt(base[metric])} after "
                     f"{base['epochs']} epochs, {family['condition']['device_name']}, batch "
                     f"{family['condition']['batch_size']})\n")
        table = [{"target": r["target"], "method": r["method"], "stage": r["stage"],
                  metric: f"{fmt(r[f'{metric}_mean'])} ± {fmt(r[f'{metric}_sd'])}",
                  "agreement %": f"{fmt(r['agreement_mean'], 1)} ± {fmt(r['agreement_sd'], 1)}",
                  "KL": f"{fmt(r['kl_mean'], 3)}", "measured speed-up": f"{fmt(r['speedup_mean'])} ± "
                  f"{fmt(r['speedup_sd'])}", "removed": fmt(r["removed_mean"], 1),
                  "seeds": f"{r['seeds']}" + (f" ({r['failed']} failed)" if r["failed"] else "")}
                 for r in family["rows"]]
        parts.append(markdown_table(table, ["target", "method", "stage", metric, "agreement %", "KL",
                                            "measured speed-up", "removed", "seeds"]))
        comp = [{"best DP": p["method"], "vs": p["reference"], "stage": p["stage"],
                 "paired diff": f"{fmt(p['diff_mean'])} ± {fmt(p['diff_sd'])}", "seed sds": fmt(p["in_seed_sds"]),
                 "wins (> 2 SE)": p["wins"]} for p in v["comparisons"]]
        parts.append(f"\nVerdicts at {v['target']}x: baseline below ceiling **{v['baseline_below_ceiling']}**; "
                     f"random one-shot cost {fmt(v['random_one_shot_cost'])} "
                     f"({'points' if family['task'] == 'classification' else 'relative ppl rise'}): separates "
                     f"**{v['separates']}**; best DP importance `{v['best_dp']}`, wins after the short fine-tune: "
                     f"{v['dp_wins_short']}.\n")
        if comp:
            parts.append(markdown_table(comp, ["best DP", "vs", "stage", "paired diff", "seed sds", "wins (> 2 SE)"]))
        if family.get("diagnostics"):
            parts.append("\nWhy (Spearman rank correlations over every plan of every method and seed; 1 = same order):"
                         "\n")
            parts.append(markdown_table([{k: fmt(v) for k, v in d.items()} for d in family["diagnostics"]],
                                        ["target", "plans", "surrogate_vs_one_shot_loss", "one_shot_vs_short",
                                         "one_shot_vs_full", "removed_vs_short"]))
        vs_random = [{"target": p["target"], "method": p["method"], "stage": p["stage"],
                      "paired diff vs random": f"{fmt(p['diff_mean'])} ± {fmt(p['diff_sd'])}",
                      "seed sds": fmt(p["in_seed_sds"]), "wins (> 2 SE)": p["wins"]}
                     for p in family.get("pairs", []) if p["stage"] != "full" or p["target"] == v["target"]]
        if vs_random:
            parts.append(f"\nEvery method against random, paired by seed (positive: better than random; "
                         f"{metric}):\n")
            parts.append(markdown_table(vs_random, ["target", "method", "stage", "paired diff vs random", "seed sds",
                                                    "wins (> 2 SE)"]))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--families", default=None, help=f"comma-separated, of {', '.join(FAMILIES)}")
    parser.add_argument("--methods", default=None, help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--seeds", type=int, default=None, help="default 3 (2 with --quick)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--workdir", default=None, help="baselines, caches and finished cells (default: a temp dir)")
    parser.add_argument("--summarise", default=None, metavar="JSON",
                        help="recompute the statistics and plot of a stored result (nothing is run or measured)")
    args = parser.parse_args(argv)
    if args.summarise:
        print(markdown(summarise_again(args.summarise, args.out)))
        return
    def split(text: str | None) -> list[str] | None:
        return text.split(",") if text else None

    print(markdown(run(args.quick, args.device, args.out, split(args.families), args.seeds, args.workdir,
                       split(args.methods))))


if __name__ == "__main__":
    main()
