"""The prune job's plan: importance of every variant, the search within the latency budget, and the loop that keeps the
target as measured (the plan timed beside the baseline, searched again for the miss)."""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ZooError, first_line
from ..pruning import surgery
from ..pruning.importance import (
    HealedLoss,
    HealedPlanLoss,
    PlanLoss,
    PlanRecovery,
    angular_distance,
    batches_digest,
    cached_scores,
    score_variants,
    unit_io,
    weights_digest,
)
from ..pruning.search import (
    SEARCHES,
    WHOLE_SEGMENT_SEARCHES,
    BudgetError,
    Choice,
    fastest_plan,
    nearest_plans,
    search,
)
from .final_timing import measure_side_by_side
from .prune_config import measure_settings, read_plan_file

_log = logging.getLogger(__name__)


def checked_plan(plan: dict[str, Any], baseline: nn.Module, heal: str = "none") -> dict[str, Any]:
    """A plan (its form checked: :func:`~zoo.jobs.prune_config.read_plan_file`) checked against the model: it applies
    and, with ``heal="linear"``, every run of removed residual units can be healed (raises PlanError)."""
    pruned = surgery.apply_plan(baseline, plan, inplace=False)
    if heal == "linear":
        from ..pruning.healing import check_healable

        example = baseline.example_input(2)  # tokens as they are; an image drawn (not a constant one)
        if example.is_floating_point():
            example = torch.randn(example.shape, generator=torch.Generator().manual_seed(0)).to(example)
        check_healable(baseline, pruned, list(plan.get("remove", [])), [example])
    return {"remove": list(plan.get("remove", [])), "merge": bool(plan.get("merge", True))}


def resumed_plan(path: Path, baseline: nn.Module) -> dict[str, Any] | None:
    """The plan an interrupted run of the same config chose (``plan.json``), or None if there is none or it is
    damaged (then the search runs again)."""
    from ..errors import PlanError

    if not path.is_file():
        return None
    try:
        plan = checked_plan(read_plan_file(path), baseline)
    except PlanError as exc:
        _log.warning("%s is not usable (%s): searching again", path, exc)
        return None
    _log.info("resuming with the plan this run chose before it was interrupted (%s)", path)
    return plan


