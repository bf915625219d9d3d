"""Zoo vs timm: eval latency of the same architecture with the same weights, eager and fused, side by side.

``python -m benchmarks.zoo_vs_timm [--device cpu|cuda] [--batch-sizes 1 32] [--quick]``. Target: eager ratio
zoo/timm <= 1.05, the fused (deploy) form faster than timm's eager model. The models: the reference member of every
family declaring the ``timm`` capability (``--quick``: the smoke model).
"""

from __future__ import annotations

from typing import Any

import timm
import torch

import zoo
from benchmarks.common import (
    Check,
    CommandLine,
    count,
    environment,
    families,
    interleaved,
    markdown_table,
    out_folder,
    smoke_model,
    write_result,
)
from zoo.errors import run_command

EAGER_LIMIT, FUSED_LIMIT = 1.05, 1.0


def compare(name: str, batch: int, size: int, device: str, threads: int, rounds: int) -> dict[str, Any]:
    """One row: timm eager, zoo eager and zoo fused on identical weights and input, interleaved."""
    torch.manual_seed(0)
    reference = timm.create_model(name).eval()
    ours = zoo.create_model(name)
    ours.load_state_dict(reference.state_dict())
    ours.eval()
    fused = zoo.fuse(ours)
    x = torch.randn(batch, 3, size, size)
    dev = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    nets = {"timm": reference.to(dev), "zoo": ours.to(dev), "zoo_fused": fused.to(dev)}
    with torch.no_grad():
        diff = (nets["timm"](x.to(dev)) - nets["zoo"](x.to(dev))).abs().max().item()
    stats = interleaved(nets, (x.to(dev),), device=dev, threads=threads, rounds=rounds,
                        runs_per_round=3 if batch > 1 else 5)
    t, z, f = (stats[k]["median_ms"] for k in ("timm", "zoo", "zoo_fused"))
    return {"model": name, "size": size, **environment(dev, torch.float32, batch, threads),
            "timm_ms": t, "zoo_ms": z, "zoo_fused_ms": f, "eager_ratio": z / t, "fused_ratio": f / t,
            "noise_timm": stats["timm"]["rel_uncertainty"], "max_abs_logit_diff": diff}


def run(quick: bool = False, device: str = "auto", batch_sizes: tuple[int, ...] = (1, 32), threads: int = 1,
        out: str | None = None) -> dict[str, Any]:
    models = [smoke_model("timm")] if quick else [f.reference for f in families("timm")]
    sizes = (1,) if quick else batch_sizes
    rows = [compare(m, b, 64 if quick else 224, device, threads, rounds=2 if quick else 12)
            for m in models for b in sizes]
    result = {"suite": "zoo_vs_timm", "rows": rows}
    write_result("zoo_vs_timm", result, out)
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    """Per row: zoo eager / timm eager <= 1.05; zoo fused / timm eager < 1."""
    out = []
    for r in result["rows"]:
        out += [Check(f"{r['model']} b{r['batch']}: zoo eager / timm eager", r["eager_ratio"], "<=", EAGER_LIMIT),
                Check(f"{r['model']} b{r['batch']}: zoo fused / timm eager", r["fused_ratio"], "<", FUSED_LIMIT)]
    return out


def markdown(result: dict[str, Any]) -> str:
    return markdown_table(result["rows"], ["model", "batch", "timm_ms", "zoo_ms", "zoo_fused_ms", "eager_ratio",
                                           "fused_ratio", "device", "dtype", "threads", "torch"])


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.zoo_vs_timm", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    parser.add_argument("--batch-sizes", type=count, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, args.device, tuple(args.batch_sizes), args.threads, args.out)))

if __name__ == "__main__":
    raise SystemExit(run_command(main))
