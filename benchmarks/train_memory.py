"""Training memory per family: activation memory with and without gradient checkpointing and bf16 autocast, the
largest batch that fits a budget, the throughput cost of checkpointing, and what depth pruning saves.

Activation memory is counted exactly and the same on every device: the bytes of the distinct storages autograd keeps
for the backward pass at the end of the forward pass (``torch.autograd.graph.saved_tensors_hooks``), measured at two
batch sizes, so that memory(batch) = fixed + per_sample x batch. Peak training memory adds the weights, their gradients
and AdamW's two moments (4 x the parameter bytes); on CUDA the peak allocated memory of a real step is measured too.
The throughput cost is the time of a training step (forward, backward) with checkpointing against without,
interleaved in rounds on one thread. The pruned network removes every other removable block (a stand-in for a
searched plan: what depth pruning does to memory).

The models: the reference member of every declared family whose models can checkpoint (``set_grad_checkpointing``).
Targets (issue 18), for every family that declares the ``grad_checkpointing`` capability (TResNet-M and BiT-50x1
today): checkpointing (every block, or the first half) cuts the activation memory by >= 40 % at <= 35 % throughput
cost; outputs with and without checkpointing are identical (tests/unit/test_features.py).

    python -m benchmarks.train_memory [--quick] [--device cpu] [--budget-gb 16]

In the GPU check (``python -m benchmarks run --set gpu_check``) only the targeted families run, at 224 px, batches 16
and 32, in an 80 GB budget, with CUDA's peak allocated memory beside the counted activations.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import torch
from torch import nn

import zoo
from benchmarks.common import (
    Budget,
    Check,
    CommandLine,
    environment,
    families,
    family_of,
    interleaved,
    judge,
    markdown_table,
    out_folder,
    positive,
    verdicts,
    write_result,
)
from zoo.errors import run_command
from zoo.latency import resolve_device
from zoo.models.registry import model_class

SETTINGS = {False: "", 0.5: "_ckpt_half", True: "_ckpt"}  # set_grad_checkpointing: none, the first half, all
TARGET_REDUCTION, TARGET_COST = 0.40, 0.35
SETTING_NAMES = {"ckpt": "every block", "ckpt_half": "the first half"}
TARGETED = "grad_checkpointing"  # the capability whose families the targets are for


def models(targeted_only: bool = False) -> list[str]:
    """The reference member of every family whose models can checkpoint (only the targeted ones if asked)."""
    return [f.reference for f in families(TARGETED if targeted_only else None)
            if hasattr(model_class(f.reference), "set_grad_checkpointing")]


def example(model: nn.Module, batch: int, size: int, device: torch.device) -> torch.Tensor:
    if getattr(model, "task", "") == "language_model":
        return torch.randint(0, model.vocab_size, (batch, size), device=device)
    return torch.randn(batch, 3, size, size, device=device)


def activation_bytes(model: nn.Module, x: torch.Tensor, bf16: bool) -> int:
    """Bytes of the distinct storages autograd saves for backward during one training forward pass (parameters
    excluded; a tensor saved by several operations, or views of one storage, count once)."""
    from zoo.models.features import saved_storage_bytes

    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, nn.Parameter):
            storages.update(saved_storage_bytes(tensor))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def train_step(model: nn.Module, bf16: bool):
    """A callable: one forward and backward pass of `model` on its argument (gradients dropped after)."""
    def step(x: torch.Tensor) -> None:
        with torch.inference_mode(False), torch.enable_grad():  # the timing harness times inference by default
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
        model.zero_grad(set_to_none=True)
    return step


def cuda_peak_mb(model: nn.Module, x: torch.Tensor, bf16: bool) -> float | None:
    if x.device.type != "cuda":
        return None
    torch.cuda.synchronize(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    train_step(model, bf16)(x)
    torch.cuda.synchronize(x.device)
    return torch.cuda.max_memory_allocated(x.device) / 2**20


RSS_SCRIPT = """
import sys, torch, zoo
from zoo.training.resources import peak_rss_mb
name, size, batch, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
lm = zoo.get_entry(name).task == "language_model"
model = zoo.create_model(name).train()
model.set_grad_checkpointing({"none": False, "half": 0.5, "all": True}[ckpt])
x = torch.randint(0, model.vocab_size, (batch, size)) if lm else torch.randn(batch, 3, size, size)
before = peak_rss_mb()
model(x).float().pow(2).mean().backward()
print(before, peak_rss_mb())
"""


def resident_step_mb(name: str, size: int, batch: int, ckpt: str) -> dict[str, float]:
    """Peak resident memory (MB, as the OS counts it) of a fresh process before and after one training step: the
    CPU's own measure of what the step needs."""
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, name, str(size), str(batch), ckpt], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"resident-memory step of {name} failed: {proc.stderr[-2000:]}")
    before, after = (float(v) for v in proc.stdout.split()[-2:])
    return {"before_mb": round(before, 1), "peak_mb": round(after, 1), "step_mb": round(after - before, 1)}


