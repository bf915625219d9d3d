"""RetNet inference cost vs context length, the shape of the paper's efficiency figures (training cost vs length:
``python -m studies.retnet_training_cost``).

Decode: per-token latency and cache memory of ``retnet_small`` (recurrent state, O(1) in the context) and of a
parameter-matched Transformer decoder as LLaMA builds it (rotary positions, RMS norms, SwiGLU FFN of 8/3 the width;
the same parameter count, depth and heads, its width sized to match) with a KV cache over
``scaled_dot_product_attention`` (O(context)), at context lengths 128 ... 8192. Each model is prefilled to every
context with its own parallel pass (RetNet: chunkwise); then every round times one decode step of each model at each
context in turn, so that drift hits all of them alike, and a ratio is the median of the per-round ratios.
RetNet's step is timed as ``generate`` runs it (:class:`zoo.models.retnet.RecurrentDecoder`:
preallocated state updated in place; on CUDA captured in a CUDA graph) and as the reference recurrent form
(``set_fast_step(False)``, the step before the fast path). Also: ATen operators per step (non-view operators
dispatched, counted with a dispatch mode), tokens/s of ``generate`` at batch 1 and 16, and the parallel form's
forward time against torchscale's parallel form with the same weights (when torchscale is installed).
Targets (CPU, one thread): step <= 1.0x the Transformer's at context 512 and <= 0.6x at 2,048; parallel form
<= 1.0x torchscale's at 512 and 2,048 tokens; fast step logits equal the reference step's to 1e-6.

    python -m benchmarks.retnet_decode            # full run (about 5 minutes on one CPU thread)
    python -m benchmarks.retnet_decode --quick    # smoke test (seconds)
"""

from __future__ import annotations

import copy
import functools
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import zoo
from benchmarks.common import (
    Budget,
    Check,
    CommandLine,
    count,
    judge,
    out_file,
    time_calls,
    verdicts,
    warm_up,
    within_budget,
)
from benchmarks.transformer import KVCacheTransformer, count_params, parameter_matched_transformer
from zoo.errors import run_command
from zoo.files import write_json
from zoo.models.retnet import RecurrentDecoder, RetNet

RESULTS = Path(__file__).resolve().parent / "results" / "retnet_decode.json"

FULL = dict(model="retnet_small", overrides={}, contexts=(128, 256, 512, 1024, 2048, 4096, 8192),
            warmup_s=1.0, rounds=400,
            generate=dict(batches=(1, 16), prompts=(128, 2048), new_tokens=64, repeats=3),
            parallel_lengths=(512, 2048),
            parallel_repeats=11)
QUICK = dict(model="retnet_tiny", overrides={"vocab_size": 64}, contexts=(16, 64), warmup_s=0.05, rounds=5,
             generate=dict(batches=(1, 2), prompts=(8,), new_tokens=4, repeats=1), parallel_lengths=(32,),
             parallel_repeats=1)
TARGETS = {"decode_ratio": {512: 1.0, 2048: 0.6}, "parallel_ratio": 1.0, "step_logits_max_abs_diff": 1e-6,
           # CUDA, batch 1: the graph-captured step vs the Transformer's and vs the reference eager step
           "cuda_decode_ratio": {128: 1.0}, "cuda_speedup_over_transformer": {8192: 3.0},
           "cuda_graph_speedup_over_reference": 5.0,
           "flatness": 1.2}  # the GPU check, every batch: RetNet ms per token at the longest context / the shortest


# -- measuring helpers ---------------------------------------------------------------------------------------


def cache_bytes(cache: list[Any]) -> int:
    """Bytes of a KV cache's keys and values (the rotary tables are not counted: any position code has them)."""
    return sum(t.numel() * t.element_size() for pair in cache[:-1] for t in pair)


class OperatorCount(TorchDispatchMode):
    """Counts the ATen operators dispatched inside it, views (metadata only) apart."""

    def __init__(self) -> None:
        super().__init__()
        self.compute, self.views = 0, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.is_view or func._schema.name in ("aten::t", "aten::_unsafe_view"):
            self.views += 1
        else:
            self.compute += 1
        return func(*args, **(kwargs or {}))


