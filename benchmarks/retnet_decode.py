"""RetNet inference and training cost vs context length, the shape of the paper's efficiency figures.

Decode: per-token latency and cache memory of ``retnet_small`` (recurrent state, O(1) in the context) and of
a Transformer decoder of the same width, depth, heads and FFN with a KV cache over
``scaled_dot_product_attention`` (O(context)), at context lengths 128 ... 8192. Each model is prefilled to every
context with its own parallel pass (RetNet: chunkwise), then one decode step at each context is timed many
times, in blocks interleaved over contexts and models so that drift hits all of them alike.
Training: forward + backward + AdamW step of RetNet in the parallel and the chunkwise form vs length; peak
memory is ``torch.cuda.max_memory_allocated`` on CUDA and, on CPU, the bytes of the tensors autograd saves
for backward (the activation memory that grows with length).

    python -m benchmarks.retnet_decode            # full run (~5 min on 2 CPU cores)
    python -m benchmarks.retnet_decode --quick    # smoke test (seconds)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.latency.device import synchronize
from zoo.retnet import GatedFFN, RetNet, RMSNorm

RESULTS = Path(__file__).resolve().parent / "results" / "retnet_decode.json"

FULL = dict(model="retnet_small", overrides={}, contexts=(128, 256, 512, 1024, 2048, 4096, 8192),
            train_lengths=(256, 512, 1024, 2048, 4096), warmup_s=1.0, steps=20, blocks=6, train_repeats=3)
QUICK = dict(model="retnet_tiny", overrides={"vocab_size": 64}, contexts=(16, 64), train_lengths=(32, 64),
             warmup_s=0.05, steps=5, blocks=1, train_repeats=1)


# -- the baseline: a Transformer decoder with a KV cache -----------------------------------------------------


class CachedAttention(nn.Module):
    """Pre-norm residual causal self-attention writing its keys and values into a preallocated cache."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], pos: int) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        k_cache, v_cache = cache
        k_cache[:, :, pos : pos + length] = k
        v_cache[:, :, pos : pos + length] = v
        end = pos + length
        if pos == 0:  # prefill: causal attention inside the prompt
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # decode: the new tokens attend to everything cached
            out = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end])
        return x + self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))


class KVCacheTransformer(nn.Module):
    """Decoder-only Transformer with RetNet's width, depth, heads, SwiGLU FFN and norms (no position code:
    it does not change the cost)."""

    def __init__(self, vocab_size: int, dim: int, depth: int, heads: int, ffn_dim: int):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.embed = nn.Embedding(vocab_size, dim)
        self.attn = nn.ModuleList(CachedAttention(dim, heads) for _ in range(depth))
        self.ffn = nn.ModuleList(GatedFFN(dim, ffn_dim, 1e-6) for _ in range(depth))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)

    def new_cache(self, batch: int, capacity: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        like = self.embed.weight
        shape = (batch, self.heads, capacity, self.dim // self.heads)
        return [(like.new_zeros(shape), like.new_zeros(shape)) for _ in self.attn]

    def forward(self, ids: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], pos: int) -> torch.Tensor:
        x = self.embed(ids)
        for attn, ffn, layer_cache in zip(self.attn, self.ffn, cache):
            x = ffn(attn(x, layer_cache, pos))
        return self.lm_head(self.norm(x))


def transformer_like(model: RetNet) -> KVCacheTransformer:
    return KVCacheTransformer(model.vocab_size, model.dim, model.depth, model.heads, model.ffn_dim)


# -- timing helpers ------------------------------------------------------------------------------------------


def time_calls(fn: Callable[[], Any], count: int, device: torch.device) -> list[float]:
    """Seconds of `count` separate calls of fn."""
    times = []
    for _ in range(count):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def warm_up(fns: list[Callable[[], Any]], seconds: float, device: torch.device) -> None:
    """Call the functions in turn for at least `seconds` (a time-based warm-up, not a count)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for fn in fns:
            fn()
    synchronize(device)


def cache_bytes(cache: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for pair in cache for t in pair)


# -- decode --------------------------------------------------------------------------------------------------


@torch.inference_mode()
def bench_decode(retnet: RetNet, transformer: KVCacheTransformer, cfg: dict, device: torch.device,
                 batch: int) -> list[dict[str, Any]]:
    """Per-token latency at every context, timed in interleaved blocks over contexts and models, so that a drift
    of the machine's speed hits every context alike (the claim is a ratio between contexts)."""
    vocab = retnet.vocab_size
    token = torch.zeros(batch, 1, dtype=torch.long, device=device)
    steps: dict[tuple[str, int], Callable[[], Any]] = {}
    memory: dict[tuple[str, int], int] = {}
    for context in cfg["contexts"]:
        prompt = torch.randint(0, vocab, (batch, context), device=device)
        _, state = retnet(prompt, mode="chunkwise", return_state=True)
        cache = transformer.new_cache(batch, context + 1)
        transformer(prompt, cache, 0)
        steps[("retnet", context)] = lambda state=state: retnet(token, mode="recurrent", state=state,
                                                                 return_state=True)
        steps[("transformer", context)] = lambda cache=cache, context=context: transformer(token, cache, context)
        memory[("retnet", context)], memory[("transformer", context)] = state.nbytes(), cache_bytes(cache)
    warm_up(list(steps.values()), cfg["warmup_s"], device)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in steps}
    for _ in range(cfg["blocks"]):
        for key, step in steps.items():
            times[key] += time_calls(step, cfg["steps"], device)
    return [{"model": name, "context": context, "ms_per_token": 1e3 * statistics.median(times[(name, context)]),
             "cache_bytes": memory[(name, context)]} for name, context in steps]


