"""Search: choose one variant per segment to lose the least quality within a latency budget.

Every segment (a block with its mergeable activations, or a RetNet sub-layer) offers variants —
unchanged, some activations removed and convs merged, or removed altogether — each with a predicted
latency (from the lookup table). Merges never cross segments, so latency adds up over segments exactly, and
a latency budget is a multiple-choice knapsack, solved exactly by dynamic programming over the budget
discretised into bins (costs are rounded *up*, so a returned plan never exceeds the budget): :func:`dp_search`
for the least total damage (each variant scored alone), :func:`kbest_dp` for the k least.

Quality does not add up: removals interact. The default, :func:`interaction_search`, keeps the DP as the solver
of the budget and judges whole plans by their real loss (``loss_of(removed units)``): the k best DP plans and the
plans of other rules are scored, and the best are improved by local search with conditional damages.
``kbest`` and ``local`` are its parts alone. Greedy and random searches are baselines for studies; three rules of
the layer-removal literature remove whole segments only (REFERENCE.md sections 9 and 10): ``sleb`` (iterative,
by calibration loss), ``angular`` (one contiguous run, by the angular distance of its input and output) and
``reverse`` (the last segments first).
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from ..errors import BudgetError, ZooError


@dataclass(frozen=True)
class Choice:
    """One variant of one segment: the units it removes, its latency (ms) and its damage."""

    removed: frozenset[str]
    latency: float
    damage: float


@dataclass(frozen=True)
class SearchResult:
    choices: tuple[int, ...]     # index of the chosen variant per segment
    latency: float               # sum of the chosen variants' latencies (ms)
    damage: float                # sum of the chosen variants' damages (interaction: the plan's real loss increase)
    method: str
    recovered: float | None = None  # interaction with recovery: the plan's loss after a short recovery

    def removed(self, options: Sequence[Sequence[Choice]]) -> list[str]:
        """The plan's ``remove`` list: every unit removed by the chosen variants, in segment order."""
        return [name for seg, i in zip(options, self.choices) for name in sorted(seg[i].removed)]


def _totals(options: Sequence[Sequence[Choice]], picks: Sequence[int]) -> tuple[float, float]:
    return (sum(seg[i].latency for seg, i in zip(options, picks)),
            sum(seg[i].damage for seg, i in zip(options, picks)))


def _check_reachable(options: Sequence[Sequence[Choice]], budget: float) -> None:
    fastest = sum(min(c.latency for c in seg) for seg in options)
    if fastest > budget + 1e-12:
        raise BudgetError(
            f"The latency budget of {budget:.4g} ms for the prunable segments cannot be met: removing or merging "
            f"everything possible still takes {fastest:.4g} ms. Choose a smaller target speed-up (or a larger "
            f"latency target); the best achievable is reported with the error by the caller."
        )


def _bin_costs(options: Sequence[Sequence[Choice]], budget: float, bins: int) -> list[list[int]]:
    """Each variant's latency in bins of ``budget / bins``, rounded up (so a plan that fits in bins fits the budget);
    with no budget left, a variant that takes any time costs more than every bin."""
    if budget <= 0:
        return [[0 if c.latency <= 1e-12 else bins + 1 for c in seg] for seg in options]
    unit = budget / bins
    return [[max(0, math.ceil(c.latency / unit - 1e-9)) for c in seg] for seg in options]


def dp_search(options: Sequence[Sequence[Choice]], budget: float, bins: int = 1000, floor: float | None = None
              ) -> SearchResult:
    """Exact multiple-choice knapsack: min total damage s.t. total latency <= budget (costs rounded up to bins); with
    `floor`, also total latency >= floor (no plan faster than asked: :func:`kbest_dp`'s window)."""
    if floor is not None:
        return replace(kbest_dp(options, budget, 1, bins, floor)[0], method="dp")
    _check_reachable(options, budget)
    costs = _bin_costs(options, budget, bins)
    best, picks = _knapsack(options, costs, bins + 1)
    lowest = best.min()
    end = int(np.flatnonzero(best <= lowest + 1e-12)[-1])  # among equal damage, the slowest plan: fewest changes
    if not math.isfinite(best[end]):
        raise BudgetError(f"No combination fits the budget of {budget:.4g} ms at {bins} bins; raise `bins`.")
    chosen = _backtrack(costs, picks, end)
    latency, damage = _totals(options, chosen)
    return SearchResult(tuple(chosen), latency, damage, "dp")