def count_operators(fn: Callable[[], Any]) -> int:
    """Non-view ATen operators one call of fn dispatches."""
    with OperatorCount() as counter:
        fn()
    return counter.compute


# -- decode --------------------------------------------------------------------------------------------------


def decode_steps(retnet: RetNet, transformer: KVCacheTransformer, context: int, batch: int, device: torch.device
                 ) -> tuple[dict[str, Callable[[], Any]], dict[str, int]]:
    """One decode step per model at `context` (after prefilling it), and the bytes each keeps per sequence set.

    ``retnet``: the step ``generate`` takes (graph-captured on CUDA); ``retnet_eager``: the same step without a
    graph (CUDA only); ``retnet_reference``: the reference recurrent form through the public API."""
    vocab = retnet.vocab_size
    token = torch.zeros(batch, 1, dtype=torch.long, device=device)
    prompt = torch.randint(0, vocab, (batch, context), device=device)
    _, state = retnet(prompt, mode="chunkwise", return_state=True)
    reference = copy.deepcopy(retnet)
    reference.set_fast_step(False)
    steps = {"retnet": functools.partial(retnet.decoder(state, batch), token),
             "retnet_reference": lambda: reference(token, mode="recurrent", state=state, return_state=True)}
    if device.type == "cuda":
        steps["retnet_eager"] = functools.partial(RecurrentDecoder(retnet, state, batch), token)
    cache = transformer.new_cache(batch, context + 1)
    transformer(prompt, cache, 0)
    steps["transformer"] = lambda: transformer(token, cache, context)
    memory = {name: state.nbytes() for name in steps} | {"transformer": cache_bytes(cache)}
    return steps, memory


@torch.inference_mode()
def bench_decode(retnet: RetNet, transformer: KVCacheTransformer, cfg: dict, device: torch.device,
                 batch: int) -> tuple[list[dict[str, Any]], dict[str, dict[int, float]]]:
    """Per-token latency at every context, and paired ratios. Every round times one call of each (model, context)
    in turn, so that the machine's drift hits all of them alike; a ratio is the median over rounds of the two
    models' times in the same round (robust to drift that a ratio of medians is not)."""
    steps: dict[tuple[str, int], Callable[[], Any]] = {}
    memory: dict[tuple[str, int], int] = {}
    for context in cfg["contexts"]:
        fns, sizes = decode_steps(retnet, transformer, context, batch, device)
        steps |= {(name, context): fn for name, fn in fns.items()}
        memory |= {(name, context): size for name, size in sizes.items()}
    warm_up(list(steps.values()), cfg["warmup_s"], device)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in steps}
    for _ in range(cfg["rounds"]):
        for key, step in steps.items():
            times[key] += time_calls(step, 1, device)
    rows = [{"model": name, "context": context, "ms_per_token": 1e3 * statistics.median(times[(name, context)]),
             "cache_bytes": memory[(name, context)]} for name, context in steps]
    pairs = {"retnet_over_transformer": ("retnet", "transformer"),
             "reference_over_retnet": ("retnet_reference", "retnet")}
    paired = {label: {c: statistics.median(x / y for x, y in zip(times[(a, c)], times[(b, c)]))
                      for c in cfg["contexts"]} for label, (a, b) in pairs.items()}
    return rows, paired


@torch.inference_mode()
def step_operators(retnet: RetNet, transformer: KVCacheTransformer, device: torch.device) -> dict[str, int]:
    """Non-view ATen operators of one decode step (batch 1, context 16) of each model."""
    steps, _ = decode_steps(retnet, transformer, 16, 1, device)
    if device.type == "cuda":  # a graph replay dispatches nothing: count the eager step (the graph records that
        steps["retnet"] = steps.pop("retnet_eager")  # step unpacked: a few operators more than counted here)
    return {name: count_operators(fn) for name, fn in steps.items()}


