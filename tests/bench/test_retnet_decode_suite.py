"""The RetNet decode suite's quick configuration (every part measured, the targets it cannot reach not measured), its
parameter-matched Transformer baseline (cached decoding equals the full forward), and the training-cost study."""

from __future__ import annotations

import torch

import zoo


def test_benchmark_quick():
    from benchmarks import retnet_decode, transformer

    result = retnet_decode.run(quick=True)
    assert result["decode"] and result["generate"] and result["parallel"] and "train" not in result
    assert {row["model"] for row in result["decode"]} == {"retnet", "retnet_reference", "transformer"}
    assert all(row["ms_per_token"] > 0 and row["cache_bytes"] > 0 for row in result["decode"])
    ops = result["operators_per_step"]
    assert 0 < ops["retnet"] < ops["retnet_reference"]  # the fast step dispatches fewer operators
    assert result["step_agreement"]["step_logits_max_abs_diff"] <= 1e-6
    # the quick contexts (16, 64) and length (32) do not reach the targets' 512 / 2048: not measured, not passed
    assert result["verdicts"]["decode step <= 1.0x the Transformer's at context 512"] is None
    assert result["passed"] is False
    matched = transformer.parameter_matched_transformer(zoo.create_model("retnet_small")).eval()
    assert abs(transformer.count_params(matched) / 5_639_424 - 1) < 0.05 and matched.dim != 256
    ids = torch.randint(0, 256, (2, 20))
    with torch.inference_mode():  # the baseline is a correct Transformer: cached decoding equals its full forward
        full = matched(ids, matched.new_cache(2, 20), 0)
        cache = matched.new_cache(2, 20)
        steps = [matched(ids[:, :12], cache, 0)] + [matched(ids[:, i : i + 1], cache, i) for i in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_training_cost_study_quick(tmp_path):
    from studies.retnet_training_cost import main

    result = main(["--quick", "--out", str(tmp_path / "cost.json")])
    assert {(r["mode"], r["length"]) for r in result["rows"]} == {(m, n) for m in ("parallel", "chunkwise")
                                                                  for n in (32, 64)}
    assert all(r["step_ms"] > 0 and r["peak_bytes"] > 0 for r in result["rows"]) and (tmp_path / "cost.json").is_file()
