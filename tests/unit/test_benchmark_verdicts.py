"""The benchmark runner runs its smallest configurations (smoke tests, no timing asserts); the GPU check is the same
runner over a named set (its CPU dry run here), and every status is its suites' targets against stored numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zoo
from benchmarks.__main__ import update_docs

ROOT = Path(__file__).resolve().parents[2]


def test_suites_iterate_the_registry_not_lists():
    """Which families a suite runs comes from ``zoo.list_families``: the in-tree plain ResNet is picked up by every
    suite that runs its task; tuning kept per family (prune_quality's tasks) does not change (the committed results'
    cell keys: tests/bench/test_prune_quality.py)."""
    from benchmarks import export_parity, prune_speedup, train_memory
    from benchmarks.latency_table import gpu_conditions
    from studies import prune_quality

    families = zoo.list_families()
    assert "plainresnet" in {f.name for f in families}
    assert [m for m, _, _ in export_parity.cases(False)] == [f.reference for f in families]
    assert "plainresnet18" in prune_speedup.default_models()
    assert "plainresnet18/float32/contiguous/b128/auto" in [c.label for c in gpu_conditions(False)]
    assert train_memory.models(targeted_only=True) == [f.reference for f in zoo.list_families("grad_checkpointing")]
    tasks = prune_quality.tasks()
    assert tasks["plainresnet8"] == prune_quality.default_task("plainresnet8")  # no tuning: the derived default
    assert [n for n in tasks if n != "plainresnet8"] == ["resnetv2_50x1_bit_w0.5", "mobilenetv2_050", "retnet_tiny4",
                                                         "tresnet_m_w0.125"]
    assert tasks["mobilenetv2_050"][:2] == ["model=mobilenetv2_050", "data=digits"]
    finer = prune_quality.overrides_of("retnet_tiny8")  # a named variant: the RetNet task with 8 layers
    assert [o for o in finer if o not in tasks["retnet_tiny4"]] == ["++model.overrides.depth=8"]
    assert len(finer) == len(tasks["retnet_tiny4"])


def test_a_missing_measurement_is_judged_not_measured_never_dropped_or_passed():
    """A stored report whose numbers lack a measurement (a condition skipped, a plan not timed, a decode target
    measured by a later version, a suite of the set never run) judges each such target as None: listed, not passed."""
    from benchmarks.common import exit_code
    from benchmarks.report import judge_report, statuses

    label = "mobilenetv2_035/float32/contiguous/b2/auto"
    report = {"set": "gpu_check", "suites": {
        "latency_table": {"result": {"suite": "latency_table", "form": "conditions", "conditions": {
            label: {"max_abs_error_raw": 0.01}, "tresnet_m/float32/contiguous/b2/auto": {"skipped": "time budget"}}}},
        "prune_search": {"result": {"suite": "prune_search", "conditions": {
            label: {"target_1.5": {"measured_speedup": 1.5}, "target_2.0": {"error": "out of reach"}}}}},
        "retnet_decode": {"result": {"suite": "retnet_decode", "form": "batches", "device": "cuda", "batches": {
            "batch_1": {"latency_ratio_longest_to_shortest": {"retnet": 1.0}, "decode": []}}}},
        "fla": {"skipped": "time budget"}}}
    judged = judge_report(json.loads(json.dumps(report)))
    lut = judged["suites"]["latency_table"]["result"]["verdicts"]
    assert lut == {f"{label} max error <= 5%": True, "tresnet_m/float32/contiguous/b2/auto max error <= 5%": None}
    prune = judged["suites"]["prune_search"]["result"]["verdicts"]
    assert prune[f"{label} target_1.5 >= 0.9 x target"] is True and prune[f"{label} target_2.0 >= 0.9 x target"] is None
    decode = judged["suites"]["retnet_decode"]["result"]["verdicts"]
    assert decode["batch_1 RetNet latency ratio <= 1.2"] is True
    assert decode["batch_1 graph step <= 1.0x the Transformer's at context 128"] is None
    assert decode["batch_1 greedy generate equals the reference decode"] is None
    found = statuses(judged)
    assert found == {"latency_table": "incomplete", "prune_search": "incomplete", "retnet_decode": "incomplete",
                     "fla": "skipped", "measurement": "skipped", "train_memory": "skipped",
                     "runtime_tables": "skipped"}
    assert exit_code(found.values()) == 3  # nothing failed, but not everything was measured: not a pass
    report["suites"]["latency_table"]["result"]["conditions"][label]["max_abs_error_raw"] = 0.2
    assert statuses(judge_report(report))["latency_table"] == "failed"


def test_docs_sections_are_replaced_in_place(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nintro\n")
    update_docs("zoo_vs_timm", "| a |\n|---|\n| 1 |", "python -m benchmarks run zoo_vs_timm", docs)
    update_docs("zoo_vs_timm", "| a |\n|---|\n| 2 |", "python -m benchmarks run zoo_vs_timm", docs)
    text = docs.read_text()
    assert text.count("<!-- suite:zoo_vs_timm -->") == 1 and "| 2 |" in text and "| 1 |" not in text
    assert text.startswith("# Benchmarks\n\nintro")
    update_docs("runtime_tables", "| cpu |", "python -m benchmarks run runtime_tables", docs)
    update_docs("runtime_tables", "| gpu |", "python -m benchmarks run runtime_tables --device cuda", docs,
                platform="cuda")
    text = docs.read_text()  # a GPU run has its own section: the CPU's stays
    assert "| cpu |" in text and "<!-- suite:runtime_tables_cuda -->\n### runtime_tables_cuda" in text
    assert "| gpu |" in text


def test_a_runs_docs_section_is_its_verdicts():
    from benchmarks.common import Check, verdict_table

    table = verdict_table([Check("a ratio", 0.9, "<=", 1.0), Check("b", 2.0, "<=", 1.0), Check("c", None, ">=", 3)])
    assert table.splitlines()[2:] == ["| a ratio (<= 1) | 0.9 | met |", "| b (<= 1) | 2 | **not met** |",
                                      "| c (>= 3) | not measured | not measured |"]


def test_runtime_tables_verdicts_are_raw_and_anchored_errors_against_their_limits(tmp_path):
    from benchmarks.report import judge_file
    from benchmarks.runtime_tables import table_verdicts

    def table(mean, worst, mean_anchored, worst_anchored, noise=0.0):
        return {"noise_floor": noise, "mean_error": mean, "max_error": worst, "mean_error_anchored": mean_anchored,
                "max_error_anchored": worst_anchored}

    drifted = table(0.06, 0.07, 0.01, 0.02)      # the machine's drift: raw fails, anchored passes
    bad = table(0.02, 0.12, 0.03, 0.11)          # one plan off: both fail on the max
    good = table(0.02, 0.04, 0.02, 0.04)
    noisy = table(0.06, 0.12, 0.06, 0.12, noise=0.1)  # within 1.5x a noise floor of 10 %
    speedups = [{"runtime": rt, "target": t, "measured_speedup": 2.0 * t} for rt in ("compile", "eager")
                for t in (1.5, 2.0)]
    result = {"runtimes": ["compile", "eager"], "models": [{"model": "m", "tables": {"compile": drifted,
                                                                                   "eager": good},
                                                            "speedups": speedups}]}
    path = tmp_path / "r.json"

    def judged(result):
        path.write_text(json.dumps(result))
        report, _ = judge_file(path, "runtime_tables")  # python -m benchmarks judge r.json --suite runtime_tables
        again = report["suites"]["runtime_tables"]["result"]
        return table_verdicts(again), again["status"]

    tables, status = judged(result)
    assert tables[("m", "compile")] == {"raw": False, "anchored": True} and status == "failed"
    assert tables[("m", "eager")] == {"raw": True, "anchored": True}
    result["models"][0]["tables"] = {"compile": noisy, "eager": good}
    assert judged(result) == ({("m", "compile"): {"raw": True, "anchored": True},
                               ("m", "eager"): {"raw": True, "anchored": True}}, "passed")
    result["models"][0]["tables"]["eager"] = bad
    assert judged(result)[0][("m", "eager")] == {"raw": False, "anchored": False}
    result["models"][0]["tables"]["eager"] = good
    result["models"][0]["speedups"][0]["measured_speedup"] = 1.0  # below 0.9 x 1.5
    assert judged(result)[1] == "failed"
    result["models"][0]["speedups"][0]["measured_speedup"] = None  # out of reach: not measured, never passed
    assert judged(result)[1] == "incomplete"


def quality_family(task: str, values: dict[str, list[float]], baseline: float, samples: int = 4) -> dict:
    """A prune_quality family whose cells hold `values[rule]` (one per seed) at 2.0x in both stages, each seed's
    per-sample values all equal to it (so the per-sample mean is the metric)."""
    metric = "acc1" if task == "classification" else "loss"
    cells = [{"rule": r, "target": 2.0, "seed": s, "at_target": True, "interpolated": False, "speedup": 2.0,
              "session_speedup": 2.0,
              "removed": 3.0, "search_s": 0.1, "used": [{"name": f"{r}{s}", "weight": 1.0, "plan_score": v,
                                                       "speedup": 2.0 + s / 100, "surrogate": -v, "one_shot_loss": -v,
                                                       "one_shot_scored_loss": v, "short_metric": v}],
              **{stage: {metric: v, "loss": v, "ppl": 2.0, "acc1": v, "agreement": 90.0, "kl": 0.1,
                         "samples": [v] * samples} for stage in ("one_shot", "short")}}
             for r, seeds in values.items() for s, v in enumerate(seeds)]
    base = {"acc1": baseline} if task == "classification" else {"loss": baseline, "ppl": 2.0 ** baseline}
    return {"family": "f", "task": task, "metric": metric, "baseline": base, "cells": cells}


def test_paired_statistics_against_hand_computed_values():
    """The t test by hand (df 2: p = 1 - t / sqrt(2 + t^2)), Holm's adjusted p values, the bootstrap when the seeds do
    not vary, and the verdict words."""
    from studies.stats import compare, holm, paired_t, verdicts

    t = paired_t([10.0, 8.0, 12.0])  # mean 10, sd 2, se 2/sqrt(3), t = 5 sqrt(3)
    assert (t["mean"], t["sd"], t["se"]) == (pytest.approx(10.0), pytest.approx(2.0), pytest.approx(2 / 3 ** 0.5))
    assert t["t"] == pytest.approx(5 * 3 ** 0.5) and t["df"] == 2
    assert t["p"] == pytest.approx(1 - 75 ** 0.5 / 77 ** 0.5, rel=1e-9)
    assert t["t_critical"] == pytest.approx(4.302653, rel=1e-6)  # t(0.975, 2)
    assert [h["p_holm"] for h in holm([0.01, 0.04, 0.03])] == pytest.approx([0.03, 0.06, 0.06])
    assert [h["rejected"] for h in holm([0.01, 0.04, 0.03])] == [True, False, False]
    constant = compare([2.0, 2.0, 2.0], [[1.0, 3.0, 2.0, 2.0] * 25] * 3)  # the seeds measured nothing
    assert constant["test"] == "paired_bootstrap" and constant["p"] < 0.01 and constant["mean"] == pytest.approx(2.0)
    noise = compare([0.5, 0.5], [[1.0, -1.0] * 20 + [1.0], [1.0, -1.0] * 20 + [1.0]])
    assert noise["test"] == "paired_bootstrap" and noise["p"] > 0.5
    assert compare([0.0, 0.0, 0.0], [[0.0] * 10] * 3)["p"] == 1.0  # the same plans: a tie, not a win
    flat = compare([0.5, 0.5, 0.5], None)  # no spread and nothing per sample: untestable, so a tie
    assert flat["test"] == "none" and flat["p"] == 1.0 and verdicts([flat])[0]["verdict"] == "tie"
    judged = verdicts([{"p": 0.001, "mean": 1.0}, {"p": 0.001, "mean": -1.0}, {"p": 0.2, "mean": 3.0}])
    assert [j["verdict"] for j in judged] == ["better", "worse", "tie"] and judged[0]["family_size"] == 3


def test_prune_quality_at_target_and_interpolation_by_hand():
    """A plan within 2 % is used alone; else the closest plans below and above the target, weighted linearly in
    measured speed-up (1.44 and 1.54 around 1.5: 0.4 and 0.6), per sample too; else the closest, off target, except
    the default's slowest plan when all of them are faster than the target."""
    import numpy as np

    from studies.prune_quality import at_target, combine

    tried = [{"measured_speedup": 1.44, "plan": "a"}, {"measured_speedup": 1.54, "plan": "b"},
             {"measured_speedup": 1.70, "plan": "c"}]
    chosen = at_target(tried, 1.5)
    assert chosen["at_target"] and chosen["interpolated"]
    assert [(u["plan"], u["weight"]) for u in chosen["used"]] == [("a", pytest.approx(0.4)), ("b", pytest.approx(0.6))]
    near = at_target([*tried, {"measured_speedup": 1.51, "plan": "d"}], 1.5)
    assert [u["plan"] for u in near["used"]] == ["d"] and not near["interpolated"]
    short = at_target([{"measured_speedup": 1.3, "plan": "a"}, {"measured_speedup": 1.4, "plan": "b"}], 1.5)
    assert not short["at_target"] and [u["plan"] for u in short["used"]] == ["b"]
    slower = [{"measured_speedup": 1.3, "plan": "a"}, {"measured_speedup": 1.4, "plan": "b"}]
    assert not at_target(slower, 1.5, faster_counts=True)["at_target"]  # a default slower than the target: off it
    over = [{"measured_speedup": 1.62, "plan": "a"}, {"measured_speedup": 1.59, "plan": "b"}]
    assert not at_target(over, 1.5)["at_target"]
    faster = at_target(over, 1.5, faster_counts=True)  # the default's, faster than asked: counted, handicapped
    assert faster["at_target"] and faster["faster"] and [u["plan"] for u in faster["used"]] == ["b"]
    stage = {"a": {"short": {"acc1": 50.0, "loss": 1.0, "agreement": 60.0, "kl": 0.5, "correct": "0101"}},
             "b": {"short": {"acc1": 75.0, "loss": 0.5, "agreement": 80.0, "kl": 0.3, "correct": "1101"}}}
    used = [{"name": "a", "weight": 0.4}, {"name": "b", "weight": 0.6}]
    mixed = combine(used, stage, "short", "acc1")
    assert mixed["acc1"] == pytest.approx(65.0) and mixed["loss"] == pytest.approx(0.7)
    assert mixed["samples"] == pytest.approx([60.0, 100.0, 0.0, 100.0])
    assert np.mean(mixed["samples"]) == pytest.approx(mixed["acc1"])