@torch.no_grad()
def step_agreement(retnet: RetNet, device: torch.device, context: int = 64, tokens: int = 16) -> dict[str, float]:
    """Max |logit| difference of the fast step (the decoder ``generate`` uses) against the reference recurrent step,
    over `tokens` consecutive steps after a prompt, in fp32 on `device`; and whether greedy ``generate`` agrees."""
    reference = copy.deepcopy(retnet)
    reference.set_fast_step(False)
    prompt = torch.randint(0, retnet.vocab_size, (2, context), device=device)
    _, state = retnet(prompt, mode="chunkwise", return_state=True)
    fast, slow = retnet.decoder(state, 2), reference.decoder(state, 2, decode="forward")
    token, worst = prompt[:, -1:], 0.0
    for _ in range(tokens):
        expected = slow(token)
        worst = max(worst, (fast(token).float() - expected.float()).abs().max().item())
        token = expected.argmax(-1, keepdim=True)
    greedy_equal = torch.equal(retnet.generate(prompt, tokens), reference.generate(prompt, tokens, decode="forward"))
    return {"step_logits_max_abs_diff": worst, "greedy_generate_equal": greedy_equal}


def bench_generate(retnet: RetNet, transformer: KVCacheTransformer, cfg: dict, device: torch.device
                   ) -> list[dict[str, Any]]:
    """New tokens per second of greedy ``generate`` (prefill included) at each batch and prompt length, the two
    models interleaved."""
    gen, rows = cfg["generate"], []
    for batch in gen["batches"]:
        for length in gen["prompts"]:
            prompt = torch.randint(0, retnet.vocab_size, (batch, length), device=device)
            calls = {"retnet": functools.partial(retnet.generate, prompt, gen["new_tokens"]),
                     "transformer": functools.partial(transformer.generate, prompt, gen["new_tokens"])}
            warm_up(list(calls.values()), cfg["warmup_s"], device)
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(gen["repeats"]):
                for name, call in calls.items():
                    times[name] += time_calls(call, 1, device)
            rows += [{"model": name, "batch": batch, "prompt": length, "new_tokens": gen["new_tokens"],
                      "tokens_per_s": batch * gen["new_tokens"] / statistics.median(times[name])} for name in calls]
    return rows


def torchscale_twin(model: RetNet) -> tuple[nn.Module, RetNet] | None:
    """torchscale's ``RetNetDecoder`` (parallel form) of `model`'s shapes, and a zoo RetNet holding its weights; None
    when torchscale is not installed."""
    try:
        from torchscale.architecture.config import RetNetConfig
        from torchscale.architecture.retnet import RetNetDecoder
    except ImportError:
        return None
    from zoo.models.retnet import torchscale_options, torchscale_state_dict

    config = RetNetConfig(decoder_embed_dim=model.dim, decoder_value_embed_dim=model.value_dim,
                          decoder_retention_heads=model.heads, decoder_ffn_embed_dim=model.ffn_dim,
                          decoder_layers=model.depth, vocab_size=model.vocab_size, activation_fn="swish",
                          chunkwise_recurrent=False)
    decoder = RetNetDecoder(config, embed_tokens=nn.Embedding(model.vocab_size, model.dim)).eval()
    state = decoder.state_dict()
    ours = RetNet(**torchscale_options(state)).eval()
    ours.load_state_dict(torchscale_state_dict(state))
    return decoder, ours


@torch.inference_mode()
def bench_parallel(model: RetNet, cfg: dict, device: torch.device) -> list[dict[str, Any]]:
    """Forward time of the parallel form, ours vs torchscale's with the same weights, one call each per round; the
    ratio is the median of the per-round ratios."""
    twin = torchscale_twin(model)
    if twin is None:
        return []
    theirs, ours = (m.to(device) for m in twin)
    rows = []
    for length in cfg["parallel_lengths"]:
        ids = torch.randint(0, ours.vocab_size, (1, length), device=device)
        calls = {"zoo": functools.partial(ours, ids), "torchscale": functools.partial(theirs, ids)}
        warm_up(list(calls.values()), cfg["warmup_s"], device)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(cfg["parallel_repeats"]):
            for name, call in calls.items():
                times[name] += time_calls(call, 1, device)
        zoo_ms, ts_ms = (1e3 * statistics.median(times[n]) for n in ("zoo", "torchscale"))
        ratio = statistics.median(a / b for a, b in zip(times["zoo"], times["torchscale"]))  # paired per round
        rows.append({"length": length, "zoo_ms": zoo_ms, "torchscale_ms": ts_ms, "ratio": ratio})
    return rows