def every_other_block(model: nn.Module, size: int) -> dict[str, Any]:
    shape = (size,) if getattr(model, "task", "") == "language_model" else (3, size, size)
    removable = [u.name for u in zoo.depth_units(model, input_size=shape) if u.kind in ("block", "retention", "ffn")
                 and u.removable]
    return {"remove": removable[::2], "merge": False}


def measure(name: str, size: int, batches: tuple[int, int], budget_gb: float, device: torch.device,
            time_it: bool, quick: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    lm = zoo.get_entry(name).task == "language_model"
    model = zoo.create_model(name, **({} if lm else {"num_classes": 1000})).to(device).train()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = 4 * param_bytes  # weights, gradients, AdamW's two moments
    pruned = zoo.apply_plan(model, every_other_block(model, size), inplace=False).train()
    row: dict[str, Any] = {"model": name, "input": size, "params_m": round(param_bytes / 4 / 1e6, 2),
                           "state_mb": round(state_bytes / 2**20, 1)}
    for label, net in (("", model), ("pruned_", pruned)):
        for bf16 in (False, True):
            for ckpt in SETTINGS:
                net.set_grad_checkpointing(ckpt)
                small, large = (activation_bytes(net, example(net, b, size, device), bf16) for b in batches)
                per_sample = (large - small) / (batches[1] - batches[0])
                fixed = max(small - per_sample * batches[0], 0.0)
                key = f"{label}{'bf16' if bf16 else 'fp32'}{SETTINGS[ckpt]}"
                row[f"{key}_act_mb_per_sample"] = round(per_sample / 2**20, 3)
                budget = budget_gb * 2**30 - state_bytes - fixed
                row[f"{key}_max_batch"] = int(budget // per_sample) if per_sample > 0 and budget > 0 else 0
                peak = cuda_peak_mb(net, example(net, batches[1], size, device), bf16)
                if peak is not None:
                    row[f"{key}_cuda_peak_mb_b{batches[1]}"] = round(peak, 1)
        net.set_grad_checkpointing(False)
    row["ckpt_reduction"] = 1 - row["fp32_ckpt_act_mb_per_sample"] / row["fp32_act_mb_per_sample"]
    row["ckpt_half_reduction"] = 1 - row["fp32_ckpt_half_act_mb_per_sample"] / row["fp32_act_mb_per_sample"]
    row["pruned_reduction"] = 1 - row["pruned_fp32_act_mb_per_sample"] / row["fp32_act_mb_per_sample"]
    row["pruned_blocks_removed"] = len(every_other_block(model, size)["remove"])
    if device.type == "cpu" and not quick:  # resident memory of a training step, each in a fresh process
        for ckpt in ("none", "half", "all"):
            row[f"rss_{ckpt}_b{batches[1]}"] = resident_step_mb(name, size, batches[1], ckpt)
    if time_it:
        steps = {}
        for ckpt, suffix in SETTINGS.items():
            net = zoo.create_model(name, **({} if lm else {"num_classes": 1000})).to(device).train()
            net.load_state_dict(model.state_dict())
            net.set_grad_checkpointing(ckpt)
            steps[suffix or "plain"] = train_step(net, False)
        x = example(model, batches[1], size, device)
        timed = interleaved(steps, [x], device, warmup_s=0.5 if quick else 2.0, rounds=3 if quick else 7,
                            runs_per_round=1, max_time_s=60 if quick else 900)
        row["step_ms"] = timed["plain"]["median_ms"]
        for suffix in ("_ckpt", "_ckpt_half"):
            row[f"{suffix[1:]}_step_ms"] = timed[suffix]["median_ms"]
            row[f"{suffix[1:]}_cost"] = timed[suffix]["median_ms"] / row["step_ms"] - 1
    return row


def best_setting(row: dict[str, Any]) -> str:
    """The checkpointing setting a row is judged on: the first that meets both targets, else every block."""
    for key in SETTING_NAMES:
        cost = row.get(f"{key}_cost")
        if row[f"{key}_reduction"] >= TARGET_REDUCTION and cost is not None and cost <= TARGET_COST:
            return key
    return "ckpt"


def checks(result: dict[str, Any]) -> list[Check]:
    """For every family declaring ``grad_checkpointing`` (None where its row is missing or skipped): the activation
    memory checkpointing saves (>= 40 %) and its step-time cost (<= 35 %), of the setting that meets both if one
    does."""
    rows = {family_of(r["model"]).name: r for r in result["rows"]}
    out = []
    for family in families(TARGETED):
        row = rows.get(family.name, {"model": family.reference, "skipped": "not in this result"})
        key = "ckpt" if "skipped" in row else best_setting(row)
        name = f"{row['model']} checkpointing {SETTING_NAMES[key]}"
        out += [Check(f"{name}: activation memory saved", row.get(f"{key}_reduction"), ">=", TARGET_REDUCTION),
                Check(f"{name}: step-time cost", row.get(f"{key}_cost"), "<=", TARGET_COST)]
    return out


def run(quick: bool = False, device: str = "auto", out: str | None = None, budget_gb: float = 16.0,
        gpu_check: bool = False, budget: Budget | None = None) -> dict[str, Any]:
    """Every checkpointing family (`gpu_check`: the targeted ones at the GPU check's sizes; past `budget`: skipped)."""
    dev = resolve_device(device)
    torch.set_num_threads(1)
    budget_gb = 80.0 if gpu_check else budget_gb
    targeted = set(models(targeted_only=True))
    rows = []
    for name in models(targeted_only=gpu_check):
        lm = zoo.get_entry(name).task == "language_model"
        size = 64 if quick else (256 if lm else 224)
        batches = ((1, 2) if quick else (16, 32)) if gpu_check else ((1, 2) if quick else (2, 4))
        if budget is not None and not budget.allows():
            rows.append({"model": name, "skipped": budget.reason()})
            continue
        rows.append(measure(name, size, batches, budget_gb, dev, time_it=gpu_check or name in targeted or not quick,
                            quick=quick or (gpu_check and dev.type != "cuda")))
    result = {"suite": "train_memory", "environment": environment(dev, torch.float32, 4 if not quick else 2, 1),
              "budget_gb": budget_gb, "quick": quick, "rows": rows,
              "targets": {"ckpt_reduction_min": TARGET_REDUCTION, "ckpt_cost_max": TARGET_COST}}
    judge("train_memory", result)
    write_result("train_memory" + ("_quick" if quick else ""), result, out)
    return result


def resident_text(row: dict[str, Any]) -> str:
    """The resident-memory growth of one training step with no, half and full checkpointing ('-' if not measured)."""
    steps = [next((v["step_mb"] for k, v in row.items() if k.startswith(f"rss_{c}_")), None)
             for c in ("none", "half", "all")]
    return "-" if steps[0] is None else " / ".join(f"{v:.0f}" for v in steps)


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for r in result["rows"]:
        if "skipped" in r:
            continue
        rows.append({"model": r["model"], "input": r["input"], "fp32 MB/sample": r["fp32_act_mb_per_sample"],
                     "ckpt": r["fp32_ckpt_act_mb_per_sample"], "bf16": r["bf16_act_mb_per_sample"],
                     "bf16+ckpt": r["bf16_ckpt_act_mb_per_sample"],
                     "ckpt saves / cost": f"{100 * r['ckpt_reduction']:.0f} % / " + (
                         "-" if r.get("ckpt_cost") is None else f"{100 * r['ckpt_cost']:+.0f} %"),
                     "half ckpt saves / cost": f"{100 * r['ckpt_half_reduction']:.0f} % / " + (
                         "-" if r.get("ckpt_half_cost") is None else f"{100 * r['ckpt_half_cost']:+.0f} %"),
                     f"max batch in {result['budget_gb']:g} GB (fp32 / ckpt / bf16+ckpt)":
                         f"{r['fp32_max_batch']} / {r['fp32_ckpt_max_batch']} / {r['bf16_ckpt_max_batch']}",
                     "pruned saves": f"{100 * r['pruned_reduction']:.0f} % ({r['pruned_blocks_removed']} blocks)",
                     "RSS of a step, MB (none / half / all)": resident_text(r)})
    table = markdown_table(rows, list(rows[0])) if rows else "(no rows measured)"
    lines = [f"- {r['model']}: skipped, {r['skipped']}" for r in result["rows"] if "skipped" in r]
    judged = verdicts(checks(result))
    for row in result["rows"]:
        if "skipped" in row or not family_of(row["model"]).has(TARGETED):
            continue
        parts = []
        for key, label in SETTING_NAMES.items():
            cost = row.get(f"{key}_cost")
            parts.append(f"{label} saves {100 * row[f'{key}_reduction']:.0f} % at "
                         f"{'-' if cost is None else f'{100 * cost:+.0f} %'} step time")
        met = [v for k, v in judged.items() if k.startswith(f"{row['model']} ")]
        word = "passed" if met and all(met) else "not met"
        lines.append(f"- {row['model']}: {'; '.join(parts)}: **{word}** (target: >= 40 % less activation memory at "
                     f"<= 35 % more step time, with either setting)")
    env = result["environment"]
    note = " ".join([
        "Activation memory per sample is the bytes of the distinct storages autograd keeps for backward",
        "(counted exactly by saved_tensors_hooks, the same on any device); the largest batch adds the weights,",
        f"gradients and AdamW state (4 x the parameters). Step times: {env['device']}, {env['threads']} thread,",
        "interleaved rounds (median). 'ckpt' checkpoints every block, 'half' the first half (the highest",
        "resolutions). 'RSS of a step': how much a fresh process's peak resident memory grows over one training",
        "step at the larger batch (gradients and the allocator included, so it falls less than the activations).",
        "GPU rows: the GPU check's train_memory (python -m benchmarks run --set gpu_check; CUDA peak memory too)."])
    return table + "\n\n" + note + "\n\n" + "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.train_memory", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    parser.add_argument("--budget-gb", type=positive, default=16.0)
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, args.device, args.out, args.budget_gb)))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