def test_prune_quality_verdicts_against_hand_computed_values():
    """The default against every rule, Holm-corrected over the family: clear differences win, a plan that does not
    change with the seed is tested on the samples, a language model's lower loss is better; the overall targets."""
    from studies.prune_quality import overall, with_statistics

    family = with_statistics(quality_family("classification", {
        "interaction": [90.0, 91.0, 92.0, 93.0, 94.0], "random": [40.0, 45.0, 38.0, 50.0, 41.0],
        "greedy": [90.5, 90.0, 92.5, 93.5, 93.0], "dp_loss": [80.0, 80.0, 80.0, 80.0, 80.0]}, baseline=95.0),
        "interaction")
    v = family["verdicts"]
    by = {(c["reference"], c["stage"]): c for c in v["comparisons"]}
    assert by["random", "short"]["verdict"] == "better" and by["random", "short"]["test"] == "paired_t"
    assert by["greedy", "short"]["verdict"] == "tie"  # diffs -0.5, 1, -0.5, -0.5, 1: nothing to claim
    assert by["dp_loss", "short"]["test"] == "paired_t"  # 10..14 points: spread over seeds, so a t test
    assert v["by_reference"]["random"]["summary"] == "better" and v["never_worse"]
    assert v["comparisons"][0]["family_size"] == 6 and v["random_one_shot_cost"] == pytest.approx(52.2)
    assert by["random", "short"]["span"] == pytest.approx(0.01)  # seeds 0-4 at 2.00-2.04x: 0-2 % from 2.0x
    scorer = v["scorer"][0]  # against the scored loss (+1), the plain loss (-1), top-1 after fine-tuning (-1)
    assert scorer["plans"] == 20 and scorer["plan_score_spearman"] == pytest.approx(1.0) and scorer["passed"]
    assert scorer["plain_loss_spearman"] == pytest.approx(-1.0) and scorer["short_spearman"] == pytest.approx(-1.0)
    lm = with_statistics(quality_family("lm", {"interaction": [1.0, 1.1, 1.2, 1.0], "random": [1.6, 1.8, 1.7, 1.5]},
                                        baseline=0.9), "interaction")
    diff = next(c for c in lm["verdicts"]["comparisons"] if c["stage"] == "one_shot")
    assert lm["verdicts"]["scorer"][0]["short_spearman"] == pytest.approx(1.0)  # a loss: higher is worse on both
    assert diff["mean"] == pytest.approx(0.575) and diff["verdict"] == "better"  # lower loss is better
    result = overall({"families": [family, lm]})
    assert result["never_worse"] and result["better_than_random"] == 2 and result["better_than_greedy"] == 0
    assert result["passed"] is False