def calibration_batches(data: Any, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first `count` batches of the training split in its epoch-0 order: the importance calibration set, the
    same whether or not this process trained the baseline first (training leaves the sampler at its last epoch)."""
    sampler = getattr(data, "sampler", None)
    if sampler is None:
        return list(itertools.islice(data.train, count))
    saved = sampler.epoch, sampler.start
    sampler.set_epoch(0)
    try:
        return list(itertools.islice(data.train, count))
    finally:
        sampler.set_epoch(*saved)


def importance_of(cfg: Any, config: dict, baseline: nn.Module, table: Any, data: Any
                  ) -> tuple[list[dict[frozenset[str], float]], bool]:
    """Damage of every segment variant (cached per weights, score, data and segments) and whether it was cached."""
    count = cfg.prune.calib_batches
    finetuned = cfg.prune.importance == "finetune"  # scored on batches it did not train on: the next `count` ones
    batches = calibration_batches(data, 2 * count if finetuned else count)
    batches, train_batches = batches[:count], (batches[count:] if finetuned else None)
    key = {"weights": weights_digest(baseline), "score": cfg.prune.importance, "batches": batches_digest(batches),
           "segments": [s.name for s in table.segments]}
    if finetuned:
        if not train_batches:
            raise ZooError(f"prune.importance=finetune needs {2 * cfg.prune.calib_batches} training batches "
                           f"(prune.calib_batches={cfg.prune.calib_batches} to score on, as many to fine-tune on); "
                           f"the training split has fewer: lower prune.calib_batches or data.batch_size.")
        key["train_batches"] = batches_digest(train_batches)
    cache = Path(cfg.prune.cache_dir or Path(cfg.paths.log_dir) / "cache")
    return cached_scores(cache, key, table.segments, lambda: score_variants(
        baseline, table.segments, batches, cfg.prune.importance, train_batches=train_batches))


def variant_memory(table: Any, index: int, variant: frozenset[str]) -> int:
    """Peak activation memory (bytes) of one segment variant as the table measured it (0 when removed)."""
    key = table.keys[index][variant]
    return 0 if key is None else int(table.records[key].get("peak_mem_bytes") or 0)


def build_options(table: Any, damages: list[dict[frozenset[str], float]], max_memory_mb: float | None = None,
                  whole_only: bool = False) -> list[list[Choice]]:
    """Search options: per segment, every variant with its predicted latency and its damage (`whole_only`: the
    segment kept or removed whole, none of the units inside it: ``prune.export=hf``, whose stock config has every
    layer's attention and MLP).

    A memory budget is exact here: a network's peak activation memory is the largest of its parts', so it is
    met by dropping every variant (and refusing a fixed part) whose own peak exceeds it.
    """
    limit = None if max_memory_mb is None else max_memory_mb * 2**20
    if limit is not None and int(table.records[table.fixed_key].get("peak_mem_bytes") or 0) > limit:
        fixed_mb = table.records[table.fixed_key]["peak_mem_bytes"] / 2**20
        raise BudgetError(f"prune.max_memory_mb={max_memory_mb} cannot be met: the parts that are never removed "
                          f"(stem, head) alone peak at {fixed_mb:.1f} MB at this batch size.")
    options = []
    for i, (costs, seg_damage) in enumerate(zip(table.segment_costs(), damages)):
        whole = (frozenset(), frozenset({table.segments[i].name}))
        seg = [Choice(variant, latency, max(0.0, seg_damage[variant])) for variant, latency in costs
               if (limit is None or variant_memory(table, i, variant) <= limit)
               and (not whole_only or variant in whole)]
        if not seg:
            least = min(variant_memory(table, i, v) for v, _ in costs) / 2**20
            raise BudgetError(f"prune.max_memory_mb={max_memory_mb} cannot be met: segment {table.segments[i].name} "
                              f"needs at least {least:.1f} MB in every variant it has.")
        options.append(seg)
    return options


@dataclass(frozen=True)
class Target:
    """What a prune job asks for, read once from ``prune.*``: a speed-up or an end-to-end latency in ms (the latency
    wins when both are given), how close the measured result must come (``tolerance``, relative) and how many times
    the search may run again for the miss (``corrections``)."""

    speedup: float | None = 1.5
    latency_ms: float | None = None
    tolerance: float = 0.05
    corrections: int = 3

    @classmethod
    def of(cls, prune_cfg: Any) -> Target:
        """The target of a ``prune`` config group."""
        return cls(prune_cfg.target_speedup, prune_cfg.target_latency_ms, prune_cfg.target_tolerance,
                   prune_cfg.target_corrections)

    def wanted_speedup(self, baseline_ms: float) -> float:
        """The speed-up over a network of `baseline_ms` that meets this target."""
        return baseline_ms / self.latency_ms if self.latency_ms else float(self.speedup)

    def at_speedup(self, speedup: float) -> Target:
        """This target asking for `speedup` instead (the measured-target loop's corrected search)."""
        return replace(self, speedup=speedup, latency_ms=None)

    def asked(self) -> str:
        """The setting that asked for this target, as the user wrote it."""
        return (f"prune.target_latency_ms={self.latency_ms}" if self.latency_ms
                else f"prune.target_speedup={self.speedup}")


def budget_for(target: Target, table: Any) -> tuple[float, float]:
    """(target end-to-end latency, budget left for the prunable segments) in ms, as the table predicts them."""
    baseline = table.predict({"remove": []})
    goal = baseline / target.wanted_speedup(baseline)
    return goal, goal - table.fixed_cost()


def plan_loss(cfg: Any, baseline: nn.Module, table: Any, batches: list) -> PlanLoss:
    """The real calibration loss of whole plans a search scores with: at its best temperature when
    ``prune.importance=tempered`` (the damages and the plans then measure the same thing); with
    ``prune.heal=linear``, each plan healed by its gaps' maps (:class:`zoo.pruning.importance.HealedPlanLoss`)."""
    if cfg.prune.heal == "linear":
        return HealedPlanLoss(baseline, table.segments, batches, merge=cfg.prune.merge,
                              tempered=cfg.prune.importance == "tempered", ridge=cfg.prune.heal_ridge)
    return PlanLoss(baseline, table.segments, batches, merge=cfg.prune.merge,
                    tempered=cfg.prune.importance == "tempered")


def plans_scored_by(cfg: Any) -> str | None:
    """What the configured search scores whole plans by (None: it scores none)."""
    if "loss_of" not in SEARCHES[cfg.prune.search].needs:
        return None
    return "healed_plan_loss" if cfg.prune.heal == "linear" else "plan_loss"


def model_search_inputs(cfg: Any, baseline: nn.Module, table: Any, data: Any, options: list[list[Choice]]
                        ) -> dict[str, Any]:
    """What the configured search scores with besides the table's damages, on the importance calibration batches:
    each segment's whole-removal variant (``whole``), the calibration loss of the baseline without a set of units
    (``loss_of``, a :class:`zoo.pruning.importance.PlanLoss`) or the angular distance between a run's input and output
    (``distance_of``). Only the inputs the search needs are computed."""
    needs = SEARCHES[cfg.prune.search].needs
    inputs: dict[str, Any] = {}
    if "whole" in needs:
        inputs["whole"] = [next((i for i, c in enumerate(seg) if c.removed == frozenset({segment.name})), None)
                           for seg, segment in zip(options, table.segments)]
    if not {"loss_of", "distance_of"} & set(needs):
        return inputs
    count = cfg.prune.calib_batches
    recovering = "recovered_of" in needs and cfg.prune.recovery_steps > 0
    healing = "recovered_of" in needs and cfg.prune.heal == "linear"
    batches = calibration_batches(data, 2 * count if recovering or healing else count)
    batches, train_batches = batches[:count], batches[count:]
    if "loss_of" in needs:
        inputs["loss_of"] = plan_loss(cfg, baseline, table, batches)
    if healing:  # the finalists judged healed as the plan ships (fitted on the batches the job's heal fits on)
        if not train_batches:
            _log.warning("prune.heal=linear: the training split has no batches after the %d calibration batches, "
                         "so the search's finalists are judged healed on the batches the patches were fitted on",
                         count)
        inputs["recovered_of"] = HealedLoss(baseline, train_batches or batches, batches, merge=cfg.prune.merge,
                                            tempered=cfg.prune.importance == "tempered", ridge=cfg.prune.heal_ridge)
    elif "recovered_of" in needs:
        if recovering and not train_batches:
            _log.warning("prune.recovery_steps=%d needs training batches after the %d calibration batches, and the "
                         "training split has none: the search's finalists are judged one-shot (lower "
                         "prune.calib_batches or data.batch_size to recover them)", cfg.prune.recovery_steps, count)
        inputs["recovered_of"] = PlanRecovery(baseline, batches, train_batches, cfg.prune.recovery_steps) \
            if recovering and train_batches else None
    if "distance_of" in needs:
        seen = unit_io(baseline, [segment.name for segment in table.segments], batches)

        def distance_of(first: int, last: int) -> float:
            inputs_ = [a for a, _ in seen[table.segments[first].name]]
            outputs = [b for _, b in seen[table.segments[last].name]]
            if any(a.shape != b.shape for a, b in zip(inputs_, outputs)):
                return math.inf  # a run that changes the shape cannot be bypassed
            return angular_distance(inputs_, outputs)

        inputs["distance_of"] = distance_of
    return inputs


def choose_plan(cfg: Any, target: Target, table: Any, options: list[list[Choice]],
                model_inputs: dict[str, Any] | None = None, at_most: float | None = None
                ) -> tuple[dict[str, Any], Any]:
    """Run the configured search for `target`; an unreachable budget names the best achievable speed-up. With
    `at_most`, the plan's predicted speed-up must also stay at or below it (the searches that take a window:
    :data:`zoo.pruning.search.SEARCHES`); no plan in that window is a BudgetError.

    A target beyond the table's predicted ceiling by at most ``prune.target_tolerance`` (the table's own error is a
    few per cent), or one so near it that the DP's rounding to ``prune.bins`` steps finds no plan, gets the fastest
    plan, and the measured-target loop decides whether it reaches the target. Searches that remove whole segments
    only (sleb, angular, reverse) keep their own error."""
    goal, budget = budget_for(target, table)
    floor = None if at_most is None else table.predict({"remove": []}) / at_most - table.fixed_cost()
    try:
        result = search(cfg.prune.search, options, budget, floor=floor, bins=cfg.prune.bins, seed=cfg.prune.seed,
                        **(model_inputs or {}))
    except BudgetError:
        windowed = floor is not None and SEARCHES[cfg.prune.search].windowed  # the window, not the budget, was empty
        if cfg.prune.search in WHOLE_SEGMENT_SEARCHES or windowed:  # its own message says what is not met
            raise
        result = fastest_plan(options)
        _log.warning("the target (%.3f ms predicted) is %s: the fastest plan is taken and measured", goal,
                     against_ceiling(cfg, target, table, options))
        return {"remove": result.removed(options), "merge": cfg.prune.merge}, result
    plan = {"remove": result.removed(options), "merge": cfg.prune.merge}
    return plan, result


def against_ceiling(cfg: Any, target: Target, table: Any, options: list[list[Choice]]) -> str:
    """How the target stands to the table's fastest plan, for a target beyond the budget a search can meet: within
    ``prune.target_tolerance`` of it, what to say (the fastest plan is then taken and measured); further beyond, a
    BudgetError naming the most this network can give and what to ask for instead."""
    goal, _ = budget_for(target, table)
    fastest = table.fixed_cost() + fastest_plan(options).latency
    baseline = table.predict({"remove": []})
    best = baseline / fastest
    if fastest > goal * (1.0 + target.tolerance):
        instead = (f"ask for prune.target_latency_ms above {fastest:.3f}" if target.latency_ms
                   else f"ask for prune.target_speedup below {best:.2f}")
        raise BudgetError(f"{target.asked()} cannot be reached: removing and merging every removable unit gives at "
                          f"most {best:.2f}x ({baseline:.3f} -> {fastest:.3f} ms predicted); {instead}.")
    why = (f"within prune.bins={cfg.prune.bins} steps of the table's fastest plan" if fastest <= goal else
           f"{100 * (fastest / goal - 1.0):.1f} % beyond the table's fastest plan, within "
           f"prune.target_tolerance={target.tolerance:.3g}")
    return f"{why} ({fastest:.3f} ms, {best:.2f}x)"


def latency_only_options(table: Any, max_memory_mb: float | None = None, whole_only: bool = False
                         ) -> list[list[Choice]]:
    """Search options from the table alone (every damage 0): enough to know the fastest plan, before any weights."""
    return build_options(table, [{variant: 0.0 for variant, _ in costs} for costs in table.segment_costs()],
                         max_memory_mb, whole_only)


def ceiling_speedup(table: Any, options: list[list[Choice]]) -> float:
    """The table's predicted speed-up of its fastest plan: the most a search can ask of this network."""
    return table.predict({"remove": []}) / (table.fixed_cost() + fastest_plan(options).latency)


@dataclass
class TargetAttempt:
    """One plan of the measured-target loop: the speed-up it was searched for (predicted), its predicted and measured
    speed-ups, and how far the measurement is from the wanted speed-up (relative)."""

    searched_for: float
    predicted: float
    measured: float
    wanted: float
    plan: dict[str, Any]
    result: Any = field(repr=False, default=None)

    @property
    def miss(self) -> float:
        return self.measured / self.wanted - 1.0

    def record(self) -> dict[str, Any]:
        return {"searched_for": round(self.searched_for, 5), "predicted_speedup": round(self.predicted, 5),
                "measured_speedup": round(self.measured, 5), "wanted_speedup": round(self.wanted, 5),
                "miss": round(self.miss, 5), "removed": len(self.plan["remove"])}


def predicted_speedup(table: Any, plan: dict[str, Any]) -> float:
    """The table's predicted speed-up of `plan` (the unpruned network's predicted latency over the plan's)."""
    return table.predict({"remove": []}) / table.predict(plan)


def measured_speedup(table: Any, baseline: nn.Module, plan: dict[str, Any], settings: Any) -> tuple[float, float]:
    """(baseline ms, baseline / pruned) of `plan` applied one shot, timed beside the baseline (deploy forms)."""
    pruned = surgery.apply_plan(baseline, plan, inplace=False).eval()
    timed = measure_side_by_side(table, {"baseline": baseline, "pruned": pruned}, settings, unfused=False)
    estimate = f"{table.settings.estimator}_ms"
    return timed["baseline"][estimate], timed["baseline"][estimate] / timed["pruned"][estimate]


def windowed_plan(cfg: Any, target: Target, table: Any, options: list[list[Choice]], model_inputs: dict[str, Any],
                  speedup: float) -> tuple[dict[str, Any], Any]:
    """The measured-target loop's corrected search for a predicted `speedup`, in the first window that holds a plan:
    at least `speedup` and at most ``1 + tolerance`` times it; then within half the tolerance either side; then
    within the tolerance either side. Large units leave gaps between the plans a table can make (EfficientNet-B0 at
    32 px: three blocks of 13 ms in 48, nothing between 1.47x and 1.64x), so the nearest plan may lie below."""
    tol = target.tolerance
    windows = ((speedup, speedup * (1 + tol)), (speedup / (1 + tol / 2), speedup * (1 + tol / 2)),
               (speedup / (1 + tol), speedup * (1 + tol)))
    for low, high in windows[:-1]:
        try:
            return choose_plan(cfg, target.at_speedup(low), table, options, model_inputs, at_most=high)
        except BudgetError:
            continue
    low, high = windows[-1]
    return choose_plan(cfg, target.at_speedup(low), table, options, model_inputs, at_most=high)


IMPLAUSIBLE = 1.5  # a measured speed-up this far (either way) from the table's prediction is timed again: the table
# predicts within a few per cent (docs/latency.md), so the measurement, not the plan, is what was off


def corrected_plan(cfg: Any, target: Target, table: Any, options: list[list[Choice]], model_inputs: dict[str, Any],
                   baseline: nn.Module, plan: dict[str, Any], result: Any) -> tuple[TargetAttempt, list[TargetAttempt]]:
    """Keep `target` as measured: the plan is timed beside the baseline; while its measured speed-up misses the
    wanted one (:meth:`Target.wanted_speedup` of the measured baseline) by more than half the target's tolerance,
    the search runs again for a predicted speed-up scaled by the miss, at most ``target.corrections`` times. A
    corrected search keeps to a window around that speed-up (:func:`windowed_plan`): the plan of least loss within a
    budget can be much faster than asked (removals interact: two blocks together can cost less quality than one),
    and then every corrected budget finds that plan again.
    Returns the plan closest to the wanted speed-up and every plan tried.

    The table predicts speed-ups within a few per cent (docs/latency.md); this loop removes that error from the
    result, at the cost of one timing per plan tried (weights do not change latency, so plans are timed unpruned)."""
    settings = measure_settings(cfg.prune)
    searched_for = predicted_speedup(table, plan)
    tried: list[TargetAttempt] = []
    while True:
        base_ms, measured = measured_speedup(table, baseline, plan, settings)
        predicted = predicted_speedup(table, plan)
        if max(measured / predicted, predicted / measured) > IMPLAUSIBLE:  # a spike in one network's rounds
            _log.warning("plan for %.3fx predicted measured %.3fx: timed again", predicted, measured)
            base_ms, measured = measured_speedup(table, baseline, plan, settings)
        wanted = target.wanted_speedup(base_ms)
        tried.append(TargetAttempt(searched_for, predicted_speedup(table, plan), measured, wanted, plan, result))
        _log.info("plan for %.3fx predicted: %.3fx measured (wanted %.3fx, %+.1f %%)", searched_for,
                  measured, wanted, 100 * tried[-1].miss)
        if abs(tried[-1].miss) <= target.tolerance / 2 or len(tried) > target.corrections:
            break
        searched_for = tried[-1].predicted * wanted / measured
        try:
            plan, result = windowed_plan(cfg, target, table, options, model_inputs, searched_for)
        except BudgetError as exc:
            _log.warning("no plan for the corrected target %.3fx in its window (%s)", searched_for, first_line(exc))
            tried += time_bracket(cfg, target, table, options, baseline, searched_for, tried, settings)
            break
        if any(sorted(c.plan["remove"]) == sorted(plan["remove"]) for c in tried):
            _log.info("the corrected target %.3fx gives a plan already timed", searched_for)
            tried += time_bracket(cfg, target, table, options, baseline, searched_for, tried, settings)
            break
    best = min(tried, key=lambda c: abs(c.miss))
    if abs(best.miss) > target.tolerance:
        _log.warning("no plan within prune.target_tolerance=%.3g of the wanted %.3fx was found (closest: %.3fx "
                     "measured); the plan closest to it is kept", target.tolerance, best.wanted,
                     best.measured)
    return best, tried


def time_bracket(cfg: Any, target: Target, table: Any, options: list[list[Choice]], baseline: nn.Module,
                 speedup: float, tried: list[TargetAttempt], settings: Any) -> list[TargetAttempt]:
    """The plans nearest a predicted `speedup` on either side (:func:`~zoo.pruning.search.nearest_plans`: the slowest
    that reaches it, the fastest that does not), each timed beside the baseline unless it was tried already: when the
    window around a corrected target is empty, the plan kept is the closest measured one of these, not the only
    plan tried. A search that removes whole segments only (sleb, angular, reverse) keeps to its own plans: none."""
    if cfg.prune.search in WHOLE_SEGMENT_SEARCHES:
        _log.info("keeping the closest plan tried (prune.search=%s removes whole segments only)", cfg.prune.search)
        return []
    _log.info("timing the nearest plans on both sides of %.3fx", speedup)
    goal = table.predict({"remove": []}) / speedup
    timed = {tuple(sorted(c.plan["remove"])) for c in tried}
    found = []
    for result in nearest_plans(options, goal - table.fixed_cost()):
        if result is None:
            continue
        plan = {"remove": result.removed(options), "merge": cfg.prune.merge}
        if tuple(sorted(plan["remove"])) in timed:
            continue
        base_ms, measured = measured_speedup(table, baseline, plan, settings)
        found.append(TargetAttempt(speedup, predicted_speedup(table, plan), measured, target.wanted_speedup(base_ms),
                                   plan, result))
        _log.info("nearest plan at %.3fx predicted: %.3fx measured (wanted %.3fx, %+.1f %%)", found[-1].predicted,
                  measured, found[-1].wanted, 100 * found[-1].miss)
    return found


def target_check(target: Target, results: dict[str, Any], corrections: list[dict[str, Any]] | None
                 ) -> dict[str, Any]:
    """Whether the final measurement met `target`: the measured speed-up within its tolerance of the wanted one (of
    the measured baseline), and the plans the measured-target loop tried (None: the plan was given or resumed, not
    searched now)."""
    wanted = target.wanted_speedup(results["baseline"]["latency_ms"])
    miss = results["measured_speedup"] / wanted - 1.0
    return {"wanted_speedup": wanted, "measured_speedup": results["measured_speedup"], "miss": miss,
            "tolerance": target.tolerance, "met": abs(miss) <= target.tolerance,
            "corrections": corrections}