# -- training ------------------------------------------------------------------------------------------------


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
    for length in cfg["train_lengths"]:
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
            seconds = statistics.median(time_calls(step, cfg["train_repeats"], device))
            rows.append({"mode": mode, "length": length, "chunk_size": model.chunk_size, "step_ms": 1e3 * seconds,
                         "peak_bytes": peak, "memory": method})
    model.eval()
    return rows


# -- entry points --------------------------------------------------------------------------------------------


def run(quick: bool = False, device: str = "cpu", threads: int | None = None, batch: int = 1, train: bool = True,
        model_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the decode (and, with `train`, the training) benchmarks; `quick` is a seconds-long smoke configuration.

    model_kwargs: extra arguments of the RetNet (e.g. ``{"use_fla": False}`` for the PyTorch path on CUDA).
    """
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    try:
        cfg = QUICK if quick else FULL
        cfg = {**cfg, "overrides": {**cfg["overrides"], **(model_kwargs or {})}}
        return _run(cfg, quick, torch.device(device), batch, train)
    finally:  # leave the process as it was (the smoke test runs inside pytest)
        torch.set_flush_denormal(False)
        torch.set_num_threads(previous_threads)


def _run(cfg: dict, quick: bool, dev: torch.device, batch: int, train: bool = True) -> dict[str, Any]:
    torch.manual_seed(0)
    retnet = zoo.create_model(cfg["model"], **cfg["overrides"]).to(dev).eval()
    transformer = transformer_like(retnet).to(dev).eval()
    env = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "dtype": "float32",
           "batch": batch, "threads": torch.get_num_threads(), "torch": torch.__version__}
    warm_up([lambda: retnet(retnet.example_input(batch, (16,)))], cfg["warmup_s"], dev)
    decode = [{**row, **env} for row in bench_decode(retnet, transformer, cfg, dev, batch)]
    train_rows = [{**row, **env} for row in bench_train(retnet, cfg, dev, batch)] if train else []
    ratios = {}
    for name in ("retnet", "transformer"):
        ms = {r["context"]: r["ms_per_token"] for r in decode if r["model"] == name}
        ratios[name] = ms[max(ms)] / ms[min(ms)]
    return {
        "benchmark": "retnet_decode", "quick": quick, "model": cfg["model"], **env,
        "params": {"retnet": sum(p.numel() for p in retnet.parameters()),
                   "transformer": sum(p.numel() for p in transformer.parameters())},
        "decode": decode, "train": train_rows, "latency_ratio_longest_to_shortest": ratios,
    }


def markdown(result: dict[str, Any]) -> str:
    """The result as markdown tables."""
    env_cols = "device | dtype | batch | threads | torch"
    env = " | ".join(str(result[k]) for k in ("device", "dtype", "batch", "threads", "torch"))
    lines = [f"Decode, one token at a given context ({result['model']} vs a KV-cache Transformer of the same shape)",
             "", f"| context | RetNet ms/token | Transformer ms/token | RetNet state MiB | KV cache MiB | {env_cols} |",
             "|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
    by_key = {(r["model"], r["context"]): r for r in result["decode"]}
    for context in sorted({r["context"] for r in result["decode"]}):
        ret, tra = by_key[("retnet", context)], by_key[("transformer", context)]
        lines.append(f"| {context} | {ret['ms_per_token']:.3f} | {tra['ms_per_token']:.3f} | "
                     f"{ret['cache_bytes'] / 2**20:.2f} | {tra['cache_bytes'] / 2**20:.2f} | {env} |")
    ratios = result["latency_ratio_longest_to_shortest"]
    lines += ["", f"Per-token latency ratio longest/shortest context: RetNet {ratios['retnet']:.2f}, "
              f"Transformer {ratios['transformer']:.2f}."]
    if not result["train"]:
        return "\n".join(lines)
    lines += ["", f"Training step (forward + backward + AdamW), RetNet parallel vs chunkwise (chunk "
              f"{result['train'][0]['chunk_size']}); memory: {result['train'][0]['memory']}", "",
              f"| length | parallel ms | chunkwise ms | parallel MiB | chunkwise MiB | {env_cols} |",
              "|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
    by_key = {(r["mode"], r["length"]): r for r in result["train"]}
    for length in sorted({r["length"] for r in result["train"]}):
        par, chk = by_key[("parallel", length)], by_key[("chunkwise", length)]
        lines.append(f"| {length} | {par['step_ms']:.0f} | {chk['step_ms']:.0f} | {par['peak_bytes'] / 2**20:.1f} | "
                     f"{chk['peak_bytes'] / 2**20:.1f} | {env} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test configuration")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is the most stable on a shared CPU)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON result file")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, device=args.device, threads=args.threads, batch=args.batch)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    print(f"\nwritten to {args.out}")
    return result


if __name__ == "__main__":
    main()
