"""Search: the DP is optimal (against brute force), baselines respect the budget, it is fast."""

from __future__ import annotations

import random
import time

import pytest

from zoo.search import BudgetError, Choice, brute_force_search, dp_search, greedy_search, random_search


def random_instance(rng: random.Random, segments: int, integer: bool) -> list[list[Choice]]:
    options = []
    for s in range(segments):
        base = rng.randint(5, 20) if integer else rng.uniform(5, 20)
        seg = [Choice(frozenset(), float(base), 0.0)]
        for v in range(rng.randint(0, 4)):
            cost = rng.randint(0, int(base)) if integer else rng.uniform(0, base)
            seg.append(Choice(frozenset({f"s{s}.v{v}"}), float(cost), rng.uniform(0, 3)))
        options.append(seg)
    return options


@pytest.mark.parametrize("seed", range(40))
def test_dp_matches_brute_force_on_integer_costs(seed):
    rng = random.Random(seed)
    options = random_instance(rng, rng.randint(1, 6), integer=True)
    total = sum(seg[0].latency for seg in options)
    fastest = sum(min(c.latency for c in seg) for seg in options)
    budget = float(rng.randint(int(fastest), int(total)))
    exact = brute_force_search(options, budget)
    dp = dp_search(options, budget, bins=int(budget) if budget >= 1 else 1)
    assert dp.latency <= budget
    assert dp.damage == pytest.approx(exact.damage, abs=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_dp_is_feasible_and_near_optimal_on_float_costs(seed):
    rng = random.Random(100 + seed)
    options = random_instance(rng, 6, integer=False)
    total = sum(seg[0].latency for seg in options)
    fastest = sum(min(c.latency for c in seg) for seg in options)
    budget = rng.uniform(fastest, total)
    exact = brute_force_search(options, budget)
    bins = 2000
    dp = dp_search(options, budget, bins=bins)
    assert dp.latency <= budget + 1e-9
    assert dp.damage >= exact.damage - 1e-9  # rounding costs up can only cost optimality, never feasibility
    # Rounding adds less than one bin per segment, so every plan that fits a budget tighter by that much is a
    # plan the DP sees: its damage is at most the exact optimum at the tighter budget.
    tighter = budget - len(options) * budget / bins
    if tighter >= fastest:
        assert dp.damage <= brute_force_search(options, tighter).damage + 1e-9
    for baseline in (greedy_search(options, budget), random_search(options, budget, seed=seed)):
        assert baseline.latency <= budget + 1e-9 and baseline.damage >= exact.damage - 1e-9


def test_unreachable_budget_says_what_is_achievable():
    options = [[Choice(frozenset(), 10.0, 0.0), Choice(frozenset({"a"}), 4.0, 1.0)]] * 2
    with pytest.raises(BudgetError, match="still takes 8 ms"):
        dp_search(options, 5.0)


def test_solves_a_hundred_segments_well_under_a_second():
    options = random_instance(random.Random(0), 100, integer=False)
    total = sum(seg[0].latency for seg in options)
    start = time.perf_counter()
    result = dp_search(options, total / 1.5, bins=1000)
    assert time.perf_counter() - start < 1.0
    assert result.latency <= total / 1.5


# -- the layer-removal rules of the language-model literature -----------------------------------------------------


def whole_options(latencies):
    """Segments s0, s1, ... each unchanged (its latency) or removed whole (0 ms, no damage of its own)."""
    return [[Choice(frozenset(), lat, 0.0), Choice(frozenset({f"s{i}"}), 0.0, 0.0)] for i, lat in enumerate(latencies)]


def test_sleb_rescores_after_every_removal():
    """Hand-computed: alone, s1 hurts least (1.2) then s2 (1.3); once s1 is gone, s0 hurts less (1.4) than s2 (1.9).
    SLEB removes s1 then s0; scoring once (the sum of single losses) would have taken s1 and s2."""
    from zoo.search import iterative_search

    losses = {frozenset({"s0"}): 1.5, frozenset({"s1"}): 1.2, frozenset({"s2"}): 1.3,
              frozenset({"s0", "s1"}): 1.4, frozenset({"s1", "s2"}): 1.9}
    calls = []

    def loss_of(removed):
        calls.append(removed)
        return losses[removed]

    result = iterative_search(whole_options([1.0, 1.0, 1.0]), 1.0, [1, 1, 1], loss_of)
    assert result.removed(whole_options([1.0, 1.0, 1.0])) == ["s0", "s1"] and result.method == "sleb"
    assert len(calls) == 3 + 2  # every candidate scored again after the first removal
    assert result.latency == 1.0


def test_angular_search_takes_the_closest_run_of_the_shortest_length():
    """Hand-computed: the budget (2 of 4 ms) needs a run of 2; of the runs (0,1), (1,2), (2,3) at distances 0.3,
    0.1, 0.2 it takes (1,2). With s2 not removable, only (0,1) is contiguous."""
    from zoo.search import contiguous_search

    options = whole_options([1.0, 1.0, 1.0, 1.0])
    distances = {(0, 1): 0.3, (1, 2): 0.1, (2, 3): 0.2, (0, 0): 0.5, (1, 1): 0.5, (2, 2): 0.5, (3, 3): 0.5}
    result = contiguous_search(options, 2.0, [1, 1, 1, 1], lambda a, b: distances[(a, b)])
    assert result.removed(options) == ["s1", "s2"] and result.method == "angular"
    result = contiguous_search(options, 2.0, [1, 1, None, 1], lambda a, b: distances[(a, b)])
    assert result.removed(options) == ["s0", "s1"]
    with pytest.raises(BudgetError, match="contiguous run"):
        contiguous_search(options, 1.0, [1, None, 1, 1], lambda a, b: distances.get((a, b), 0.0))
    with pytest.raises(BudgetError, match="whole segments"):
        contiguous_search(options, 1.0, [1, None, None, 1], lambda a, b: 0.0)