# -- entry points --------------------------------------------------------------------------------------------


def run(quick: bool = False, device: str = "cpu", threads: int | None = None, batch: int = 1,
        model_kwargs: dict[str, Any] | None = None, out: str | None = None, gpu_check: bool = False,
        budget: Budget | None = None) -> dict[str, Any]:
    """Run the decode benchmarks; `quick` is a seconds-long smoke configuration.

    threads: torch threads (default: 1 on the CPU, where the targets are stated). model_kwargs: extra arguments of
    the RetNet (e.g. ``{"use_fla": False}`` for the PyTorch path on CUDA). out: a folder for ``retnet_decode.json``
    (``python -m benchmarks run`` passes its ``--out``; the JSON is written only when given). `gpu_check`: the
    batches form (:func:`run_batches`).
    """
    if gpu_check:
        return run_batches(quick, device, out, budget)
    previous_threads = torch.get_num_threads()
    device = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    torch.set_num_threads(threads or (1 if device == "cpu" else previous_threads))
    torch.set_flush_denormal(True)
    try:
        cfg = QUICK if quick else FULL
        cfg = {**cfg, "overrides": {**cfg["overrides"], **(model_kwargs or {})}}
        result = _run(cfg, quick, torch.device(device), batch)
        if out is not None:
            write_json(Path(out) / "retnet_decode.json", result)
        return result
    finally:  # leave the process as it was (the smoke test runs inside pytest)
        torch.set_flush_denormal(False)
        torch.set_num_threads(previous_threads)


def checks(result: dict[str, Any], device: str | None = None) -> list[Check]:
    """Each target against the measured numbers (None where not measured: skipped is not passed). The batches form
    (the GPU check): every batch's RetNet latency ratio longest/shortest context <= 1.2, and at batch 1 the targets
    of the device."""
    if result.get("form") == "batches":
        out = []
        for key, r in result["batches"].items():
            ratio = (r.get("latency_ratio_longest_to_shortest") or {}).get("retnet")
            out.append(Check(f"{key} RetNet latency ratio <= {TARGETS['flatness']}", ratio, "<=", TARGETS["flatness"]))
            if key == "batch_1":
                out += [c._replace(label=f"{key} {c.label}") for c in checks(r, result.get("device"))]
        return out
    rows = result.get("decode") or []
    device = result.get("device") or (rows[0].get("device") if rows else None) or device or "cpu"
    paired = {label: {int(c): v for c, v in ratios.items()} for label, ratios in
              (result.get("paired_ratios") or {}).items()}
    contexts = sorted({int(r["context"]) for r in rows})  # int keys also after a JSON round trip

    def ratio(label: str, context: int, inverse: bool = False) -> float | None:
        """A paired ratio (the median of the per-round ratios) at `context`; None where not measured."""
        value = paired.get(label, {}).get(context)
        return None if value is None else 1 / value if inverse else value

    out: list[Check] = []
    if device == "cpu":
        for context, limit in TARGETS["decode_ratio"].items():
            out.append(Check(f"decode step <= {limit}x the Transformer's at context {context}",
                             ratio("retnet_over_transformer", context), "<=", limit))
        lengths = {int(r["length"]): r["ratio"] for r in result.get("parallel") or []}
        for length in (512, 2048):
            out.append(Check(f"parallel form <= {TARGETS['parallel_ratio']}x torchscale's at {length} tokens",
                             lengths.get(length), "<=", TARGETS["parallel_ratio"]))
    else:
        for context, limit in TARGETS["cuda_decode_ratio"].items():
            out.append(Check(f"graph step <= {limit}x the Transformer's at context {context}",
                             ratio("retnet_over_transformer", context), "<=", limit))
        for context, limit in TARGETS["cuda_speedup_over_transformer"].items():
            out.append(Check(f"graph step >= {limit}x faster than the Transformer's at context {context}",
                             ratio("retnet_over_transformer", context, inverse=True), ">=", limit))
        limit = TARGETS["cuda_graph_speedup_over_reference"]
        speedups = [ratio("reference_over_retnet", c) for c in contexts]
        out.append(Check(f"graph step >= {limit}x faster than the reference eager step (every context)",
                         None if None in speedups or not speedups else min(speedups), ">=", limit))
    agreement = result.get("step_agreement") or {}
    out.append(Check(f"fast step logits within {TARGETS['step_logits_max_abs_diff']:g} of the reference step",
                     agreement.get("step_logits_max_abs_diff"), "<=", TARGETS["step_logits_max_abs_diff"]))
    out.append(Check("greedy generate equals the reference decode", agreement.get("greedy_generate_equal"), "==",
                     True))
    return out


