"""Search: choose one variant per segment to keep the most importance within a latency budget.

Every segment (a block with its mergeable activations, or a RetNet sub-layer) offers variants —
unchanged, some activations removed and convs merged, or removed altogether — each with a predicted
latency (from the lookup table) and a damage (importance lost: e.g. the increase of calibration loss when
that variant is applied alone). Merges never cross segments, so both add up over segments and the
problem is a multiple-choice knapsack, solved exactly by dynamic programming over the latency budget
discretised into bins (costs are rounded *up*, so a returned plan never exceeds the budget).
Greedy and random searches are baselines for studies. Two rules of the layer-removal literature for language
models remove whole segments only and score with the model (REFERENCE.md section 9): ``sleb`` (iterative, by
calibration loss) and ``angular`` (one contiguous run, by the angular distance of its input and output).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import BudgetError, ZooError


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
    damage: float                # sum of the chosen variants' damages
    method: str

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


def dp_search(options: Sequence[Sequence[Choice]], budget: float, bins: int = 1000) -> SearchResult:
    """Exact multiple-choice knapsack: min total damage s.t. total latency <= budget (costs rounded up to bins)."""
    _check_reachable(options, budget)
    unit = budget / bins if budget > 0 else 1.0
    inf = math.inf
    best = np.full(bins + 1, inf)
    best[0] = 0.0
    picks = []
    for seg in options:
        new = np.full(bins + 1, inf)
        arg = np.full(bins + 1, -1, dtype=np.int64)
        for i, choice in enumerate(seg):
            cost = max(0, math.ceil(choice.latency / unit - 1e-9))
            if cost > bins:
                continue
            shifted = np.full(bins + 1, inf)
            shifted[cost:] = best[: bins + 1 - cost] + choice.damage
            better = shifted < new
            new[better], arg[better] = shifted[better], i
        best = new
        picks.append(arg)
    lowest = best.min()
    end = int(np.flatnonzero(best <= lowest + 1e-12)[-1])  # among equal damage, the slowest plan: fewest changes
    if not math.isfinite(best[end]):
        raise BudgetError(f"No combination fits the budget of {budget:.4g} ms at {bins} bins; raise `bins`.")
    chosen = []
    for seg, arg in zip(reversed(options), reversed(picks)):
        i = int(arg[end])
        chosen.append(i)
        end -= max(0, math.ceil(seg[i].latency / unit - 1e-9))
    chosen.reverse()
    latency, damage = _totals(options, chosen)
    return SearchResult(tuple(chosen), latency, damage, "dp")


def brute_force_search(options: Sequence[Sequence[Choice]], budget: float) -> SearchResult:
    """Exhaustive reference for tests on small spaces."""
    import itertools

    _check_reachable(options, budget)
    best: tuple[float, tuple[int, ...]] | None = None
    for picks in itertools.product(*[range(len(seg)) for seg in options]):
        latency, damage = _totals(options, picks)
        if latency <= budget + 1e-12 and (best is None or damage < best[0] - 1e-12):
            best = (damage, picks)
    latency, damage = _totals(options, best[1])
    return SearchResult(best[1], latency, damage, "brute_force")


def _unchanged_index(seg: Sequence[Choice]) -> int:
    return next(i for i, c in enumerate(seg) if not c.removed)


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


def iterative_search(options: Sequence[Sequence[Choice]], budget: float, whole: Sequence[int | None],
                     loss_of: Callable[[frozenset[str]], float]) -> SearchResult:
    """SLEB (Song et al., 2024): remove whole segments one at a time, each time the one whose removal, with those
    already removed, gives the lowest calibration loss (``loss_of(removed units)``), re-scored after every removal,
    until the latency budget is met. whole: per segment, the index of its whole-removal variant (None: none)."""
    _whole_budget(options, whole, budget)
    picks = [_unchanged_index(seg) for seg in options]
    removed: frozenset[str] = frozenset()
    while _totals(options, picks)[0] > budget + 1e-12:
        candidates = [s for s, w in enumerate(whole) if w is not None and picks[s] != w]
        losses = {s: loss_of(removed | options[s][whole[s]].removed) for s in candidates}
        best = min(candidates, key=lambda s: (losses[s], s))
        picks[best] = whole[best]
        removed |= options[best][whole[best]].removed
    latency, damage = _totals(options, picks)
    return SearchResult(tuple(picks), latency, damage, "sleb")


def contiguous_search(options: Sequence[Sequence[Choice]], budget: float, whole: Sequence[int | None],
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


SEARCHES = {"dp": dp_search, "greedy": greedy_search, "random": random_search, "sleb": iterative_search,
            "angular": contiguous_search}
MODEL_SEARCHES = ("sleb", "angular")  # rules that score with the model itself, not with per-variant damages


def search(method: str, options: Sequence[Sequence[Choice]], budget: float, **kwargs) -> SearchResult:
    """Run a search by name: ``dp``, ``greedy``, ``random``, or (whole segments, with ``whole`` and ``loss_of`` /
    ``distance_of``) ``sleb`` and ``angular``."""
    if method not in SEARCHES:
        raise ZooError(f"Unknown search method {method!r}; allowed: {', '.join(SEARCHES)}.")
    return SEARCHES[method](options, budget, **kwargs)


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