def test_prune_quality_run_in_parts_is_incomplete_until_every_family_is_done():
    """A result holding fewer families than were requested (a run in parts) is judged incomplete, never passed on
    the families it has: its targets are stated over all of them."""
    from benchmarks.common import judge
    from studies.prune_quality import with_statistics

    family = with_statistics(quality_family("classification", {  # better than every rule: every target met
        "interaction": [90.0, 91.0, 92.0, 93.0, 94.0], "random": [40.0, 45.0, 38.0, 50.0, 41.0],
        "greedy": [60.0, 62.0, 59.0, 65.0, 61.0], "dp_loss": [70.0, 71.0, 69.0, 75.0, 70.0]}, baseline=95.0),
        "interaction")
    whole = judge("prune_quality", {"suite": "prune_quality", "families": [family], "requested": ["f"]})
    assert whole["status"] == "passed" and whole["verdicts"]["families run of those requested"] is True
    part = judge("prune_quality", {"suite": "prune_quality", "families": [family], "requested": ["f", "g", "h"]})
    assert part["status"] == "incomplete" and part["verdicts"]["families run of those requested"] is None


def test_prune_quality_sensitivity_leaves_out_interpolations_across_a_gap():
    """The verdicts compare every cell at the target; the sensitivity analysis leaves out the cells interpolated
    between plans more than SPAN (10 %) from it: a rule whose plans bracket 2.0x at 1.79x and 2.05x (10.5 % and
    2.5 % away) beats the default in the verdicts but is not compared in the sensitivity analysis (listed), where the
    same line from 1.82x still counts there."""
    from studies.prune_quality_report import SPAN, counts, markdown, overall, with_statistics

    assert SPAN == pytest.approx(0.10)
    values = {"interaction": [90.0, 91.0, 92.0, 93.0, 94.0], "block_influence": [95.0, 96.0, 97.0, 98.0, 99.0]}

    def gapped(low: float) -> dict:
        family = quality_family("classification", values, baseline=95.0)
        family["condition"] = {"device_name": "cpu", "batch_size": 1}
        family["baseline"]["epochs"] = 1
        for cell in family["cells"]:
            if cell["rule"] == "block_influence":  # a line across plans at `low` and 2.05x, as whole-layer rules give
                cell["interpolated"] = True
                cell["used"] = [{**cell["used"][0], "speedup": low, "weight": 0.2},
                                {**cell["used"][0], "speedup": 2.05, "weight": 0.8}]
        return with_statistics(family, "interaction")

    wide = gapped(1.79)
    assert all(counts(c) for c in wide["cells"]) and not wide["verdicts"]["never_worse"]  # the verdicts: all cells
    assert {c["verdict"] for c in wide["verdicts"]["comparisons"]} == {"worse"}
    assert not any(counts(c, SPAN) for c in wide["cells"] if c["rule"] == "block_influence")
    sens = wide["span_sensitivity"]
    assert sens["compared"] == 0 and sens["never_worse"] is None  # nothing compared: not tested, never "not worse"
    assert sens["worse"] == []
    assert sens["not_compared"] == [{"rule": "block_influence", "target": 2.0, "stage": s}
                                    for s in ("one_shot", "short")]
    assert next(r for r in wide["rows"] if r["rule"] == "block_influence")["beyond_span"] == 5
    result = {"families": [wide]}
    result["overall"] = overall(result)
    assert result["overall"]["never_worse_families"] == 0 and result["overall"]["never_worse_families_within_span"] == 0
    assert "not tested: nothing compared" in markdown(result) and "block_influence at 2.0x short" in markdown(result)
    near = gapped(1.82)  # 9 % below: counts in the sensitivity analysis too
    assert all(counts(c, SPAN) for c in near["cells"]) and near["span_sensitivity"]["never_worse"] is False
    edge = gapped(1.8)  # exactly 10 % away (1.8 / 2.0 - 1 is -0.0999... or -0.1000...1 in floating point): counts
    assert all(counts(c, SPAN) for c in edge["cells"])


