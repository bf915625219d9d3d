"""RetNet's training cost vs sequence length: a forward + backward + AdamW step in the parallel and the chunkwise
form, its time and its peak memory (``torch.cuda.max_memory_allocated`` on CUDA; on the CPU the bytes of the tensors
autograd saves for backward, the activation memory that grows with length).

    python -m studies.retnet_training_cost [--quick] [--device cpu|cuda] [--out FILE]
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import zoo
from benchmarks.common import (
    CommandLine,
    count,
    out_file,
    time_calls,
    warm_up,
)
from zoo.errors import run_command
from zoo.files import write_json
from zoo.models.retnet import RetNet

FULL = dict(model="retnet_small", overrides={}, lengths=(256, 512, 1024, 2048, 4096), warmup_s=1.0, repeats=3)
QUICK = dict(model="retnet_tiny", overrides={"vocab_size": 64}, lengths=(32, 64), warmup_s=0.05, repeats=1)


def _saved_tensor_bytes(step: Callable[[], None]) -> int:
    """Bytes of the distinct storages autograd saves for backward during `step`'s forward."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


def bench_train(model: RetNet, cfg: dict, device: torch.device, batch: int) -> list[dict[str, Any]]:
    rows = []
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    for length in cfg["lengths"]:
        ids = torch.randint(0, model.vocab_size, (batch, length + 1), device=device)
        for mode in ("parallel", "chunkwise"):
            def step(mode=mode, ids=ids):
                logits = model(ids[:, :-1], mode=mode)
                loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            warm_up([step], min(cfg["warmup_s"], 0.2), device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                step()
                peak, method = torch.cuda.max_memory_allocated(device), "cuda max_memory_allocated"
            else:
                peak, method = _saved_tensor_bytes(step), "bytes saved for backward"
            seconds = statistics.median(time_calls(step, cfg["repeats"], device))
            rows.append({"mode": mode, "length": length, "chunk_size": model.chunk_size, "step_ms": 1e3 * seconds,
                         "peak_bytes": peak, "memory": method})
    model.eval()
    return rows


def command_line() -> CommandLine:
    parser = CommandLine("studies.retnet_training_cost", __doc__)
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test configuration")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=count, default=1)
    parser.add_argument("--out", type=out_file, default=Path("retnet_training_cost.json"), help="JSON result file")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = command_line().parse_args(argv)
    cfg = QUICK if args.quick else FULL
    device = torch.device(args.device)
    torch.set_num_threads(1) if device.type == "cpu" else None
    torch.manual_seed(0)
    model = zoo.create_model(cfg["model"], **cfg["overrides"]).to(device)
    result = {"study": "retnet_training_cost", "model": cfg["model"], "device": str(device), "batch": args.batch,
              "torch": torch.__version__, "rows": bench_train(model, cfg, device, args.batch)}
    write_json(args.out, result)
    for row in result["rows"]:
        mib = row["peak_bytes"] / 2**20
        print(f"{row['mode']:>9} {row['length']:>6} tokens: {row['step_ms']:.1f} ms, {mib:.1f} MiB")
    return result


if __name__ == "__main__":
    raise SystemExit(run_command(main))