def _knapsack(options: Sequence[Sequence[Choice]], costs: list[list[int]], size: int
              ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The multiple-choice knapsack over integer costs below `size`: the least total damage of a plan of each exact
    total cost (inf: none), and per segment which variant gave it (for :func:`_backtrack`)."""
    best = np.full(size, math.inf)
    best[0] = 0.0
    picks = []
    for seg, seg_costs in zip(options, costs):
        new = np.full(size, math.inf)
        arg = np.full(size, -1, dtype=np.int64)
        for i, (choice, cost) in enumerate(zip(seg, seg_costs)):
            if cost >= size:
                continue
            shifted = np.full(size, math.inf)
            shifted[cost:] = best[: size - cost] + choice.damage
            better = shifted < new
            new[better], arg[better] = shifted[better], i
        best = new
        picks.append(arg)
    return best, picks


def _backtrack(costs: list[list[int]], picks: list[np.ndarray], end: int) -> list[int]:
    """The variant of each segment of the plan whose total cost is `end` (from :func:`_knapsack`'s picks)."""
    chosen = []
    for seg_costs, arg in zip(reversed(costs), reversed(picks)):
        i = int(arg[end])
        chosen.append(i)
        end -= seg_costs[i]
    return chosen[::-1]


def kbest_dp(options: Sequence[Sequence[Choice]], budget: float, k: int, bins: int = 1000, floor: float | None = None
             ) -> list[SearchResult]:
    """The `k` plans of least total damage within the budget (costs rounded up to bins, as :func:`dp_search`), best
    first: the multiple-choice knapsack DP keeping the k best partial plans per exact bin count.

    Every partial plan has one bin count, so the lists of different bins hold different plans and the k best over all
    bins within the budget are the k best plans (fewer when fewer fit). With `floor`, only plans whose exact latency
    is at least `floor` count (a window: a plan much faster than asked is not what was asked for): the bins that may
    hold such plans are searched and each plan's exact latency decides. Near the floor a bin's k best can all fall
    below it while a worse plan of that bin lies above: such a plan is missed (a limit of the k-best lists)."""
    _check_reachable(options, budget)
    if floor is not None and floor > budget + 1e-12:
        raise BudgetError(f"No plan takes at least {floor:.4g} ms and at most the budget of {budget:.4g} ms.")
    costs = _bin_costs(options, budget, bins)
    best = np.full((bins + 1, k), math.inf)
    best[0, 0] = 0.0
    steps = []  # per segment: (variant, rank in the previous list) of every kept entry
    for seg, seg_costs in zip(options, costs):
        pool = np.full((bins + 1, len(seg), k), math.inf)
        for i, (choice, cost) in enumerate(zip(seg, seg_costs)):
            if cost <= bins:
                pool[cost:, i, :] = best[: bins + 1 - cost] + choice.damage
        flat = pool.reshape(bins + 1, -1)
        order = np.argsort(flat, axis=1, kind="stable")[:, :k]
        best = np.take_along_axis(flat, order, axis=1)
        steps.append((order // k, order % k))
    finite = np.argwhere(np.isfinite(best))
    if floor is not None and budget > 0:
        finite = finite[finite[:, 0] >= math.floor(floor / (budget / bins)) - len(options)]
    ranked = sorted(finite.tolist(), key=lambda e: (best[e[0], e[1]], -e[0]))  # ties: the slower plan first
    results = []
    for end, rank in ranked:
        chosen = []
        for seg_costs, (variant, previous) in zip(reversed(costs), reversed(steps)):
            i = int(variant[end, rank])
            chosen.append(i)
            rank = int(previous[end, rank])
            end -= seg_costs[i]
        chosen.reverse()
        latency, damage = _totals(options, chosen)
        if floor is None or latency >= floor - 1e-12:
            results.append(SearchResult(tuple(chosen), latency, damage, "kbest_dp"))
        if len(results) == k:
            break
    if not results:
        window = "" if floor is None else f" and takes at least {floor:.4g} ms"
        raise BudgetError(f"No combination fits the budget of {budget:.4g} ms{window} at {bins} bins; raise `bins`"
                          f"{'' if floor is None else ' or widen the window'}.")
    return results


def _unchanged_index(seg: Sequence[Choice]) -> int:
    """The segment as it is; where a memory limit left that variant out, the slowest variant kept (the fewest
    units removed among equals): where the removal rules start."""
    return next((i for i, c in enumerate(seg) if not c.removed),
                min(range(len(seg)), key=lambda i: (-seg[i].latency, len(seg[i].removed))))


def nearest_plans(options: Sequence[Sequence[Choice]], budget: float, bins: int = 2000
                  ) -> tuple[SearchResult | None, SearchResult | None]:
    """The plans whose latency lies nearest `budget` on either side: the slowest plan within it and the fastest plan
    beyond it (None where there is none), each the least damage among the plans of its latency. Latencies are summed
    in ``bins`` steps of the slowest plan's latency (rounded), then each found plan's exact latency decides its side:
    a gap between the plans a table can make leaves the target between these two, and the measured-target loop times
    both."""
    slowest = sum(max(c.latency for c in seg) for seg in options)
    unit = max(slowest, 1e-12) / bins
    steps = [[round(c.latency / unit) for c in seg] for seg in options]
    best, picks = _knapsack(options, steps, sum(max(seg) for seg in steps) + 1)
    plans = []
    for end in np.flatnonzero(np.isfinite(best)):
        chosen = _backtrack(steps, picks, int(end))
        latency, damage = _totals(options, chosen)
        plans.append(SearchResult(tuple(chosen), latency, damage, "nearest"))
    within = [p for p in plans if p.latency <= budget + 1e-12]
    beyond = [p for p in plans if p.latency > budget + 1e-12]
    return (max(within, key=lambda p: (p.latency, -p.damage), default=None),
            min(beyond, key=lambda p: (p.latency, p.damage), default=None))


def fastest_plan(options: Sequence[Sequence[Choice]]) -> SearchResult:
    """The fastest plan the options allow: each segment's fastest variant (among equals, the least damage). Its
    ``damage`` is the sum of the variants' own damages (the additive score), whatever search was asked for."""
    picks = tuple(min(range(len(seg)), key=lambda i: (seg[i].latency, seg[i].damage)) for seg in options)
    latency, damage = _totals(options, picks)
    return SearchResult(picks, latency, damage, "fastest")


def greedy_search(options: Sequence[Sequence[Choice]], budget: float) -> SearchResult:
    """Baseline: repeatedly take the variant switch with the least damage per millisecond saved."""
    _check_reachable(options, budget)
    picks = [_unchanged_index(seg) for seg in options]
    latency, _ = _totals(options, picks)
    while latency > budget + 1e-12:
        best_step = None
        for s, seg in enumerate(options):
            current = seg[picks[s]]
            for i, choice in enumerate(seg):
                saved = current.latency - choice.latency
                if saved <= 0:
                    continue
                ratio = max(choice.damage - current.damage, 0.0) / saved
                if best_step is None or ratio < best_step[0]:
                    best_step = (ratio, s, i)
        if best_step is None:
            break
        _, s, i = best_step
        picks[s] = i
        latency, _ = _totals(options, picks)
    latency, damage = _totals(options, picks)
    return SearchResult(tuple(picks), latency, damage, "greedy")


def random_search(options: Sequence[Sequence[Choice]], budget: float, seed: int = 0) -> SearchResult:
    """Baseline: switch random segments to random faster variants until the budget is met."""
    _check_reachable(options, budget)
    rng = random.Random(seed)
    picks = [_unchanged_index(seg) for seg in options]
    order = list(range(len(options)))
    latency, _ = _totals(options, picks)
    while latency > budget + 1e-12:
        rng.shuffle(order)
        moved = False
        for s in order:
            faster = [i for i, c in enumerate(options[s]) if c.latency < options[s][picks[s]].latency]
            if faster:
                picks[s] = rng.choice(faster)
                moved = True
                break
        if not moved:
            break
        latency, _ = _totals(options, picks)
    latency, damage = _totals(options, picks)
    return SearchResult(tuple(picks), latency, damage, "random")


# -- the layer-removal rules of the language-model literature (whole segments only) ---------------------------


def _whole_budget(options: Sequence[Sequence[Choice]], whole: Sequence[int | None], budget: float) -> None:
    fastest = sum(seg[w].latency if w is not None else seg[_unchanged_index(seg)].latency
                  for seg, w in zip(options, whole))
    if fastest > budget + 1e-12:
        raise BudgetError(f"The latency budget of {budget:.4g} ms cannot be met by removing whole segments: removing "
                          f"every removable one still takes {fastest:.4g} ms. Choose a smaller target speed-up.")


def sleb_search(options: Sequence[Sequence[Choice]], budget: float, whole: Sequence[int | None],
                     loss_of: Callable[[frozenset[str]], float]) -> SearchResult:
    """SLEB (Song et al., 2024): remove whole segments one at a time, each time the one whose removal, with those
    already removed, gives the lowest calibration loss (``loss_of(removed units)``), re-scored after every removal,
    until the latency budget is met. whole: per segment, the index of its whole-removal variant (None: none)."""
    _whole_budget(options, whole, budget)
    picks = [_unchanged_index(seg) for seg in options]
    removed: frozenset[str] = frozenset()
    while _totals(options, picks)[0] > budget + 1e-12:
        candidates = [s for s, w in enumerate(whole) if w is not None and picks[s] != w]
        losses = {s: loss_of(removed | options[s][whole[s]].removed) for s in reversed(candidates)}  # last first
        best = min(candidates, key=lambda s: (losses[s], s))
        picks[best] = whole[best]
        removed |= options[best][whole[best]].removed
    latency, damage = _totals(options, picks)
    return SearchResult(tuple(picks), latency, damage, "sleb")


def _removed_by(options: Sequence[Sequence[Choice]], picks: Sequence[int]) -> frozenset[str]:
    return frozenset().union(*(seg[i].removed for seg, i in zip(options, picks)))


def _rescored(options: Sequence[Sequence[Choice]], damages: Sequence[Sequence[float]]) -> list[list[Choice]]:
    return [[Choice(c.removed, c.latency, d) for c, d in zip(seg, seg_damages)]
            for seg, seg_damages in zip(options, damages)]


STARTS = ("kbest", "greedy", "sleb", "reverse")


def interaction_search(options: Sequence[Sequence[Choice]], budget: float,
                       loss_of: Callable[[frozenset[str]], float], whole: Sequence[int | None] | None = None,
                       recovered_of: Callable[[frozenset[str]], float] | None = None,
                       starts: Sequence[str] = STARTS, k: int = 32, restarts: int = 3, polish: int = 3,
                       polish_k: int = 8, bins: int = 1000, method: str = "interaction", floor: float | None = None
                       ) -> SearchResult:
    """The plan of least *real* loss (``loss_of(removed units)``, the whole plan applied) within the latency budget.

    1. Starting plans, each within the budget: ``kbest``, the `k` best DP plans under the damages in `options` (each
       variant scored alone: the DP's additive surrogate); ``greedy``, greedy's plan under the same damages; with
       `whole` (each segment's whole-removal variant), ``sleb``, SLEB's plan (whole segments, re-scored after every
       removal) and ``reverse``, reverse order's. A start that cannot reach the budget is left out.
    2. The DP's own optimum (with ``kbest``) and the `restarts` distinct starts of least real loss are each improved
       locally, for up to `polish` rounds:
       every variant is scored *conditionally*, as the real loss of the plan with that one segment changed less the
       plan's own (a removal beside another can hurt more, or less, than alone; restoring a segment is a change
       too); the `polish_k` best DP plans within the budget under those damages are scored by their real loss, and
       the best replaces the plan if it is better; a round that improves nothing ends it. (Local search is path
       dependent: a start that is not the best can end best.)
    3. Without `recovered_of`, the plan of least real loss found is returned. With it (the loss after a short
       recovery, :class:`zoo.pruning.importance.PlanRecovery`), the finalists are judged by that: the improved plans
       and the
       DP's, greedy's and SLEB's own plans (one-shot loss misjudges removals that fine-tuning repairs easily).

    With `floor`, every plan considered also takes at least `floor` ms (the DP plans in that window; other starts
    outside it are left out).

    The result's ``damage`` is the real (one-shot) loss increase of the plan, its ``recovered`` the loss after
    recovery (when scored)."""
    _check_reachable(options, budget)
    unknown = sorted(set(starts) - set(STARTS))
    if not starts or unknown or min(k, restarts, polish_k) < 1 or polish < 0:
        raise ZooError(f"interaction_search needs starts of {', '.join(STARTS)} (got {list(starts)}), k, restarts "
                       f"and polish_k >= 1, polish >= 0 (got {k}, {restarts}, {polish_k}, {polish}).")
    losses: dict[frozenset[str], float] = {}

    def loss(picks: Sequence[int]) -> float:
        removed = _removed_by(options, picks)
        if removed not in losses:
            losses[removed] = loss_of(removed)
        return losses[removed]

    def order(picks: tuple[int, ...]) -> tuple[float, float]:  # least loss first; among equals, the slowest plan
        return loss(picks), -_totals(options, picks)[0]

    def rank(plans: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
        return min(plans, key=order)

    def improved(picks: tuple[int, ...]) -> tuple[int, ...]:
        for _ in range(polish):
            current = loss(picks)
            damages = [[loss(picks[:s] + (i,) + picks[s + 1:]) - current for i in range(len(seg))]
                       for s, seg in reversed(list(enumerate(options)))][::-1]  # last first: see PlanLoss
            try:
                found = rank([r.choices for r in kbest_dp(_rescored(options, damages), budget, polish_k, bins, floor)])
            except BudgetError:  # no plan of the window under the conditional damages: the plan stays
                break
            if loss(found) >= current - 1e-12:
                break
            picks = found
        return picks

    proposals: list[tuple[int, ...]] = []
    if "kbest" in starts:
        try:
            proposals += [r.choices for r in kbest_dp(options, budget, k, bins, floor)]
        except BudgetError:
            if floor is None:
                raise  # (a window may leave the DP's starts out and keep the others' plans)
    named: dict[str, tuple[int, ...]] = {}  # the other rules' own plans (greedy's, SLEB's)
    if "greedy" in starts:
        named["greedy"] = greedy_search(options, budget).choices
    if "sleb" in starts and whole is not None:
        try:
            named["sleb"] = sleb_search(options, budget, whole, loss_of).choices
        except BudgetError:
            pass
    proposals += list(named.values())
    if "reverse" in starts and whole is not None:
        try:
            proposals.append(reverse_search(options, budget, whole).choices)
        except BudgetError:
            pass
    if floor is not None:  # the other rules' plans outside the window
        named = {name: plan for name, plan in named.items() if _totals(options, plan)[0] >= floor - 1e-12}
        proposals = [plan for plan in proposals if _totals(options, plan)[0] >= floor - 1e-12]
    if not proposals:
        window = f"between {floor:.4g} and {budget:.4g} ms" if floor is not None else f"within {budget:.4g} ms"
        raise BudgetError(f"No plan of the starts {', '.join(starts)} takes {window}.")
    ranked = sorted(dict.fromkeys(proposals), key=order)
    first = proposals[:1] if "kbest" in starts else []  # the surrogate's optimum: often far from the best start
    ends = [improved(start) for start in dict.fromkeys([*first, *ranked[:restarts]])]
    picks, recovered = rank(ends), None
    if recovered_of is not None:
        finalists = list(dict.fromkeys([picks, *ends, *first, *named.values()]))
        scores = {plan: recovered_of(_removed_by(options, plan)) for plan in finalists}
        picks = min(finalists, key=lambda plan: (scores[plan], loss(plan)))
        recovered = scores[picks]
    intact = losses[frozenset()] if frozenset() in losses else loss_of(frozenset())
    return SearchResult(picks, _totals(options, picks)[0], loss(picks) - intact, method, recovered)


def reverse_search(options: Sequence[Sequence[Choice]], budget: float, whole: Sequence[int | None]) -> SearchResult:
    """Reverse order ("Reassessing Layer Pruning", 2025): remove whole segments from the last one backwards until the
    latency budget is met (segments without a whole-removal variant are skipped)."""
    _whole_budget(options, whole, budget)
    picks = [_unchanged_index(seg) for seg in options]
    for s in reversed(range(len(options))):
        if _totals(options, picks)[0] <= budget + 1e-12:
            break
        if whole[s] is not None:
            picks[s] = whole[s]
    latency, damage = _totals(options, picks)
    return SearchResult(tuple(picks), latency, damage, "reverse")


def angular_search(options: Sequence[Sequence[Choice]], budget: float, whole: Sequence[int | None],
                      distance_of: Callable[[int, int], float]) -> SearchResult:
    """Gromov et al. (2024): remove one contiguous run of whole segments, the shortest run length n that can meet
    the budget, and among the runs of that length that meet it the one whose input (of segment `first`) and output
    (of segment `last`) are closest: ``distance_of(first, last)``, e.g. their angular distance. A run is contiguous
    when every segment in it has a whole-removal variant."""
    _whole_budget(options, whole, budget)
    unchanged = [_unchanged_index(seg) for seg in options]
    total = _totals(options, unchanged)[0]
    if total <= budget + 1e-12:
        return SearchResult(tuple(unchanged), *_totals(options, unchanged), "angular")
    for length in range(1, len(options) + 1):
        fits = []
        for first in range(len(options) - length + 1):
            run = range(first, first + length)
            if any(whole[s] is None for s in run):
                continue
            saved = sum(options[s][unchanged[s]].latency - options[s][whole[s]].latency for s in run)
            if total - saved <= budget + 1e-12:
                fits.append((distance_of(first, first + length - 1), first))
        if fits:
            _, first = min(fits)
            picks = [whole[s] if first <= s < first + length else unchanged[s] for s in range(len(options))]
            latency, damage = _totals(options, picks)
            return SearchResult(tuple(picks), latency, damage, "angular")
    raise BudgetError(f"No contiguous run of whole segments meets the latency budget of {budget:.4g} ms (the "
                      f"removable segments are split by ones that cannot be removed); use prune.search=dp.")


@dataclass(frozen=True)
class Rule:
    """A search by name: the function and the inputs it takes besides the options and the budget."""

    run: Callable[..., SearchResult]
    needs: tuple[str, ...]   # of: bins, seed, whole (whole-removal variant per segment), loss_of, distance_of
    windowed: bool = False   # takes `floor`: plans no faster than asked (the others stop once within the budget)


SEARCHES: dict[str, Rule] = {
    "interaction": Rule(interaction_search, ("loss_of", "whole", "recovered_of", "bins"), windowed=True),
    "dp": Rule(dp_search, ("bins",), windowed=True),
    "kbest": Rule(partial(interaction_search, starts=("kbest",), restarts=1, polish=0, method="kbest"),
                  ("loss_of", "bins"), windowed=True),
    "local": Rule(partial(interaction_search, starts=("kbest",), k=1, restarts=1, method="local"),
                  ("loss_of", "bins"), windowed=True),
    "greedy": Rule(greedy_search, ()),
    "random": Rule(random_search, ("seed",)),
    "sleb": Rule(sleb_search, ("whole", "loss_of")),
    "angular": Rule(angular_search, ("whole", "distance_of")),
    "reverse": Rule(reverse_search, ("whole",)),
}
WHOLE_SEGMENT_SEARCHES = ("sleb", "angular", "reverse")  # rules that remove whole segments only


def search(method: str, options: Sequence[Sequence[Choice]], budget: float, floor: float | None = None,
           **inputs: Any) -> SearchResult:
    """Run a search by name with the inputs it needs (:data:`SEARCHES`; others in `inputs` are ignored); `floor`
    (the least latency a plan may take) goes to the searches that take it and is ignored by the others."""
    if method not in SEARCHES:
        raise ZooError(f"Unknown search method {method!r}; allowed: {', '.join(SEARCHES)}.")
    rule = SEARCHES[method]
    missing = [name for name in rule.needs if name not in inputs]
    if missing:
        raise ZooError(f"Search {method!r} needs {', '.join(missing)}.")
    window = {"floor": floor} if rule.windowed and floor is not None else {}
    return rule.run(options, budget, **{name: inputs[name] for name in rule.needs}, **window)


def pareto_front(options: Sequence[Sequence[Choice]], bins: int = 200) -> list[tuple[float, float]]:
    """(latency, damage) of the DP optimum at `bins` budgets from the fastest to the unpruned latency."""
    fastest = sum(min(c.latency for c in seg) for seg in options)
    slowest = sum(seg[_unchanged_index(seg)].latency for seg in options)
    front = []
    for budget in np.linspace(fastest, slowest, 25):
        try:
            result = dp_search(options, float(budget) + 1e-9, bins)
        except BudgetError:
            continue
        front.append((result.latency, result.damage))
    return front