def test_prune_quality_code_digest_ignores_prose_only(tmp_path, monkeypatch):
    """Cells are keyed by the digest of the code they ran: an edit of docstrings or comments keeps it (the cells
    stay valid), an edit of the code changes it."""
    import importlib

    from studies.prune_quality import code_digest

    source = '''"""A module."""\n\ndef damage(x):\n    """Twice x."""\n    return 2 * x  # doubled\n'''
    variants = {"same": source, "prose": source.replace("Twice x.", "x, doubled: the damage.").replace(
        "# doubled", "# times two").replace("A module.", "Another module."), "code": source.replace("2 * x", "3 * x")}
    monkeypatch.syspath_prepend(str(tmp_path))
    digests = {}
    for name, text in variants.items():
        (tmp_path / f"digest_{name}.py").write_text(text)
        importlib.invalidate_caches()
        digests[name] = code_digest(f"digest_{name}")
    assert digests["same"] == digests["prose"] != digests["code"]


def test_prune_quality_digests_name_modules_that_exist():
    """The modules whose code keys prune_quality's cells are the ones the layers hold today: a module renamed or moved
    must be renamed here too (else every resumed study fails at its first cell)."""
    from studies.prune_quality import QUALITY_CODE, SEARCH_CODE, code_digest

    for modules in (SEARCH_CODE, QUALITY_CODE):
        assert len(code_digest(*modules)) == 16


