"""Retention's maths (the "ops" of :mod:`zoo.models.retnet`): pure functions on ``[batch, heads, time, dim]`` tensors.

Decays (gamma_h per head), rotary tables, and the three forms of retention (parallel per block, chunkwise,
recurrent), plus flash-linear-attention's kernels where they apply. The tables are made once per length, device
and dtype and shared by every layer and call. The forms and why they agree are explained in :mod:`zoo.models.retnet`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from typing import Any

import torch


def decay_logs(heads: int, variant: str = "torchscale") -> list[float]:
    """log(gamma_h) per head: ``torchscale`` gamma_h = 1 - 2^(-5-h); ``linspace`` the paper's experiments."""
    if variant == "torchscale":
        return [math.log1p(-(2.0 ** (-5 - h))) for h in range(heads)]
    if heads == 1:
        return [math.log1p(-1 / 32)]
    lo, hi = math.log(1 / 32), math.log(1 / 512)
    return [math.log1p(-math.exp(lo + (hi - lo) * h / (heads - 1))) for h in range(heads)]


def rotary_frequencies(dim: int, theta: float = 10000.0, rope: str = "torchscale") -> torch.Tensor:
    """Signed angular frequency of each of `dim` features (fp64), so that ``sin`` of the angles is the signed sine
    that :func:`rotate` needs while ``cos`` (even) is unchanged.

    ``torchscale``: interleaved pairs (x0, x1), (x2, x3), ...; pair i turns at theta^(-i / (dim/2 - 1)) and its first
    feature carries the minus sign. ``neox`` (rotate-half, as flash-linear-attention and GPT-NeoX): feature i and
    i + dim/2 form a pair turning at theta^(-2i / dim); the first half carries the minus sign.
    """
    if rope == "neox":
        inv_freq = theta ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        return torch.cat((-inv_freq, inv_freq))
    inv_freq = theta ** -torch.linspace(0, 1, dim // 2, dtype=torch.float64)
    return torch.stack((-inv_freq, inv_freq), dim=-1).flatten()


def rotary_tables(positions: torch.Tensor, frequencies: torch.Tensor, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) of the rotary angles at `positions`, [T, dim]; the angles are computed in fp64 (no
    length limit) and the tables rounded to `dtype`."""
    angles = positions.to(torch.float64)[:, None] * frequencies[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def swap_halves(x: torch.Tensor, rope: str) -> torch.Tensor:
    """Each feature's rotary partner in its place: (x1, x0, x3, x2, ...) for ``torchscale``, (second half, first
    half) for ``neox``."""
    if rope == "neox":
        return x.roll(x.shape[-1] // 2, dims=-1)
    return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: str = "torchscale") -> torch.Tensor:
    """Rotary rotation of each pair (a, b) to (a cos - b sin, b cos + a sin), with the tables of
    :func:`rotary_tables` for the same `rope` layout (see :func:`rotary_frequencies`)."""
    return (x * cos + swap_halves(x, rope) * sin).contiguous()  # a no-op for one token; the matmuls want rows


def decay_matrix(log_gamma: torch.Tensor, n: int) -> torch.Tensor:
    """D[h, i, j] = gamma_h^(i-j) for i >= j, else 0: shape [heads, n, n]."""
    idx = torch.arange(n, device=log_gamma.device)
    distance = idx[:, None] - idx[None, :]
    exponent = distance.to(log_gamma.dtype) * log_gamma[:, None, None]
    return exponent.masked_fill(distance < 0, float("-inf")).exp()


TABLE_CACHE_BYTES = 64 * 2**20  # the largest decay matrix kept between calls (at most 4 of them are kept)


def decay_tables(log_decays: tuple[float, ...], n: int, device: torch.device, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decays of a block of n tokens: D [H, n, n] (:func:`decay_matrix`), the state's age at each row
    gamma^(i+1) [H, n, 1], each key's age at the end gamma^(n-1-j) [H, n, 1], and gamma^n [H, 1, 1]. Made once per
    (n, device, dtype) and shared by every layer and call while D is at most ``TABLE_CACHE_BYTES`` (building D for
    every layer cost more than the retention matmuls at 2,048 tokens); larger ones are made per call."""
    if len(log_decays) * n * n * dtype.itemsize > TABLE_CACHE_BYTES:
        return _decay_tables(log_decays, n, device, dtype)
    return _cached_decay_tables(log_decays, n, device, dtype)


