"""The benchmark runner runs its smallest configurations (smoke tests, no timing asserts); the GPU check is the same
runner over a named set (its CPU dry run here), and every status is its suites' targets against stored numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo

from ..helpers import env_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.serial  # its plans need a table whose ceiling reaches the target: timing, never beside a worker
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_int8_depth_quick_times_five_forms_side_by_side_and_resumes(tmp_path, device):
    """The INT8 + depth suite on the smallest task: five forms timed in one session (speed-ups against the float32
    baseline), the INT8-table and float32-table plans really planned in those runtimes (onnxruntime's on the CPU,
    TensorRT's on a GPU), verdicts recomputed from the numbers, and a second run keeps what the first measured."""
    from studies.int8_depth import FORMS, NOISE_FACTOR, platform_of, result_path, runtimes_on

    kind, why_not = platform_of(device)
    if kind is None:
        pytest.skip(why_not)
    command = [sys.executable, "-m", "studies.int8_depth", "--quick", "--out", str(tmp_path / "out"),
               "--workdir", str(tmp_path / "work"), "--device", device]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = result_path(True, tmp_path / "out", kind)
    result = json.loads(path.read_text())
    ((model, row),) = result["models"].items()
    (seed,) = row["quality"]["seeds"]
    for session in (row["speed"]["session"], seed["session"]):
        assert set(session["ms"]) == set(FORMS) and all(ms > 0 for ms in session["ms"].values())
        for form, ms in session["ms"].items():
            assert session["speedup"][form] == pytest.approx(session["ms"]["fp32_baseline"] / ms)
    runtimes = runtimes_on(kind)
    for planner, runtime in runtimes.items():
        run = json.loads((Path(seed["runs"][planner]["dir"]) / "results.json").read_text())
        assert run["condition"]["runtime"] == runtime and set(run["runtimes"]) == set(runtimes.values())
        assert run["runtimes"][runtime]["chosen_here"] and 0 <= run["int8"]["pruned"]["metrics"]["val/acc1"] <= 100
    errors = row["speed"]["table_errors"]
    label = f"{model}: INT8 table's anchored mean error within the float32 table's"
    limit = max(errors["fp32"]["mean_error_anchored"],
                NOISE_FACTOR * max(errors["fp32"]["noise_floor"], errors["int8"]["noise_floor"]))
    assert result["verdicts"][label] == (errors["int8"]["mean_error_anchored"] <= limit)
    assert result["status"] in ("passed", "failed", "incomplete")
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{model} speed: kept (same inputs)" in again.stdout
    assert json.loads(path.read_text())["models"][model]["quality"]["seeds"] \
        == row["quality"]["seeds"]  # the seed's runs were not repeated


@pytest.mark.serial  # compares two estimators of one measured speed-up: timing, never beside a worker
def test_int8_decode_quick_measures_both_decoders_and_keeps_what_it_measured(tmp_path):
    """The INT8 decode suite on retnet_tiny: both decoders timed, each seed's perplexities recomputed here from its
    trained model, the statistics from the seeds, and a rerun keeps the finished parts (same inputs)."""
    import math

    import torch

    from studies.int8_decode import decode_perplexity

    command = [sys.executable, "-m", "studies.int8_decode", "--quick", "--out", str(tmp_path / "out"),
               "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "int8_decode_quick.json").read_text())
    speed = result["speed"]["retnet_tiny"]
    assert speed["weight_mb"]["int8"] < speed["weight_mb"]["fp32"] / 3  # 8-bit weights: a quarter, and scales
    assert speed["speedup"] == pytest.approx(speed["ms_per_token"]["fp32"] / speed["ms_per_token"]["int8"], rel=0.5)
    seeds = result["quality"]["seeds"]
    assert [s["seed"] for s in seeds] == [0, 1]
    for s in seeds:
        assert s["relative_increase"] == pytest.approx(s["ppl_int8"] / s["ppl_fp32"] - 1)
        assert s["ppl_int8"] != s["ppl_fp32"]  # the INT8 decoder is another computation
    mean = sum(s["relative_increase"] for s in seeds) / 2
    assert result["quality"]["statistics"]["mean_increase"] == pytest.approx(mean)
    model = zoo.load(json.loads((tmp_path / "work" / "retnet_tiny-seed0" / "results.json").read_text())[
        "checkpoint"]).eval()
    windows = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = model(windows, mode="parallel")  # teacher forcing through the decoder = the parallel form's loss
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), windows[:, 1:].flatten())
    assert decode_perplexity(model, windows, None) == pytest.approx(math.exp(loss.item()), rel=1e-4)
    label = "decode perplexity: relative increase with INT8 weights (upper 95 % bound over seeds)"
    assert result["verdicts"][label] == (result["quality"]["statistics"]["upper_95"] <= 0.02)
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=600)
    assert again.returncode == 0 and "speed retnet_tiny: kept (same inputs)" in again.stdout, again.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "int8_decode_quick.json").read_text())["quality"]["seeds"] == seeds