def test_int8_depth_keeps_stored_parts_only_at_the_same_target(tmp_path):
    """A stored part was planned for its file's target: resumed at another target it is dropped, not reused. At the
    same target, the file's other models are carried over untouched by a run of one model (with the versions that
    measured them, when not this run's); another platform's file is not reused at all."""
    from benchmarks.common import Budget, smoke_model
    from studies.int8_depth import QUICK_TARGET, run

    model = smoke_model()
    stored = {"speed": {"fingerprint": "stored", "session": {"speedup": {}}}}
    other = {"quality": {"fingerprint": "other", "seeds": []}}
    for target, kept in ((QUICK_TARGET, True), (QUICK_TARGET + 0.5, False)):
        source = tmp_path / f"stored_{target}.json"
        source.write_text(json.dumps({"target": target, "models": {"other_model": other, model: stored}}))
        result = run(quick=True, models=[model], parts=("speed",), out=tmp_path / "out", resume=source,
                     budget=Budget(0.0, min_start_s=1.0))  # no time to measure: only what is kept is there
        assert (result["models"][model]["speed"] == stored["speed"]) is kept
        assert kept or "skipped" in result["models"][model]["speed"]
        assert (result["models"].get("other_model") == other) is kept
    older = {"torch": "1.0", "onnxruntime": "1.0"}  # a file of other versions: what it carries says which
    source.write_text(json.dumps({"target": QUICK_TARGET, "versions": older, "models": {"other_model": other}}))
    result = run(quick=True, models=[model], parts=("speed",), out=tmp_path / "out", resume=source,
                 budget=Budget(0.0, min_start_s=1.0))
    assert result["models"]["other_model"] == {**other, "versions": older}
    source.write_text(json.dumps({"target": QUICK_TARGET, "platform": "cuda", "models": {model: stored,
                                                                                     "other_model": other}}))
    result = run(quick=True, models=[model], parts=("speed",), out=tmp_path / "out", resume=source,
                 budget=Budget(0.0, min_start_s=1.0))  # a GPU's numbers are neither kept nor carried on the CPU
    assert "other_model" not in result["models"] and "skipped" in result["models"][model]["speed"]