def run_batches(quick: bool, device: str, out: str | None, budget: Budget | None) -> dict[str, Any]:
    """The GPU check's form: decode at batch 1 and 16 on the PyTorch path."""
    device = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    batches = (1,) if quick or device != "cuda" else (1, 16)

    def one(batch: int) -> dict[str, Any]:
        found = run(quick=quick, device=device, batch=batch, model_kwargs={"use_fla": False})
        return {k: v for k, v in found.items() if k not in ("verdicts", "status", "passed")}

    result = {"suite": "retnet_decode", "form": "batches", "device": device,
              "path": "PyTorch (use_fla=False; the fla suite compares the fused kernels)",
              "batches": within_budget(batches, lambda batch: f"batch_{batch}", one, budget)}
    if out is not None:
        write_json(Path(out) / "retnet_decode.json", result)
    return result


def _run(cfg: dict, quick: bool, dev: torch.device, batch: int) -> dict[str, Any]:
    torch.manual_seed(0)
    retnet = zoo.create_model(cfg["model"], **cfg["overrides"]).to(dev).eval()
    transformer = parameter_matched_transformer(retnet).to(dev).eval()
    env = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "dtype": "float32",
           "batch": batch, "threads": torch.get_num_threads(), "torch": torch.__version__}
    warm_up([lambda: retnet(retnet.example_input(batch, (16,)))], cfg["warmup_s"], dev)
    decode, paired = bench_decode(retnet, transformer, cfg, dev, batch)
    decode = [{**row, **env} for row in decode]
    ratios = {}
    for name in ("retnet", "transformer"):
        ms = {r["context"]: r["ms_per_token"] for r in decode if r["model"] == name}
        ratios[name] = ms[max(ms)] / ms[min(ms)]
    result = {
        "benchmark": "retnet_decode", "quick": quick, "model": cfg["model"], **env,
        "params": {"retnet": count_params(retnet), "transformer": count_params(transformer)},
        "transformer_shape": {"dim": transformer.dim, "heads": transformer.heads, "depth": len(transformer.attn),
                              "ffn_dim": transformer.ffn[0].up_proj.out_features},
        "decode": decode, "paired_ratios": paired, "latency_ratio_longest_to_shortest": ratios,
        "operators_per_step": step_operators(retnet, transformer, dev),
        "step_agreement": step_agreement(retnet, dev),
        "generate": [{**row, **env, "batch": row["batch"]} for row in bench_generate(retnet, transformer, cfg, dev)],
        "parallel": [{**row, **env} for row in bench_parallel(retnet, cfg, dev)],
    }
    judge("retnet_decode", result)
    result["passed"] = result["status"] == "passed"
    return result


