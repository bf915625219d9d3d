"""Where a measured latency table changes a transformers LM's plan, and where it does not (issue 61).

A homogeneous decoder's layers cost nearly the same, so a plan could be read off a layer count. This builds
``prune.py``'s own latency table (:func:`zoo.jobs.final_timing.build_job_table`, whole networks timed in context) for
each packaged tiny config (``hf/tiny_llama``, ``tiny_qwen2``, ``tiny_gpt2``, ``tiny_gemma2``: 6 layers; Gemma-2
alternates sliding-window and full attention) in three workloads: the prefill of 64 tokens, and one decode step
after 64 and after 192 tokens in the model's KV cache. Per table it reports each layer's saving when removed
whole, how far the savings spread (against the noise of the records they come from), the share of the network that
no removal touches (embeddings, final norm, LM head), and for each target (1.3x, 1.5x) the whole layers the table
needs against what a count of layers predicts (``ceil(L (1 - 1/target))``, as if the layers were the whole network).
Computed per table: ``counting_misjudges`` (the count asks for fewer layers than the measured table needs) and
``layers_differ`` (the spread of savings beyond twice the records' noise; where it is not, which layers go is the
quality's choice alone). Random weights (a latency does not depend on them); batch 1, one thread.

Then the output a user serves (``stock``): per family, the whole layers its prefill table needs for 1.5x removed
from the zoo model, written by ``save_stock`` as a stock folder (reloaded by ``AutoModelForCausalLM`` with the pruned
model's logits, or refused), and the stock original and the stock pruned model timed side by side in plain
transformers, no zoo code in the loop: the prefill of 64 tokens, and decoding 16 tokens one at a time after a
64-token prompt in transformers' own ``DynamicCache`` (the cache grows as it does when serving). Reported beside the
zoo tables' predicted speed-ups of the same plan; ``within_noise``: the stock speed-up within twice the measured
noise of the prediction.

    python -m studies.hf_layer_costs --out results     # about 8 minutes on 2 cores
    python -m studies.hf_layer_costs --quick            # one family, the prefill and one decode table (a smoke)
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.common import CommandLine, compose, machine, out_folder, results_dir, write_result
from zoo.errors import run_command

FAMILIES = ("tiny_llama", "tiny_qwen2", "tiny_gpt2", "tiny_gemma2")
WORKLOADS = (("forward", 64), ("decode", 64), ("decode", 192))
TARGETS = (1.3, 1.5)
TABLE = "++prune.table={warmup_s: 0.5, min_rounds: 10, max_rounds: 30}"


def layer_costs(family: str, workload: str, context: int, cache: Path) -> dict[str, Any]:
    """One table's facts (module docstring)."""
    import zoo
    from zoo.jobs.final_timing import build_job_table

    cfg = compose(["model=hf", f"model.name={family}", "data=bytes", f"data.seq_len={context}",
                   f"prune.workload={workload}", "prune.batch_size=1", "prune.threads=1", "prune.device=cpu",
                   f"prune.cache_dir={cache}", TABLE], cache / "runs")
    model = zoo.create_model(cfg.model.name).eval()
    table = build_job_table(cfg, model, SimpleNamespace(input_size=(context,)))
    whole = [(i, seg) for i, seg in enumerate(table.segments) if seg.removable]
    savings = [table.raw_cost(i, frozenset()) - table.raw_cost(i, frozenset({seg.name})) for i, seg in whole]
    noise = statistics.median(r["iqr_ms"] / r["median_ms"] for r in table.rows() if r["median_ms"] > 0)
    total = table.predict({"remove": []}, corrected=False)
    spread = (max(savings) - min(savings)) / statistics.mean(savings)
    kinds = getattr(model.lm.config, "layer_types", None)
    plans = {}
    for target in TARGETS:
        budget = total - total / target
        needed, saved = 0, 0.0
        for saving in sorted(savings, reverse=True):  # the fewest whole layers that reach the target
            if saved >= budget:
                break
            needed, saved = needed + 1, saved + saving
        counted = math.ceil(len(savings) * (1 - 1 / target) - 1e-9)
        plans[str(target)] = {"needed_by_table": needed if saved >= budget else None, "by_count": counted,
                              "counting_misjudges": saved < budget or counted < needed}
    by_kind = None
    if kinds:
        by_kind = {kind: round(statistics.mean(s for s, k in zip(savings, kinds) if k == kind), 5)
                   for kind in sorted(set(kinds))}
    return {"family": family, "workload": workload, "context": context, "network_ms": round(total, 5),
            "fixed_share": round(table.fixed_cost(corrected=False) / total, 4),
            "layer_savings_ms": [round(s, 5) for s in savings], "savings_by_layer_type": by_kind,
            "spread": round(spread, 4), "record_noise": round(noise, 4), "layers_differ": spread > 2 * noise,
            "plans": plans}


STOCK_TARGET, PROMPT, DECODED, ROUNDS = 1.5, 64, 16, 15


def _timed(step: Any, rounds: list[list[float]], index: int) -> None:
    started = time.perf_counter()
    step()
    rounds[index].append(time.perf_counter() - started)