def test_int8_depth_seeds_are_tied_to_the_baseline_weights(tmp_path):
    """A stored digits seed is kept only on the same baseline: the same weights saved elsewhere (other file, other
    metadata) keep it; one changed weight, or another part's inputs, make it stale."""
    import torch

    from studies.int8_depth import quality_fingerprint
    from zoo.pruning.importance import weights_digest

    model = zoo.create_model("mobilenetv2_035", num_classes=10)
    first = zoo.save_checkpoint(model, tmp_path / "a" / "best.safetensors")
    again = zoo.save_checkpoint(model, tmp_path / "b" / "best.safetensors", epoch=7)
    key = {"model": "mobilenetv2_035", "part": "quality", "protocol": 1}
    stored = quality_fingerprint(key, weights_digest(zoo.load(first)))
    assert quality_fingerprint(key, weights_digest(zoo.load(again))) == stored
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-3
    changed = zoo.save_checkpoint(model, tmp_path / "c" / "best.safetensors")
    assert quality_fingerprint(key, weights_digest(zoo.load(changed))) != stored
    assert quality_fingerprint({**key, "protocol": 2}, weights_digest(zoo.load(first))) != stored


def test_int8_depth_runs_tensorrt_on_a_gpu_and_says_why_it_cannot_here(tmp_path):
    """On a GPU the two tables are TensorRT's float and INT8 runtimes, the pair prune.py plans on with
    prune.runtime=tensorrt; a cuda run without CUDA (or TensorRT) is skipped with the reason and writes nothing; its
    result file is never the CPU's."""
    import torch
    from omegaconf import OmegaConf

    from studies.int8_depth import PLATFORMS, platform_of, result_path, run, runtimes_on
    from zoo.jobs.prune_config import planning_runtime

    assert runtimes_on("cpu") == {"fp32": "onnxruntime", "int8": "onnxruntime_int8"}
    assert runtimes_on("cuda") == {"fp32": "tensorrt", "int8": "tensorrt_int8"}
    for kind, runtime in PLATFORMS.items():
        for planner, int8_table in (("int8", True), ("fp32", False)):
            prune = OmegaConf.create({"runtime": runtime, "quantize": "int8", "int8_table": int8_table})
            assert planning_runtime(prune) == runtimes_on(kind)[planner]
    assert platform_of("mps")[0] is None and "cpu or cuda" in platform_of("mps")[1]
    assert result_path(False, tmp_path, "cuda").name == "int8_depth_cuda.json" != result_path(False, tmp_path).name
    if not torch.cuda.is_available():
        assert platform_of("auto") == ("cpu", None)
        kind, why = platform_of("cuda")
        assert kind is None and "no CUDA device" in why
        result = run(quick=True, device="cuda", out=tmp_path / "out")
        assert result["skipped"] == why and not (tmp_path / "out").exists()