def markdown(result: dict[str, Any]) -> str:
    """The result as markdown tables."""
    if result.get("form") == "batches":
        return "\n\n".join(f"#### {key}\n\n" + (f"skipped: {r['skipped']}" if "skipped" in r else markdown(r))
                           for key, r in result["batches"].items())
    env_cols = "device | dtype | batch | threads | torch"
    env = " | ".join(str(result[k]) for k in ("device", "dtype", "batch", "threads", "torch"))
    shape, params = result["transformer_shape"], result["params"]
    measured = {r["model"] for r in result["decode"]}
    names = [n for n in ("retnet", "retnet_eager", "retnet_reference") if n in measured]
    titles = {"retnet": "RetNet (generate's step)", "retnet_eager": "RetNet eager step",
              "retnet_reference": "RetNet reference step"}
    lines = [f"Decode, one token at a given context: {result['model']} ({params['retnet'] / 1e6:.2f} M parameters) vs "
             f"a parameter-matched KV-cache Transformer ({params['transformer'] / 1e6:.2f} M: width {shape['dim']}, "
             f"{shape['heads']} heads, FFN {shape['ffn_dim']}, {shape['depth']} layers); ms per token: the median "
             "of one call per round, every model and context in "
             "turn each round; the ratio: the median of the per-round ratios", "",
             f"| context | {' | '.join(titles[n] for n in names)} | Transformer | RetNet / Transformer (paired) | "
             f"RetNet state MiB | KV cache MiB | {env_cols} |",
             "|---:|" + "---:|" * (len(names) + 4) + "---|---|---:|---:|---|"]
    by_key = {(r["model"], r["context"]): r for r in result["decode"]}
    for context in sorted({r["context"] for r in result["decode"]}):
        tra = by_key[("transformer", context)]
        cells = " | ".join(f"{by_key[(n, context)]['ms_per_token']:.3f}" for n in names)
        lines.append(f"| {context} | {cells} | {tra['ms_per_token']:.3f} | "
                     f"{result['paired_ratios']['retnet_over_transformer'][context]:.2f} | "
                     f"{by_key[('retnet', context)]['cache_bytes'] / 2**20:.2f} | {tra['cache_bytes'] / 2**20:.2f} | "
                     f"{env} |")
    ratios, ops = result["latency_ratio_longest_to_shortest"], result["operators_per_step"]
    agreement = result["step_agreement"]
    lines += ["", f"Per-token latency ratio longest/shortest context: RetNet {ratios['retnet']:.2f}, "
              f"Transformer {ratios['transformer']:.2f}. ATen operators per step (non-view): "
              + ", ".join(f"{titles.get(n, n)} {c}" for n, c in ops.items())
              + f". Fast step vs reference step: max |logit difference| {agreement['step_logits_max_abs_diff']:.1e} "
              f"over 16 steps; greedy generate equal: {agreement['greedy_generate_equal']}."]
    gen = result["generate"]
    if gen:
        lines += ["", f"Greedy generate, new tokens per second ({gen[0]['new_tokens']} new tokens, the prompt's "
                  "prefill included)", "", "| batch | prompt | RetNet tokens/s | Transformer tokens/s | ratio |",
                  "|---:|---:|---:|---:|---:|"]
        by_gen = {(r["model"], r["batch"], r["prompt"]): r["tokens_per_s"] for r in gen}
        for batch, length in sorted({(r["batch"], r["prompt"]) for r in gen}):
            ret, tra = by_gen[("retnet", batch, length)], by_gen[("transformer", batch, length)]
            lines.append(f"| {batch} | {length} | {ret:.0f} | {tra:.0f} | {ret / tra:.2f} |")
    if result["parallel"]:
        lines += ["", "Parallel form forward (batch 1), ours vs torchscale's RetNetDecoder with the same weights", "",
                  "| tokens | zoo ms | torchscale ms | ratio (paired) |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['length']} | {r['zoo_ms']:.1f} | {r['torchscale_ms']:.1f} | {r['ratio']:.2f} |"
                  for r in result["parallel"]]
    lines += ["", "Targets: " + "; ".join(f"{k}: {'passed' if v else 'not measured' if v is None else 'FAILED'}"
                                          for k, v in verdicts(checks(result)).items()) + "."]
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.retnet_decode", __doc__)
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test configuration")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=count, default=None,
                        help="torch threads (default 1 on the CPU, the most stable on a shared machine)")
    parser.add_argument("--batch", type=count, default=1)
    parser.add_argument("--out", type=out_file, default=RESULTS, help="JSON result file")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = command_line().parse_args(argv)
    result = run(quick=args.quick, device=args.device, threads=args.threads, batch=args.batch)
    write_json(args.out, result)
    print(markdown(result))
    print(f"\nwritten to {args.out}")
    return result


if __name__ == "__main__":
    raise SystemExit(run_command(main))
