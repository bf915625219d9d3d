"""timm's model surface on every family: features_only backbones, forward_intermediates, gradient checkpointing
(identical outputs and gradients, less activation memory), RetNet hidden states, the training memory report."""

from __future__ import annotations


def test_train_memory_benchmark_quick(tmp_path):
    from benchmarks.train_memory import SETTING_NAMES, TARGET_COST, TARGET_REDUCTION, markdown, models, run

    result = run(quick=True, device="cpu", out=str(tmp_path))
    assert [r["model"] for r in result["rows"]] == models()  # every family that can checkpoint, from the registry
    for row in result["rows"]:
        assert 0 < row["fp32_ckpt_act_mb_per_sample"] < row["fp32_act_mb_per_sample"]
        assert row["fp32_ckpt_max_batch"] > row["fp32_max_batch"] > 0
        assert 0 < row["pruned_reduction"] < 1
    rows = {r["model"]: r for r in result["rows"]}
    targeted = models(targeted_only=True)
    assert targeted and len(result["verdicts"]) == 2 * len(targeted)  # two targets per targeted family
    for label, verdict in result["verdicts"].items():  # computed from the targets and the row, never assumed
        model = label.split(" ")[0]
        key = next(k for k, name in SETTING_NAMES.items() if f"checkpointing {name}:" in label)
        measured, limit, ok = ((rows[model][f"{key}_reduction"], TARGET_REDUCTION, lambda m, t: m >= t)
                               if "memory saved" in label else (rows[model][f"{key}_cost"], TARGET_COST,
                                                                lambda m, t: m <= t))
        assert verdict == ok(measured, limit), label
    assert result["status"] in ("passed", "failed")
    assert "passed" in markdown(result) or "not met" in markdown(result)
    assert (tmp_path / "train_memory_quick.json").is_file()
