"""flash-linear-attention's fused retention kernels against our PyTorch path (CUDA only; skipped, not passed,
without CUDA or without ``fla``): outputs and latency of the chunkwise forward (model level, retnet_small, 4 x 2048
tokens) and of the recurrent kernel on one token and on 64 tokens (op level); TF32 as the likely source of
differences. Target: the chunkwise forward faster than the PyTorch path.

    python -m benchmarks run fla --device cuda
"""

from __future__ import annotations

from typing import Any

import torch

import zoo
from benchmarks.common import Check, families, rel_diff, write_result
from zoo.latency import measure


def run(quick: bool = False, device: str = "cuda", out: str | None = None) -> dict[str, Any]:
    from zoo.models.retnet.ops import fla_kernels

    if device != "cuda":
        result: dict[str, Any] = {"suite": "fla", "skipped": "flash-linear-attention needs CUDA"}
    elif fla_kernels() is None:
        result = {"suite": "fla", "skipped": "flash-linear-attention is not installed"}
    else:
        result = {"suite": "fla", **compare(quick)}
    write_result("fla", result, out)
    return result


@torch.inference_mode()
def compare(quick: bool) -> dict[str, Any]:
    import fla

    from zoo.models.retnet.ops import retention_fla, retention_recurrent

    torch.manual_seed(0)
    name = next(f.small if quick else f.reference for f in families(capability="decode"))
    ours = zoo.create_model(name, use_fla=False).cuda().eval()
    fused = zoo.create_model(name, use_fla=True).cuda().eval()
    fused.load_state_dict(ours.state_dict())
    batch, length = (2, 256) if quick else (4, 2048)
    ids = torch.randint(0, ours.vocab_size, (batch, length), device="cuda")
    (a, state_a), (b, state_b) = (m(ids, mode="chunkwise", return_state=True) for m in (ours, fused))
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        a_tf32 = ours(ids, mode="chunkwise")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    settings = {"warmup_s": 1.0, "max_time_s": 5.0, "rel_tol": 0.02, "memory": False}
    out: dict[str, Any] = {
        "model": name, "fla_version": getattr(fla, "__version__", "?"), "batch": batch, "length": length,
        "chunkwise_logits_rel_diff": rel_diff(b, a), "torch_tf32_vs_fp32_logits_rel_diff": rel_diff(a_tf32, a),
        "chunkwise_state_rel_diff": rel_diff(torch.stack(state_b.layers), torch.stack(state_a.layers)),
        "chunkwise_torch_ms": measure(lambda: ours(ids, mode="chunkwise"), (), "cuda", **settings).median_ms,
        "chunkwise_fla_ms": measure(lambda: fused(ids, mode="chunkwise"), (), "cuda", **settings).median_ms}
    out["chunkwise_speedup"] = out["chunkwise_torch_ms"] / out["chunkwise_fla_ms"]
    layer = ours.blocks[0].retention
    log_gamma = layer.constant("log_gamma", torch.device("cuda"), torch.float32)
    state = torch.randn(batch, layer.heads, layer.key_dim, layer.value_dim, device="cuda")
    for tokens in (1, 64):
        q, k = (torch.randn(batch, layer.heads, tokens, layer.key_dim, device="cuda") for _ in range(2))
        v = torch.randn(batch, layer.heads, tokens, layer.value_dim, device="cuda")
        ref, fast = retention_recurrent(q, k, v, log_gamma, state), retention_fla(q, k, v, log_gamma, state, True)
        torch_ms = measure(lambda q=q, k=k, v=v: retention_recurrent(q, k, v, log_gamma, state), (), "cuda",
                           **settings).median_ms
        fla_ms = measure(lambda q=q, k=k, v=v: retention_fla(q, k, v, log_gamma, state, True), (), "cuda",
                         **settings).median_ms
        out[f"recurrent_{tokens}_tokens"] = {"out_rel_diff": rel_diff(fast[0], ref[0]),
                                             "state_rel_diff": rel_diff(fast[1], ref[1]), "torch_ms": torch_ms,
                                             "fla_ms": fla_ms, "speedup": torch_ms / fla_ms}
    return out


def checks(result: dict[str, Any]) -> list[Check]:
    return [Check("chunkwise forward faster than the PyTorch path", result.get("chunkwise_speedup"), ">", 1.0)]


def markdown(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    lines = [f"fla {result['fla_version']}, {result.get('model', 'retnet_small')}, {result['batch']} x "
             f"{result['length']} tokens: chunkwise {result['chunkwise_fla_ms']:.1f} ms vs "
             f"{result['chunkwise_torch_ms']:.1f} ms ({result['chunkwise_speedup']:.2f}x), logits rel diff "
             f"{result['chunkwise_logits_rel_diff']:.1e} (torch TF32 vs fp32: "
             f"{result['torch_tf32_vs_fp32_logits_rel_diff']:.1e})"]
    for tokens in (1, 64):
        r = result.get(f"recurrent_{tokens}_tokens")
        if r:
            lines.append(f"recurrent kernel, {tokens} token(s): {r['speedup']:.2f}x, out rel diff "
                         f"{r['out_rel_diff']:.1e}")
    return "\n".join(lines)
