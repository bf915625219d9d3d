"""Training throughput of the engine (``zoo.training.Trainer``) vs a minimal hand-written PyTorch loop.

Same model architecture and initial weights, same ``data=synthetic`` loader and batch, same optimizer
family (AdamW) and loss. The two are measured side by side, interleaved in rounds (order alternating)
after a warm-up counted in seconds, with denormals flushed; the ratio is of the median samples/s and,
as a robustness check, the median of the per-round ratios. Target: ratio >= 0.95.

    python -m benchmarks.train_throughput [--quick] [--device cpu] [--out PATH]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import Check, CommandLine, out_file
from zoo.errors import run_command
from zoo.files import write_json
from zoo.latency.device import synchronize

RESULTS = Path(__file__).resolve().parent / "results" / "train_throughput.json"
MODEL = "mobilenetv2_050"
TARGET = 0.95


def _config(batch: int, batches: int, image_size: int, device: str) -> Any:
    from omegaconf import OmegaConf

    from zoo.jobs.train_config import TrainConfig

    cfg = OmegaConf.structured(TrainConfig)
    cfg.data.name, cfg.data.image_size, cfg.data.batch_size = "synthetic", image_size, batch
    cfg.data.num_samples, cfg.data.num_classes = batch * batches, 10
    cfg.trainer.device, cfg.trainer.progress, cfg.trainer.max_epochs = device, False, 1000
    cfg.trainer.save_checkpoints, cfg.optim.sched, cfg.optim.warmup_epochs = False, "none", 0
    return cfg


def hand_loop(model: nn.Module, optimizer: torch.optim.Optimizer, loader: Any, device: torch.device) -> int:
    """One epoch of the plainest PyTorch training loop; returns samples seen."""
    criterion = nn.CrossEntropyLoss()
    model.train()
    seen = 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        loss = criterion(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        seen += inputs.shape[0]
    return seen


def _timed(fn: Any, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def run(quick: bool = False, device: str = "cpu", batch: int = 64, image_size: int = 32) -> dict[str, Any]:
    """Measure engine vs hand-loop samples/s; returns the numbers and the setting."""
    import zoo
    from zoo.training import Trainer, build_loaders

    torch.set_flush_denormal(True)
    batches, rounds, warmup_s = (4, 3, 1.0) if quick else (20, 9, 8.0)
    cfg = _config(batch, batches, image_size, device)
    data = build_loaders(cfg.data, seed=0)
    torch.manual_seed(0)
    engine_model = zoo.create_model(MODEL, num_classes=10)
    loop_model = zoo.create_model(MODEL, num_classes=10)
    loop_model.load_state_dict(engine_model.state_dict())
    trainer = Trainer(engine_model, data, cfg.optim, cfg.trainer)
    dev = trainer.device
    loop_model.to(dev)
    optimizer = torch.optim.AdamW(loop_model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    samples = batches * batch

    def engine_epoch() -> None:
        trainer.batch_in_epoch = 0
        trainer.train_one_epoch()

    def loop_epoch() -> None:
        hand_loop(loop_model, optimizer, data.train, dev)

    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        engine_epoch()
        loop_epoch()
    engine_rates, loop_rates = [], []
    for index in range(rounds):
        pair = (engine_epoch, loop_epoch) if index % 2 == 0 else (loop_epoch, engine_epoch)
        times = {fn: _timed(fn, dev) for fn in pair}
        engine_rates.append(samples / times[engine_epoch])
        loop_rates.append(samples / times[loop_epoch])
    engine, loop = statistics.median(engine_rates), statistics.median(loop_rates)
    return {
        "model": MODEL, "data": "synthetic", "device": str(dev), "dtype": "float32", "batch": batch,
        "image_size": image_size, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "batches_per_round": batches, "rounds": rounds, "warmup_s": warmup_s, "quick": quick,
        "engine_samples_per_s": round(engine, 2), "loop_samples_per_s": round(loop, 2),
        "ratio": round(engine / loop, 4),
        "ratio_median_per_round": round(statistics.median(e / lp for e, lp in zip(engine_rates, loop_rates)), 4),
        "engine_rates": [round(r, 2) for r in engine_rates], "loop_rates": [round(r, 2) for r in loop_rates],
        "target": TARGET,
    }


def checks(result: dict[str, Any]) -> list[Check]:
    return [Check("engine / hand-written loop, samples/s", result["ratio"], ">=", TARGET)]


def markdown(result: dict[str, Any]) -> str:
    head = ("| model | device | dtype | batch | threads | torch | engine samples/s | hand loop samples/s | ratio "
            "| ratio (median per round) |")
    rule = "|" + "---|" * 10
    row = (f"| {result['model']} {result['image_size']}px | {result['device']} | {result['dtype']} | {result['batch']} "
           f"| {result['threads']} | {result['torch']} | {result['engine_samples_per_s']:.1f} "
           f"| {result['loop_samples_per_s']:.1f} | {result['ratio']:.3f} | {result['ratio_median_per_round']:.3f} |")
    return "\n".join([head, rule, row])


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.train_throughput", __doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds instead of about a minute")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    parser.add_argument("--out", type=out_file, default=RESULTS, help=f"JSON output (default {RESULTS})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = command_line().parse_args(argv)
    result = run(quick=args.quick, device=args.device)
    write_json(args.out, result)
    print(markdown(result))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
