"""The studies that judge a target run their smallest configurations (smoke tests: no timing asserted)."""

from __future__ import annotations

import pytest


def test_shared_machine_quick_times_the_judged_pair(tmp_path):
    """Two tiny prune.py jobs, in sequence and as a joblib study: both modes ran and the study's ratio is its time
    over the sequential pair's (smoke: no timing asserted)."""
    from studies.shared_machine import QUICK_MODES, markdown, run

    result = run(quick=True, out=str(tmp_path))
    assert set(result["seconds"]) == set(QUICK_MODES) and all(s > 0 for s in result["seconds"].values())
    assert set(result["ratio"]) == set(QUICK_MODES) - {"sequential"} and "Status:" in markdown(result)
    for mode in QUICK_MODES[1:]:
        assert result["ratio"][mode] == round(result["seconds"][mode] / result["seconds"]["sequential"], 3)
    assert result["status"] in ("passed", "failed") and (tmp_path / "shared_machine.json").is_file()


def test_timm_prune_quick_prunes_timm_models_and_times_the_cost_pair(tmp_path):
    """Two tiny timm architectures through prune.py model=timm (a CNN by blocks, a DeiT by blocks and sub-layers):
    one row each with its units, and the discovered and declared MobileNetV2 timed (smoke: no timing asserted); a
    second run with --resume keeps every row."""
    from studies.timm_prune import run

    first = run(quick=True, out=str(tmp_path), workdir=str(tmp_path / "work"))
    rows = {r["arch"]: r for r in first["rows"]}
    assert rows["resnet18"]["blocks"] == 5 and rows["deit_tiny_patch16_224"]["sublayers"] == 24
    for row in rows.values():
        assert row["exit"] == 0 and row["measured_speedup"] > 0 and 0 <= row["acc_after"] <= 100, row
    assert first["cost"]["ratio"] == round(first["cost"]["median_s"]["discovered"] /
                                           first["cost"]["median_s"]["declared"], 3)
    again = run(quick=True, out=str(tmp_path / "again"), resume=str(tmp_path / "timm_prune_quick.json"))
    assert again["rows"] == first["rows"] and again["cost"] == first["cost"]


def test_removal_additivity_times_single_and_joint_removals(tmp_path):
    """ConvNeXt-atto's plans timed side by side: a row per single unit and per named group, each joint plan's sum of
    single savings computed from the single rows, the table's prediction beside it (smoke: no timing asserted)."""
    from studies.removal_additivity import GROUPS, markdown, run

    result = run("convnext_atto", rounds=3, out=str(tmp_path))
    rows = {r["plan"]: r for r in result["rows"]}
    assert set(GROUPS["convnext_atto"]) <= set(rows) and result["intact_ms"] > 0
    for name, units in GROUPS["convnext_atto"].items():
        singles = sum(rows[unit]["measured_saving_ms"] for unit in units)
        assert rows[name]["sum_of_single_savings_ms"] == pytest.approx(singles, abs=0.01)
        assert rows[name]["table_saving_ms"] > 0
    assert (tmp_path / "removal_additivity_convnext_atto.json").is_file() and "| stage 3, both blocks |" in \
        markdown(result)


def test_measure_repeat_times_a_runs_plan_at_each_round_count(tmp_path):
    """A finished run's plan timed beside its baseline, repeatedly at each round count, alternating: one row per count
    with every speed-up kept and its spread computed from them (smoke: no timing asserted); a folder without a
    finished run is refused."""
    import zoo
    from studies.measure_repeat import main, run
    from zoo.errors import ZooError
    from zoo.files import write_sealed_json

    model = zoo.create_model("mobilenetv2_050", num_classes=10)
    checkpoint = zoo.save_checkpoint(model, tmp_path / "baseline.safetensors")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    condition = {"batch_size": 2, "input_size": [3, 32, 32], "threads": 1, "dtype": "float32", "runtime": "eager"}
    write_sealed_json(run_dir / "results.json", {  # as prune.py writes it
        "model": "mobilenetv2_050", "condition": condition, "baseline": {"source": str(checkpoint)},
        "plan": {"remove": ["blocks.2.1", "blocks.3.1"]}})
    result = run(str(run_dir), rounds=(3, 5), repeats=2, out=str(tmp_path))
    assert [row["rounds"] for row in result["rows"]] == [3, 5]
    for row in result["rows"]:
        assert len(row["speedups"]) == 2 and row["low"] == min(row["speedups"]) and row["high"] == max(row["speedups"])
    assert (tmp_path / "measure_repeat.json").is_file()
    with pytest.raises(ZooError, match="no results.json"):
        main(["--run", str(tmp_path / "nothing")])


def test_hf_census_examines_each_type_in_its_own_worker_and_counts_what_it_proved(tmp_path):
    """Three causal LM types built small: Llama prunes with every unit rechecked, its decode step equal to the whole
    sequence's and its stock folder reloading equal; a post-norm-free OPT too; Mamba has no KV cache, said in its row
    (prefill only); the summary counts the rows."""
    from studies.hf_census import run

    result = run(["llama", "opt", "mamba"], str(tmp_path), jobs=2)
    rows = {r["type"]: r for r in result["rows"]}
    assert rows["llama"]["step"] == "done" and rows["llama"]["recheck_failed"] == []
    assert rows["llama"]["decode"] == "equal" and rows["llama"]["stock_error"] <= 1e-5
    assert rows["mamba"]["decode"].startswith("refused") and "no KV cache" in rows["mamba"]["decode"]
    summary = result["summary"]
    assert summary["types"] == 3 and summary["units_failing_recheck"] == 0
    assert summary["prunable"] == sum(r["step"] == "done" for r in rows.values())


def test_hf_layer_costs_quick_builds_the_tables_and_times_the_stock_folders(tmp_path):
    """One packaged tiny LM: its prefill and decode tables give a saving per layer and the plans a count and the table
    need, and the whole layers the table needs for 1.5x, removed and written as a stock folder, reload with the pruned
    model's logits and are timed in plain transformers beside the original (smoke: no timing asserted)."""
    from studies.hf_layer_costs import markdown, run

    result = run(str(tmp_path), quick=True)
    assert [(r["workload"], r["context"]) for r in result["rows"]] == [("forward", 64), ("decode", 64)]
    for row in result["rows"]:
        assert len(row["layer_savings_ms"]) == 6 and 0 < row["fixed_share"] < 1 and set(row["plans"]) == {"1.3", "1.5"}
    (stock,) = result["stock"]
    assert stock["plan"]["remove"] and stock["logits_rel_diff"] <= 1e-5
    for workload in ("prefill", "decode"):
        timed = stock[workload]
        assert timed["original_ms"] > 0 and timed["pruned_ms"] > 0 and timed["table_predicted_speedup"] > 1
        assert timed["within_noise"] == (abs(timed["stock_speedup"] / timed["table_predicted_speedup"] - 1)
                                         <= 2 * timed["noise"])
    assert "stock / predicted" in markdown(result) and (tmp_path / "hf_layer_costs_quick.json").is_file()
