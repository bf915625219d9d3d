"""Latency measurement, lookup tables, cache safety, prediction error and correction, CLI and benchmark smoke test
(CPU, tiny sizes). How entries are timed (CUDA protocols, in-context timing, drift) is in test_latency_timing.py."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import zoo
from zoo.errors import PlanError
from zoo.latency import (
    LatencyDeviceError,
    TableSettings,
    build_table,
    default_cache_dir,
    measure,
    random_plans,
    resolve_device,
)
from zoo.latency.table import Correction, fit_correction
from zoo.pruning.surgery import apply_plan, segments

from ..helpers import TABLE_MODEL as MODEL
from ..helpers import TABLE_SIZE as SIZE
from ..helpers import small_table


def _build(cache_dir: Path, **kwargs) -> zoo.latency.LatencyTable:
    return small_table(cache_dir, **kwargs)


def test_measure_returns_sane_stats() -> None:
    model = zoo.create_model(MODEL)
    stats = measure(model, model.example_input(2, (3, SIZE, SIZE)), device="cpu", warmup_s=0.1, max_time_s=1.0)
    assert 0 < stats.min_ms <= stats.p10_ms <= stats.median_ms < 1000
    assert stats.iqr_ms >= 0 and stats.mad_ms >= 0 and stats.n_runs >= 10
    assert (stats.device, stats.dtype, stats.batch_size, stats.threads) == ("cpu", "float32", 2, 1)
    assert stats.torch_version == torch.__version__ and stats.device_name
    assert stats.peak_mem_bytes > 0 and stats.mem_estimated
    assert stats.cap_hit or stats.rel_uncertainty <= 0.01


def test_measure_restores_the_thread_count() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(3)  # not the one thread measure() times with
    try:
        stats = measure(torch.nn.Linear(8, 8), torch.zeros(2, 8), device="cpu", threads=1, warmup_s=0.01,
                        max_time_s=0.1)
        assert stats.threads == 1 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(previous)


def test_measure_function_bf16_and_thread_clock() -> None:
    weight = torch.randn(64, 64)
    stats = measure(lambda x: x @ weight, torch.randn(8, 64), device="cpu", dtype="bf16", warmup_s=0.05,
                    max_time_s=0.3)
    assert stats.dtype == "bfloat16" and stats.median_ms > 0 and stats.batch_size == 8
    stats = measure(torch.nn.Linear(64, 64), torch.randn(8, 64), device="cpu", clock="thread", warmup_s=0.05,
                    max_time_s=0.3)
    assert stats.clock == "thread" and stats.median_ms > 0


def test_bad_device_and_dtype_raise_before_measuring() -> None:
    model = torch.nn.Linear(4, 4)
    with pytest.raises(LatencyDeviceError, match="Allowed"):
        measure(model, torch.zeros(1, 4), device="tpu")
    with pytest.raises(LatencyDeviceError, match="float16"):
        measure(model, torch.zeros(1, 4), device="cpu", dtype="fp16")
    with pytest.raises(LatencyDeviceError, match="Unknown dtype"):
        measure(model, torch.zeros(1, 4), device="cpu", dtype="int8")
    with pytest.raises(LatencyDeviceError, match="threads=1"):
        measure(model, torch.zeros(1, 4), device="cpu", clock="thread", threads=2)
    with pytest.raises(ValueError, match="not available"):  # LatencyDeviceError is a ValueError
        build_table(MODEL, device="cuda:7", input_size=SIZE)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_auto_device_falls_back_to_cpu_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    from zoo.latency.device import _warn_cpu_fallback

    _warn_cpu_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="zoo.latency"):
        assert resolve_device("auto").type == "cpu" and resolve_device("auto").type == "cpu"
    assert caplog.text.count("CPU latencies") == 1  # once per run, however often the device is resolved


def test_table_costs_and_predict(table: zoo.latency.LatencyTable) -> None:
    model = zoo.create_model(MODEL)
    segs = segments(model)
    costs = table.segment_costs()
    assert [s.name for s in table.segments] == [s.name for s in segs]
    assert [[v for v, _ in c] for c in costs] == [s.variants() for s in segs]
    unchanged = sum(dict(c)[frozenset()] for c in costs)
    assert table.predict({"remove": [], "merge": True}) == pytest.approx(table.fixed_cost() + unchanged)
    assert table.predict() == pytest.approx(table.fixed_raw_ms + sum(table.raw_cost(i, frozenset())
                                                                     for i in range(len(segs))))
    removable = [s.name for s in segs if s.removable]
    assert table.predict({"remove": removable}) < table.predict({})
    for seg_costs in costs:
        for variant, cost in seg_costs:
            assert cost >= 0 and (cost == 0 if any(n in variant for n in removable) else True)
    assert table.n_records < sum(len(s.variants()) for s in segs)  # identical blocks share records
    assert table.predict_memory({}) > 0
    with pytest.raises(PlanError, match="not removable units"):
        table.predict({"remove": ["blocks.9.9"]})
    with pytest.raises(PlanError, match="merge"):
        table.predict({"remove": [], "merge": False})
    assert "entries" in table.format()


def test_second_build_hits_cache(table: zoo.latency.LatencyTable, cache_dir: Path) -> None:
    again = _build(cache_dir)
    assert again.n_measured == 0 and again.n_cached == table.n_measured + table.n_cached
    assert again.predict({}) == pytest.approx(table.predict({}))
    assert set(again.sources.values()) == {"cached"}


def test_random_plans_apply_and_predict(table: zoo.latency.LatencyTable) -> None:
    model = zoo.create_model(MODEL)
    for plan in random_plans(table.segments, 5, seed=3):
        apply_plan(model, plan, inplace=False)
        assert 0 < table.predict(plan) <= table.predict({}) * 1.5


def _convs(module: torch.nn.Module) -> int:
    return sum(isinstance(m, torch.nn.Conv2d) for m in module.modules())


def test_prediction_is_the_exact_sum_of_its_entries_on_a_synthetic_cost_model(table) -> None:
    """Replace every measured entry by a deterministic cost (1 ms per conv in the entry's module, plus the call
    overhead every entry carries); the prediction of any plan must then equal the cost of the whole pruned network,
    computed independently from ``apply_plan``."""
    from zoo.pruning.surgery import build_segment

    synthetic = replace(table, records=dict(table.records))
    overhead = 0.25
    stat = lambda ms: {"median_ms": ms, "p10_ms": ms, "min_ms": ms}  # noqa: E731
    in_segments = 0
    for seg, keys in zip(table.segments, table.keys):
        in_segments += _convs(table.model.get_submodule(seg.name))
        for variant, key in keys.items():
            if key is not None:
                synthetic.records[key] = stat(_convs(build_segment(table.model, seg, variant)) + overhead)
    synthetic.records[table.overhead_key] = stat(overhead)
    synthetic.records[table.fixed_key] = stat(float(_convs(table.model) - in_segments))
    for plan in [{"remove": []}, *random_plans(table.segments, 12, seed=5)]:
        pruned = apply_plan(table.model, plan, inplace=False)
        assert synthetic.predict(plan) == pytest.approx(float(_convs(pruned)), abs=1e-9), plan
    removed = next(s for s in table.segments if s.removable)
    assert synthetic.raw_cost(table.segments.index(removed), frozenset({removed.name})) == 0.0


def test_fit_correction_picks_what_helps() -> None:
    predicted = [10.0, 8.0, 6.0, 4.0]
    correction, loo = fit_correction(predicted, [p * 1.2 for p in predicted])
    assert correction.kind == "scale" and correction.scale == pytest.approx(1.2) and loo == pytest.approx(0)
    assert fit_correction(predicted, predicted)[0].kind == "none"


def test_correction_falls_back_to_none_on_a_deterministic_synthetic_cost_model(table) -> None:
    """Predictions from a synthetic table (1 ms per conv) against deterministic 'measurements' of the same plans:
    a correction is kept only when it beats the raw prediction on held-out networks by more than the margin."""
    from zoo.pruning.surgery import build_segment

    synthetic = replace(table, records=dict(table.records))
    stat = lambda ms: {"median_ms": ms, "p10_ms": ms, "min_ms": ms}  # noqa: E731
    for seg, keys in zip(table.segments, table.keys):
        for variant, key in keys.items():
            if key is not None:
                synthetic.records[key] = stat(float(_convs(build_segment(table.model, seg, variant))))
    synthetic.records[table.overhead_key] = stat(0.0)
    in_segments = sum(_convs(table.model.get_submodule(seg.name)) for seg in table.segments)
    synthetic.records[table.fixed_key] = stat(float(_convs(table.model) - in_segments))
    plans = [{"remove": []}, *random_plans(table.segments, 9, seed=7)]
    predicted = [synthetic.predict(plan, corrected=False) for plan in plans]
    exact = [float(_convs(apply_plan(table.model, plan, inplace=False))) for plan in plans]
    assert predicted == pytest.approx(exact)
    # exact predictions: nothing to correct
    assert fit_correction(predicted, exact) == (Correction(), pytest.approx(0.0))
    # a systematic 25 % underestimate is corrected, and the held-out error says so
    correction, loo = fit_correction(predicted, [1.25 * m for m in exact])
    assert correction.kind == "scale" and correction.scale == pytest.approx(1.25) and loo == pytest.approx(0.0)
    # unbiased +-4 % noise: a fitted correction cannot beat raw on held-out networks, so none is kept
    noisy = [m * (1.04 if i % 2 else 0.96) for i, m in enumerate(exact)]
    correction, loo = fit_correction(predicted, noisy)
    raw_error = sum(abs(p / m - 1) for p, m in zip(predicted, noisy)) / len(noisy)
    assert correction.kind == "none" and loo == pytest.approx(raw_error)
    # a 2 % bias helps held out, but not by more than a 3 % noise floor: kept only with the smaller margin
    biased = [1.02 * m for m in exact]
    assert fit_correction(predicted, biased, margin=0.03)[0].kind == "none"
    assert fit_correction(predicted, biased, margin=0.01)[0].kind in ("scale", "offset")
    # the table applies what was chosen: corrected == raw when there is none
    synthetic.correction = fit_correction(predicted, noisy)[0]
    assert [synthetic.predict(plan) for plan in plans] == pytest.approx(predicted)


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DEPTHZOO_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "latency"


def test_retnet_segments_take_kwargs_and_hit_the_cache(tmp_path: Path) -> None:
    settings = TableSettings(warmup_s=0.05, entry_warmup_s=0.0, min_rounds=2, max_rounds=2)
    kwargs = dict(input_size=(16,), device="cpu", cache_dir=str(tmp_path), settings=settings)
    first = build_table("retnet_tiny", **kwargs)
    again = build_table("retnet_tiny", **kwargs)
    assert again.n_measured == 0 and again.n_cached == first.n_measured
    plan = {"remove": [first.segments[0].name]}
    assert 0 < first.predict(plan) < first.predict({})
