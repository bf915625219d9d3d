"""A removed sub-layer's ops, and its block's latency, with its zeros folded away and without.

``python -m benchmarks.zero_folding [--quick] [--threads 1] [--rounds 15]``. Per architecture (discovered from timm,
no weights, at its own input size), the first removable sub-layer of the middle block is removed, and the block is
measured three ways on its own input, interleaved: intact, removed with its zeros left in (the removal as it was:
zeros, pass-throughs, the ops carrying them, the addition of zeros) and removed and folded
(:mod:`zoo.pruning.folding`, as ``apply_plan`` builds it). The unfolded block is timed twice (A/A): the
difference between its two copies is the noise floor. Op counts are the ATen calls of ``torch.export``'s graph.

Targets, per architecture: the folded block has fewer ops than the unfolded one, no zeros op and one addition fewer;
it is not slower than the unfolded block beyond the noise floor. "faster" is claimed only beyond the noise floor.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

import zoo
from benchmarks.common import (
    Check,
    CommandLine,
    count,
    environment,
    interleaved,
    markdown_table,
    out_folder,
    write_result,
)
from zoo.errors import run_command
from zoo.models.depth import zero_branch
from zoo.pruning.folding import block_inputs
from zoo.pruning.surgery import _block_of

ARCHS = [("deit_tiny_patch16_224", 224), ("swin_tiny_patch4_window7_224", 224), ("poolformerv2_s12", 224)]
QUICK = [("deit_tiny_patch16_224", 64)]


def _ops(module: torch.nn.Module, args: tuple, kwargs: dict) -> list[str]:
    graph = torch.export.export(module.eval(), args, kwargs, strict=False).graph
    return [str(n.target) for n in graph.nodes if n.op == "call_function"]


def row(arch: str, size: int, threads: int, rounds: int) -> dict[str, Any]:
    """One architecture: the middle block's first removable sub-layer, intact / zeros left / folded."""
    torch.manual_seed(0)
    options = {"img_size": size} if size != 224 else {}
    model = zoo.create_model(f"timm/{arch}", **options).eval()
    specs = model.depth_unit_specs()
    blocks = [u.name for u in specs if u.kind == "block"]
    subs = [u for u in specs if u.kind == "sublayer" and u.removable]
    middle = blocks[len(blocks) // 2]
    unit = next((u for u in subs if _block_of(u.name, blocks) == middle), subs[0])
    block = _block_of(unit.name, blocks)
    args, kwargs = block_inputs(model, [block], model.example_input(1))[block]
    intact = model.get_submodule(block)
    unfolded = copy.deepcopy(intact).eval()
    zero_branch(unfolded, [p[len(block) + 1:] for p in unit.merge])
    folded = zoo.apply_plan(model, {"remove": [unit.name]}, inplace=False).get_submodule(block).eval()
    with torch.no_grad():
        same = torch.equal(unfolded(*args, **kwargs), folded(*args, **kwargs))
    ops = {name: _ops(m, args, kwargs) for name, m in (("intact", intact), ("unfolded", unfolded), ("folded", folded))}
    nets = {"intact": intact, "unfolded": unfolded, "unfolded_again": copy.deepcopy(unfolded), "folded": folded}
    stats = interleaved({k: functools.partial(m, **kwargs) for k, m in nets.items()}, args,
                        threads=threads, rounds=rounds, runs_per_round=20)
    ms = {k: stats[k]["median_ms"] for k in nets}
    noise = abs(ms["unfolded_again"] / ms["unfolded"] - 1)
    return {"arch": arch, "size": size, "block": block, "sublayer": unit.name, "folded": type(folded).__name__,
            "equal_outputs": same, **{f"ops_{k}": len(v) for k, v in ops.items()},
            "zeros_ops_folded": sum("zeros" in op for op in ops["folded"]),
            "adds_unfolded": sum(".add" in op for op in ops["unfolded"]),
            "adds_folded": sum(".add" in op for op in ops["folded"]),
            **{f"ms_{k}": round(v, 4) for k, v in ms.items()}, "folded_over_unfolded": ms["folded"] / ms["unfolded"],
            "noise_floor": noise, "rel_uncertainty": max(stats[k]["rel_uncertainty"] for k in nets),
            **environment(torch.device("cpu"), torch.float32, 1, threads)}


def run(quick: bool = False, threads: int = 1, rounds: int = 15, out: str | None = None) -> dict[str, Any]:
    rows = [row(arch, size, threads, 3 if quick else rounds) for arch, size in (QUICK if quick else ARCHS)]
    for r in rows:
        ratio, noise = r["folded_over_unfolded"], r["noise_floor"]
        r["speed"] = "faster" if ratio < 1 - noise else "slower" if ratio > 1 + noise else "tie"
    result = {"suite": "zero_folding", "quick": quick, "rows": rows}
    write_result("zero_folding", result, out)
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    out = []
    for r in result["rows"]:
        out += [Check(f"{r['arch']}: folded equals unfolded", r["equal_outputs"], "==", True),
                Check(f"{r['arch']}: ops folded < unfolded", r["ops_folded"], "<", r["ops_unfolded"]),
                Check(f"{r['arch']}: zeros ops left", r["zeros_ops_folded"], "==", 0),
                Check(f"{r['arch']}: additions folded", r["adds_folded"], "==", r["adds_unfolded"] - 1),
                Check(f"{r['arch']}: folded / unfolded latency within the noise floor or below",
                      r["folded_over_unfolded"], "<=", 1 + r["noise_floor"])]
    return out


def markdown(result: dict[str, Any]) -> str:
    return markdown_table(result["rows"], ["arch", "size", "sublayer", "ops_intact", "ops_unfolded", "ops_folded",
                                           "ms_intact", "ms_unfolded", "ms_folded", "folded_over_unfolded",
                                           "noise_floor", "speed", "threads"])


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.zero_folding", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--rounds", type=count, default=15)
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, args.threads, args.rounds, args.out)))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