def stock_speed(family: str, rows: list[dict[str, Any]], folder: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """The stock folders' own speed (module docstring), for the whole layers `rows`' prefill table needs."""
    import transformers

    import zoo

    forward = next(r for r in rows if r["family"] == family and r["workload"] == "forward")
    decode = next(r for r in rows if r["family"] == family and r["workload"] == "decode" and r["context"] == PROMPT)
    model = zoo.create_model(f"hf/{family}").eval()
    layers = [u.name for u in model.depth_unit_specs() if u.kind == "block"]
    order = sorted(range(len(layers)), key=lambda i: -forward["layer_savings_ms"][i])
    drop = sorted(order[:forward["plans"][str(STOCK_TARGET)]["needed_by_table"] or 1])
    plan = {"remove": [layers[i] for i in drop]}
    model.lm.save_pretrained(folder / "original")
    pruned = zoo.apply_plan(model, plan, inplace=False).eval()
    _, error = pruned.save_stock(folder / "pruned")
    nets = [transformers.AutoModelForCausalLM.from_pretrained(folder / name).eval() for name in ("original", "pruned")]
    prompt = torch.randint(0, model.lm.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    prefill, decoding = [[], []], [[], []]
    with torch.no_grad():
        for _ in range(rounds + 2):  # two rounds of warm-up, dropped
            for i, net in enumerate(nets):
                _timed(lambda net=net: net(prompt, use_cache=False), prefill, i)
                cache = transformers.DynamicCache(config=net.config)
                out = net(prompt, past_key_values=cache, use_cache=True)
                token = out.logits[:, -1:].argmax(-1)

                def steps(net=net, cache=cache, token=token) -> None:
                    for position in range(PROMPT, PROMPT + DECODED):
                        logits = net(token, past_key_values=cache, use_cache=True,
                                     position_ids=torch.tensor([[position]])).logits
                        token = logits[:, -1:].argmax(-1)
                _timed(steps, decoding, i)
    measured = {}
    for name, times, row in (("prefill", prefill, forward), ("decode", decoding, decode)):
        base, cut = (statistics.median(t[2:]) for t in times)
        spread = [statistics.quantiles(t[2:], n=4) for t in times]
        noise = math.hypot(*((q[2] - q[0]) / statistics.median(t[2:]) for q, t in zip(spread, times)))
        predicted = round(row["network_ms"] / (row["network_ms"] - sum(row["layer_savings_ms"][i] for i in drop)), 4)
        speedup, noise = round(base / cut, 4), round(noise, 4)
        measured[name] = {"original_ms": round(1e3 * base, 4), "pruned_ms": round(1e3 * cut, 4),
                          "stock_speedup": speedup, "table_predicted_speedup": predicted, "noise": noise,
                          "within_noise": abs(speedup / predicted - 1) <= 2 * noise}
    return {"family": family, "plan": plan, "layers": len(layers), "logits_rel_diff": error, **measured}


def run(out: str | None = None, quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    families, workloads = (FAMILIES[:1], WORKLOADS[:2]) if quick else (FAMILIES, WORKLOADS)
    with tempfile.TemporaryDirectory() as cache:
        rows = [layer_costs(family, workload, context, Path(cache))
                for family in families for workload, context in workloads]
        stock = [stock_speed(family, rows, Path(cache) / "stock" / family, 3 if quick else ROUNDS)
                 for family in families]
    result = {"suite": "hf_layer_costs_quick" if quick else "hf_layer_costs", "targets": list(TARGETS),
              "machine": machine("cpu"), "rows": rows,
              "counting_misjudges": sum(any(p["counting_misjudges"] for p in r["plans"].values()) for r in rows),
              "layers_differ": sum(r["layers_differ"] for r in rows), "tables": len(rows), "stock": stock,
              "stock_faster": sum(s["prefill"]["stock_speedup"] > 1 and s["decode"]["stock_speedup"] > 1
                                  for s in stock)}
    write_result(result["suite"], result, out)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = ["| family | workload | context | network ms | fixed share | layer savings spread | record noise | "
             "differ | 1.3x: table / count | 1.5x: table / count |", "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    for r in result["rows"]:
        plans = [f"{p['needed_by_table']} / {p['by_count']}" for p in r["plans"].values()]
        lines.append(f"| {r['family']} | {r['workload']} | {r['context']} | {r['network_ms']:.3f} | "
                     f"{100 * r['fixed_share']:.0f} % | {100 * r['spread']:.0f} % | {100 * r['record_noise']:.0f} % | "
                     f"{r['layers_differ']} | {plans[0]} | {plans[1]} |")
    lines.append(f"\ncounting misjudges the layers needed in {result['counting_misjudges']} of {result['tables']} "
                 f"tables; the layers' savings differ beyond noise in {result['layers_differ']}.\n")
    lines += ["| family | layers removed | logits diff | prefill: stock / predicted | decode: stock / predicted |",
              "|---|---|---:|---|---|"]
    for s in result.get("stock", []):
        cells = [f"{s[w]['stock_speedup']:.2f}x / {s[w]['table_predicted_speedup']:.2f}x "
                 f"({'within' if s[w]['within_noise'] else 'beyond'} noise {100 * s[w]['noise']:.0f} %)"
                 for w in ("prefill", "decode")]
        lines.append(f"| {s['family']} | {len(s['plan']['remove'])} of {s['layers']} | {s['logits_rel_diff']:.1e} | "
                     f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("studies.hf_layer_costs", __doc__)
    parser.add_argument("--out", type=out_folder, default=None)
    parser.add_argument("--quick", action="store_true", help="one family, the prefill and one decode table")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.out, args.quick)))
    print(f"result: {results_dir(args.out)}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
