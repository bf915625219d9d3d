"""Search: the DP is optimal (against brute force), baselines respect the budget, it is fast."""

from __future__ import annotations

import random
import time

import pytest

from zoo.pruning.search import BudgetError, Choice, dp_search, greedy_search, random_search


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


def all_plans(options, budget, floor=None):
    """Every plan within the budget (and no faster than `floor`), (damage, picks), least damage first: the
    brute-force reference."""
    import itertools

    plans = []
    for picks in itertools.product(*[range(len(seg)) for seg in options]):
        latency = sum(seg[i].latency for seg, i in zip(options, picks))
        if latency <= budget + 1e-12 and (floor is None or latency >= floor - 1e-12):
            plans.append((sum(seg[i].damage for seg, i in zip(options, picks)), picks))
    return sorted(plans)


def brute_force_damage(options, budget):
    """The least total damage of any plan within the budget, by enumeration (the reference for the DP)."""
    return all_plans(options, budget)[0][0]


@pytest.mark.parametrize("seed", range(40))
def test_dp_matches_brute_force_on_integer_costs(seed):
    rng = random.Random(seed)
    options = random_instance(rng, rng.randint(1, 6), integer=True)
    total = sum(seg[0].latency for seg in options)
    fastest = sum(min(c.latency for c in seg) for seg in options)
    budget = float(rng.randint(int(fastest), int(total)))
    exact = brute_force_damage(options, budget)
    dp = dp_search(options, budget, bins=int(budget) if budget >= 1 else 1)
    assert dp.latency <= budget
    assert dp.damage == pytest.approx(exact, abs=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_dp_is_feasible_and_near_optimal_on_float_costs(seed):
    rng = random.Random(100 + seed)
    options = random_instance(rng, 6, integer=False)
    total = sum(seg[0].latency for seg in options)
    fastest = sum(min(c.latency for c in seg) for seg in options)
    budget = rng.uniform(fastest, total)
    exact = brute_force_damage(options, budget)
    bins = 2000
    dp = dp_search(options, budget, bins=bins)
    assert dp.latency <= budget + 1e-9
    assert dp.damage >= exact - 1e-9  # rounding costs up can only cost optimality, never feasibility
    # Rounding adds less than one bin per segment, so every plan that fits a budget tighter by that much is a
    # plan the DP sees: its damage is at most the exact optimum at the tighter budget.
    tighter = budget - len(options) * budget / bins
    if tighter >= fastest:
        assert dp.damage <= brute_force_damage(options, tighter) + 1e-9
    for baseline in (greedy_search(options, budget), random_search(options, budget, seed=seed)):
        assert baseline.latency <= budget + 1e-9 and baseline.damage >= exact - 1e-9


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
    from zoo.pruning.search import sleb_search

    losses = {frozenset({"s0"}): 1.5, frozenset({"s1"}): 1.2, frozenset({"s2"}): 1.3,
              frozenset({"s0", "s1"}): 1.4, frozenset({"s1", "s2"}): 1.9}
    calls = []

    def loss_of(removed):
        calls.append(removed)
        return losses[removed]

    result = sleb_search(whole_options([1.0, 1.0, 1.0]), 1.0, [1, 1, 1], loss_of)
    assert result.removed(whole_options([1.0, 1.0, 1.0])) == ["s0", "s1"] and result.method == "sleb"
    assert len(calls) == 3 + 2  # every candidate scored again after the first removal
    assert result.latency == 1.0


def test_angular_search_takes_the_closest_run_of_the_shortest_length():
    """Hand-computed: the budget (2 of 4 ms) needs a run of 2; of the runs (0,1), (1,2), (2,3) at distances 0.3,
    0.1, 0.2 it takes (1,2). With s2 not removable, only (0,1) is contiguous."""
    from zoo.pruning.search import angular_search

    options = whole_options([1.0, 1.0, 1.0, 1.0])
    distances = {(0, 1): 0.3, (1, 2): 0.1, (2, 3): 0.2, (0, 0): 0.5, (1, 1): 0.5, (2, 2): 0.5, (3, 3): 0.5}
    result = angular_search(options, 2.0, [1, 1, 1, 1], lambda a, b: distances[(a, b)])
    assert result.removed(options) == ["s1", "s2"] and result.method == "angular"
    result = angular_search(options, 2.0, [1, 1, None, 1], lambda a, b: distances[(a, b)])
    assert result.removed(options) == ["s0", "s1"]
    with pytest.raises(BudgetError, match="contiguous run"):
        angular_search(options, 1.0, [1, None, 1, 1], lambda a, b: distances.get((a, b), 0.0))
    with pytest.raises(BudgetError, match="whole segments"):
        angular_search(options, 1.0, [1, None, None, 1], lambda a, b: 0.0)


# -- k best plans and the interaction-aware search -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(60))
def test_kbest_dp_returns_the_k_best_plans_of_brute_force(seed):
    from zoo.pruning.search import kbest_dp

    rng = random.Random(1000 + seed)
    options = random_instance(rng, rng.randint(1, 6), integer=True)
    total = sum(seg[0].latency for seg in options)
    fastest = sum(min(c.latency for c in seg) for seg in options)
    budget = float(rng.randint(int(fastest), int(total)))
    k = rng.randint(1, 12)
    found = kbest_dp(options, budget, k, bins=max(int(budget), 1))
    expected = all_plans(options, budget)[:k]
    assert [r.damage for r in found] == pytest.approx([d for d, _ in expected], abs=1e-9)
    assert len({r.choices for r in found}) == len(found)  # distinct plans
    assert all(r.latency <= budget + 1e-9 for r in found)
    assert found[0].damage == pytest.approx(dp_search(options, budget, bins=max(int(budget), 1)).damage, abs=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_a_window_keeps_the_k_best_plans_no_faster_than_its_floor(seed):
    """kbest_dp and dp_search with a floor: the k least-damage plans of brute force among those taking between the
    floor and the budget; a window no plan falls in is a BudgetError."""
    from zoo.pruning.search import kbest_dp

    rng = random.Random(2000 + seed)
    options = random_instance(rng, rng.randint(1, 6), integer=True)
    total = sum(seg[0].latency for seg in options)
    fastest = sum(min(c.latency for c in seg) for seg in options)
    budget = float(rng.randint(int(fastest), int(total)))
    floor = float(rng.randint(int(fastest), int(budget)))
    k, bins = rng.randint(1, 12), max(int(budget), 1)
    expected = all_plans(options, budget, floor)[:k]
    if not expected:
        with pytest.raises(BudgetError, match="at least"):
            kbest_dp(options, budget, k, bins=bins, floor=floor)
        return
    found = kbest_dp(options, budget, k, bins=bins, floor=floor)
    assert [r.damage for r in found] == pytest.approx([d for d, _ in expected], abs=1e-9)
    assert all(floor - 1e-9 <= r.latency <= budget + 1e-9 for r in found)
    assert dp_search(options, budget, bins=bins, floor=floor).damage == pytest.approx(expected[0][0], abs=1e-9)


def test_interaction_search_keeps_to_its_window():
    """Hand-computed: three 1-ms segments. Removing all three costs the least loss (0.1), so within a 1-ms budget the
    search takes that 0-ms plan; with a floor of 1 ms it takes the best one-segment-kept plan instead, and the
    search by name passes the floor to the searches that take one."""
    from zoo.pruning.search import interaction_search, search

    options = [[Choice(frozenset(), 1.0, 0.0), Choice(frozenset({f"s{i}"}), 0.0, d)]
               for i, d in enumerate((0.1, 0.2, 0.3))]
    real = {frozenset({"s0", "s1", "s2"}): 1.1, frozenset({"s0", "s1"}): 3.0, frozenset({"s0", "s2"}): 1.5,
            frozenset({"s1", "s2"}): 2.0}

    def loss_of(removed):
        return real.get(frozenset(removed), 1.0 + sum(0.1 * (int(u[1]) + 1) for u in removed))

    assert interaction_search(options, 1.0, loss_of).removed(options) == ["s0", "s1", "s2"]
    windowed = interaction_search(options, 1.0, loss_of, floor=1.0)
    assert windowed.removed(options) == ["s0", "s2"] and windowed.latency == 1.0
    assert search("interaction", options, 1.0, floor=1.0, loss_of=loss_of, whole=None, recovered_of=None,
                  bins=1000).removed(options) == ["s0", "s2"]
    assert search("greedy", options, 1.0, floor=1.0).latency <= 1.0  # no window: stops once within the budget


def test_reverse_removes_whole_segments_from_the_last_one_back():
    """Hand-computed: 4 segments of 1 ms, budget 2 ms, s2 cannot be removed: reverse takes s3, skips s2, takes s1."""
    from zoo.pruning.search import reverse_search

    options = whole_options([1.0, 1.0, 1.0, 1.0])
    result = reverse_search(options, 2.0, [1, 1, None, 1])
    assert result.removed(options) == ["s1", "s3"] and result.method == "reverse" and result.latency == 2.0
    with pytest.raises(BudgetError, match="whole segments"):
        reverse_search(options, 0.5, [1, 1, None, 1])


def test_interaction_search_takes_the_plan_the_additive_surrogate_misses():
    """Hand-computed: three 1-ms segments, budget 1 ms, so two must go. Alone, s0 hurts 0.1, s1 0.2, s2 0.3, so the
    additive DP removes s0 and s1 (0.3); but together s0 and s1 raise the loss by 5.0, s0 and s2 by 0.5, s1 and s2 by
    0.6. The interaction-aware search scores whole plans and removes s0 and s2; its damage is that real increase."""
    from zoo.pruning.search import interaction_search

    options = [[Choice(frozenset(), 1.0, 0.0), Choice(frozenset({f"s{i}"}), 0.0, d)]
               for i, d in enumerate((0.1, 0.2, 0.3))]
    real = {frozenset(): 1.0, frozenset({"s0", "s1"}): 6.0, frozenset({"s0", "s2"}): 1.5,
            frozenset({"s1", "s2"}): 1.6, frozenset({"s0"}): 1.1, frozenset({"s1"}): 1.2, frozenset({"s2"}): 1.3,
            frozenset({"s0", "s1", "s2"}): 9.0}
    assert dp_search(options, 1.0, bins=10).removed(options) == ["s0", "s1"]
    result = interaction_search(options, 1.0, real.__getitem__, whole=[1, 1, 1], bins=10)
    assert result.removed(options) == ["s0", "s2"] and result.damage == pytest.approx(0.5)
    assert result.method == "interaction" and result.latency <= 1.0
    kbest = interaction_search(options, 1.0, real.__getitem__, starts=("kbest",), restarts=1, polish=0, bins=10)
    assert kbest.removed(options) == ["s0", "s2"]  # the 2nd best of the surrogate is the best plan


def test_polishing_reaches_a_plan_no_start_proposes():
    """Hand-computed: four 1-ms segments, budget 2 ms. Every start (the DP's k=1 best, greedy's) removes s0 and s1
    (alone the least harmful), real increase 3.0. Around that plan, restoring s1 and removing s3 instead scores 0.4
    (conditionally: s1 back -1.0, s3 out -1.4), so polishing moves to {s0, s3} (real 1.2)."""
    from zoo.pruning.search import interaction_search

    options = [[Choice(frozenset(), 1.0, 0.0), Choice(frozenset({f"s{i}"}), 0.0, d)]
               for i, d in enumerate((0.1, 0.2, 0.5, 0.6))]

    def real(removed):
        table = {frozenset({"s0", "s1"}): 3.0, frozenset({"s0", "s3"}): 1.2, frozenset({"s0", "s1", "s3"}): 1.6}
        return table.get(frozenset(removed), 0.3 * len(removed) + (5.0 if len(removed) >= 2 else 0.0))

    no_polish = interaction_search(options, 2.0, real, starts=("kbest", "greedy"), k=1, restarts=1, polish=0)
    assert no_polish.removed(options) == ["s0", "s1"]
    polished = interaction_search(options, 2.0, real, starts=("kbest", "greedy"), k=1, restarts=1, polish=2)
    assert polished.removed(options) == ["s0", "s3"] and polished.damage == pytest.approx(1.2)


@pytest.mark.parametrize("seed", range(25))
def test_interaction_search_is_never_worse_than_its_starts(seed):
    """On random instances with a random non-additive loss: within the budget, and no worse by real loss than the DP,
    greedy, SLEB and reverse plans it starts from; with every plan scored, it matches brute force on tiny ones."""
    from zoo.pruning.search import interaction_search, reverse_search, sleb_search

    rng = random.Random(500 + seed)
    options = random_instance(rng, rng.randint(2, 5), integer=True)
    options = [seg + [Choice(frozenset({f"s{s}"}), 0.0, rng.uniform(0, 3))] for s, seg in enumerate(options)]
    whole = [len(seg) - 1 for seg in options]
    total = sum(seg[0].latency for seg in options)
    budget = float(rng.randint(0, int(total)))
    bonus = {}

    def real(removed):  # additive part plus a random interaction per pair of removed units
        units = sorted(removed)
        value = sum(c.damage for seg in options for c in seg if c.removed and c.removed <= removed)
        for a in units:
            for b in units:
                if a < b:
                    value += bonus.setdefault((a, b), rng.uniform(-0.5, 2.0))
        return value

    result = interaction_search(options, budget, real, whole=whole, bins=max(int(budget), 1))
    assert result.latency <= budget + 1e-9
    mine = real(frozenset(result.removed(options)))
    for start in (dp_search(options, budget, bins=max(int(budget), 1)), greedy_search(options, budget),
                  sleb_search(options, budget, whole, real), reverse_search(options, budget, whole)):
        assert mine <= real(frozenset(start.removed(options))) + 1e-9
    plans = all_plans(options, budget)
    everything = interaction_search(options, budget, real, whole=whole, starts=("kbest",), k=len(plans), restarts=1,
                                    polish=0, bins=max(int(budget), 1))
    best = min(real(frozenset(n for seg, i in zip(options, p) for n in seg[i].removed)) for _, p in plans)
    assert real(frozenset(everything.removed(options))) == pytest.approx(best)


def test_recovery_judges_the_finalists():
    """Hand-computed, the example above: one-shot, {s0, s2} is best (real 1.5 against 6.0 for the DP's {s0, s1}); after
    recovery {s0, s1} is best (0.2 against 0.9), so with `recovered_of` the search returns the DP's plan, its damage
    still the one-shot increase (5.0) and `recovered` the score it was chosen by."""
    from zoo.pruning.search import interaction_search

    options = [[Choice(frozenset(), 1.0, 0.0), Choice(frozenset({f"s{i}"}), 0.0, d)]
               for i, d in enumerate((0.1, 0.2, 0.3))]
    real = {frozenset(): 1.0, frozenset({"s0", "s1"}): 6.0, frozenset({"s0", "s2"}): 1.5,
            frozenset({"s1", "s2"}): 1.6, frozenset({"s0"}): 1.1, frozenset({"s1"}): 1.2, frozenset({"s2"}): 1.3,
            frozenset({"s0", "s1", "s2"}): 9.0}
    after = {frozenset({"s0", "s1"}): 0.2, frozenset({"s0", "s2"}): 0.9, frozenset({"s1", "s2"}): 0.5}
    scored = []

    def recovered_of(removed):
        scored.append(removed)
        return after[removed]

    result = interaction_search(options, 1.0, real.__getitem__, whole=[1, 1, 1], recovered_of=recovered_of, bins=10)
    assert result.removed(options) == ["s0", "s1"] and result.recovered == pytest.approx(0.2)
    assert result.damage == pytest.approx(5.0) and len(scored) == len(set(scored))  # each finalist scored once
    assert {frozenset({"s0", "s2"}), frozenset({"s0", "s1"})} <= set(scored)


@pytest.mark.parametrize("method", ["interaction", "greedy", "random", "sleb", "reverse"])
def test_rules_start_from_the_slowest_kept_variant_when_the_intact_one_is_left_out(method):
    """A memory limit can leave a segment's intact variant out (prune.max_memory_mb): s0 keeps only 'merged' (0.6 ms)
    and 'gone' (0 ms). Every rule starts from the slowest kept variant and meets the budget; the real loss increase
    is against the intact network. Hand-computed: budget 1.6 ms of 2.6 ms; s0 merged + s1 gone (0.6 ms, damage 0.1 +
    0.5) is the best plan."""
    from zoo.pruning.search import search

    options = [[Choice(frozenset({"s0.act"}), 0.6, 0.1), Choice(frozenset({"s0"}), 0.0, 2.0)],
               [Choice(frozenset(), 1.0, 0.0), Choice(frozenset({"s1"}), 0.0, 0.5)],
               [Choice(frozenset(), 1.0, 0.0), Choice(frozenset({"s2"}), 0.0, 0.9)]]
    real = {frozenset(): 1.0}

    def loss_of(removed):
        alone = sum(c.damage for seg in options for c in seg if c.removed and c.removed <= removed)
        return real.get(removed, 1.0 + alone)

    result = search(method, options, 1.6, loss_of=loss_of, whole=[1, 1, 1], bins=16, seed=0, recovered_of=None)
    assert result.latency <= 1.6
    if method in ("interaction", "greedy"):
        assert result.removed(options) == ["s0.act", "s1"] and result.damage == pytest.approx(0.6)


@pytest.mark.parametrize("seed", range(12))
def test_nearest_plans_bracket_the_budget_as_brute_force_does(seed):
    """nearest_plans: the slowest plan within the budget and the fastest beyond it, each the least damage among the
    plans of its latency, as enumeration finds them (integer costs: the latency steps are exact); none where no plan
    lies on that side."""
    import itertools

    from zoo.pruning.search import nearest_plans

    rng = random.Random(seed)
    options = random_instance(rng, rng.randint(1, 4), integer=True)
    every = [(sum(seg[i].latency for seg, i in zip(options, picks)), sum(seg[i].damage for seg, i in
              zip(options, picks))) for picks in itertools.product(*[range(len(seg)) for seg in options])]
    budget = rng.uniform(min(t for t, _ in every) - 2, max(t for t, _ in every) + 2)
    within, beyond = nearest_plans(options, budget)
    inside = [p for p in every if p[0] <= budget]
    outside = [p for p in every if p[0] > budget]
    if inside:
        latency = max(t for t, _ in inside)
        assert within.latency == pytest.approx(latency)
        assert within.damage == pytest.approx(min(d for t, d in inside if t == latency))
    else:
        assert within is None
    if outside:
        latency = min(t for t, _ in outside)
        assert beyond.latency == pytest.approx(latency)
        assert beyond.damage == pytest.approx(min(d for t, d in outside if t == latency))
    else:
        assert beyond is None