def _decay_tables(log_decays: tuple[float, ...], n: int, device: torch.device, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable with and without autograd
        log_gamma = torch.tensor(log_decays, dtype=torch.float64).to(device=device, dtype=dtype)
        steps = torch.arange(n, device=device, dtype=dtype)
        query = ((steps[None, :] + 1) * log_gamma[:, None]).exp()[..., None]
        key = ((n - 1 - steps[None, :]) * log_gamma[:, None]).exp()[..., None]
        return decay_matrix(log_gamma, n), query, key, (n * log_gamma).exp()[:, None, None]


_cached_decay_tables = functools.lru_cache(maxsize=4)(_decay_tables)


@functools.lru_cache(maxsize=8)
def rotary_cache(dim: int, theta: float, rope: str, offset: int, n: int, device: torch.device, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rotary_tables` of positions offset ... offset + n - 1, shared by every layer (and by the next call of
    the same length and offset)."""
    with torch.inference_mode(False), torch.no_grad():
        positions = torch.arange(offset, offset + n, dtype=torch.float64, device=device)
        return rotary_tables(positions, rotary_frequencies(dim, theta, rope).to(device), dtype)


def retention_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decays: Sequence[float], state: torch.Tensor | None,
    need_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Retention over one block of n tokens that follows `state`: the parallel form plus the state's share.

    q, k: [B, H, n, d_k]; v: [B, H, n, d_v]; state: [B, H, d_k, d_v] or None (zeros). Returns (out [B, H, n, d_v],
    the new state, or None unless `need_state`).
    """
    decay, query_decay, key_decay, block_decay = decay_tables(tuple(log_decays), q.shape[2], q.device, q.dtype)
    out = (q @ k.transpose(-1, -2)).mul_(decay) @ v
    if state is not None:
        out = out + (q @ state) * query_decay
    if not need_state:
        return out, None
    carried = (k * key_decay).transpose(-1, -2) @ v
    return out, (carried if state is None else state * block_decay + carried)


def retention_chunkwise(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decays: Sequence[float], state: torch.Tensor | None,
    chunk_size: int, need_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunkwise form: :func:`retention_block` on consecutive chunks, the state carried between them."""
    outs, length = [], q.shape[2]
    for start in range(0, length, chunk_size):
        part = slice(start, start + chunk_size)
        last = start + chunk_size >= length
        out, state = retention_block(q[:, :, part], k[:, :, part], v[:, :, part], log_decays, state,
                                     need_state or not last)
        outs.append(out)
    return (torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]), state


def fast_step_applies(x: torch.Tensor) -> bool:
    """Whether a one-token recurrent call may take :meth:`MultiScaleRetention.step`: no autograd, no autocast."""
    return not torch.is_grad_enabled() and not (
        torch.amp.autocast_mode.is_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type))


def retention_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gamma: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form, one token at a time: S = gamma S + k^T v, o = q S."""
    gamma = log_gamma.exp()[:, None, None]
    outs = []
    for t in range(q.shape[2]):
        state = gamma * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(q[:, :, t, None, :] @ state)
    return (torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]), state


@functools.cache
def fla_kernels() -> Any | None:
    """flash-linear-attention's simple-GLA ops (retention with any fixed per-head decay), or None."""
    try:
        from fla.ops import simple_gla
    except Exception:  # noqa: BLE001 - missing or broken install: use the PyTorch path
        return None
    return simple_gla


def retention_fla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gamma: torch.Tensor, state: torch.Tensor, recurrent: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunkwise or recurrent retention with flash-linear-attention's Triton kernels (CUDA only)."""
    kernels = fla_kernels()
    kernel = kernels.fused_recurrent_simple_gla if recurrent else kernels.chunk_simple_gla
    out, new_state = kernel(
        q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(),
        g_gamma=log_gamma.float(), scale=1.0, initial_state=state.contiguous(), output_final_state=True,
    )
    return out.transpose(1, 2), new_state


def no_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if torch.amp.autocast_mode.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()