def test_shared_machine_compares_a_joblib_study_with_the_same_jobs_in_sequence(tmp_path):
    """The suite's three modes are the same two jobs: one after the other (separate run directories), a joblib study
    of both with today's default threads, and the same study with every job taking every core; its verdict is the
    joblib study's time over the sequential pair's against 1.1."""
    from studies.shared_machine import TARGETS, checks, cores, mode_commands

    sequential = mode_commands("sequential", [], tmp_path)
    assert len(sequential) == 2 and [c[-1] for c in sequential] == [f"hydra.run.dir={tmp_path / f'run{t}'}"
                                                                    for t in TARGETS]
    (study,) = mode_commands("joblib", [], tmp_path)
    (greedy,) = mode_commands("joblib_all_cores", [], tmp_path)
    assert "-m" in study and "hydra/launcher=joblib" in study and "hydra.launcher.n_jobs=2" in study
    assert [a for a in greedy if a not in study] == [f"trainer.threads={cores()}"]
    assert [c.verdict for c in checks({"ratio": {"joblib": 1.05}})] == [True]
    assert [c.verdict for c in checks({"ratio": {"joblib": 1.3}})] == [False]
    assert [c.verdict for c in checks({"ratio": {}})] == [None]


def test_timm_prune_counts_architectures_and_families_that_met_the_target_in_every_seed():
    """An architecture counts when every seed met the measured target; its family once; a refused run is listed with
    its reason, never counted; the cost target is the discovered run's time over the declared one's."""
    from studies.timm_prune import checks, summarise

    def row(arch, family, seed, met=True, **extra):
        return {"arch": arch, "family": family, "seed": seed, "blocks": 4, "sublayers": 0, "seconds": 10.0,
                **({"measured_speedup": 1.5, "met": met, "ceiling": 2.0, "acc_before": 90.0, "acc_after": 88.0}
                   if "refused" not in extra else {}), **extra}

    rows = [row(f"a{i}", f"fam{i % 8}", s) for i in range(12) for s in range(3)]
    rows += [row("slow", "fam0", 0), row("slow", "fam0", 1, met=False)]
    rows += [row("never", "fam9", 0, refused="BudgetError: cannot be reached")]
    result = {"target": 1.5, "rows": rows, "summary": summarise(rows), "cost": {"ratio": 1.2}}
    verdicts = {c.label: (c.measured, c.verdict) for c in checks(result)}
    assert list(verdicts.values()) == [(12, True), (8, True), (1.2, True)]
    never = next(s for s in result["summary"] if s["arch"] == "never")
    assert never["met"] == 0 and never["refused"] == "BudgetError: cannot be reached" and never["speedup"] == "-"
    assert next(s for s in result["summary"] if s["arch"] == "a0")["top1_after"] == "88.00 (0.00)"
    result["rows"] = [r for r in rows if r["arch"] != "a11"]
    result["summary"] = summarise(result["rows"])
    assert [c.verdict for c in checks(result)][:2] == [False, True]


def test_timm_prune_judges_an_architecture_only_on_every_seed_asked_for():
    """A run asked for 3 seeds that stopped after one is not judged on that one: an architecture counts only with a
    row for every seed, each at the target."""
    from studies.timm_prune import checks

    row = {"family": "resnet", "blocks": 5, "sublayers": 0, "ceiling": 2.0, "measured_speedup": 1.5, "met": True,
           "acc_before": 99.0, "acc_after": 98.0, "seconds": 50.0}
    rows = [{**row, "arch": f"a{i}", "family": f"f{i}", "seed": 0} for i in range(12)]
    partial = checks({"seeds": 3, "rows": rows, "cost": {"ratio": 1.0}})
    assert partial[0].measured == 0 and partial[1].measured == 0
    full = [{**r, "seed": s} for r in rows for s in range(3)]
    assert checks({"seeds": 3, "rows": full, "cost": {"ratio": 1.0}})[0].measured == 12
