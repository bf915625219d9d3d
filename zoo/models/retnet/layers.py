"""RetNet's layers: multi-scale retention (its parallel, recurrent and chunkwise forms and the one-token step),
the gated FFN, RMSNorm, the pre-norm block, the recurrent state, and the checks of what a RetNet is given."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ZooError
from ..depth import BlockSpec
from .ops import (
    decay_logs,
    fast_step_applies,
    fla_kernels,
    no_autocast,
    retention_block,
    retention_chunkwise,
    retention_fla,
    retention_recurrent,
    rotary_cache,
    rotary_frequencies,
    rotate,
    swap_halves,
)


class RetNetInputError(ZooError):
    """Input a RetNet cannot take: bad sizes (dim, heads, depth, vocabulary, decay), token ids, mode, chunk size or
    recurrent state."""


@dataclass
class RetNetState:
    """Recurrent state of a RetNet after some tokens.

    layers: one ``[batch, heads, d_k, d_v]`` tensor per block (fp32, or fp64 for an fp64 model); None where
        the block's retention sub-layer was removed.
    offset: number of tokens seen, i.e. the rotary position of the next token.
    """

    layers: list[torch.Tensor | None]
    offset: int

    def detach(self) -> RetNetState:
        return RetNetState([None if s is None else s.detach() for s in self.layers], self.offset)

    def to(self, device: torch.device | str) -> RetNetState:
        return RetNetState([None if s is None else s.to(device) for s in self.layers], self.offset)

    def nbytes(self) -> int:
        """Memory held by the state, in bytes."""
        return sum(s.numel() * s.element_size() for s in self.layers if s is not None)


class RMSNorm(nn.Module):
    """RMS normalisation with a learned scale, computed in at least fp32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float32, torch.float64):  # the same numbers without two no-op casts (decode steps)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


class MultiScaleRetention(nn.Module):
    """Residual retention sub-layer: x + out_proj(silu(W_g h) * headnorm(retention(h))), h = rmsnorm(x)."""

    def depth_spec(self) -> BlockSpec:
        return BlockSpec("retention", removable=True)  # its own residual add: removing it leaves x

    def __init__(self, dim: int, heads: int, value_dim: int, decay: str, norm_eps: float, rope_theta: float,
                 use_fla: bool = True, rope: str = "torchscale", head_norm_affine: bool = False):
        super().__init__()
        self.heads, self.key_dim, self.value_dim = heads, dim // heads, value_dim // heads
        self.log_decays = decay_logs(heads, decay)
        self._constants: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = {}
        self.norm_eps, self.rope_theta, self.use_fla, self.rope = norm_eps, rope_theta, use_fla, rope
        self.fast_step = True  # see RetNet.set_fast_step
        # the per-head norm's learned scale (shared by the heads), as flash-linear-attention's checkpoints have it
        self.head_norm_weight = nn.Parameter(torch.ones(self.value_dim)) if head_norm_affine else None
        self.norm = RMSNorm(dim, norm_eps)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, value_dim, bias=False)
        self.g_proj = nn.Linear(dim, value_dim, bias=False)
        self.out_proj = nn.Linear(value_dim, dim, bias=False)

    def state_shape(self, batch_size: int) -> tuple[int, int, int, int]:
        return (batch_size, self.heads, self.key_dim, self.value_dim)

    def constant(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``log_gamma`` (per head), ``gamma`` ([H, 1, 1]) or ``frequencies`` (signed rotary, per feature), made
        once per device and dtype: a host-to-device copy on every call would stall the host until the GPU caught
        up, once per layer and token. Moving or casting the module, copying or pickling it starts an empty cache."""
        key = (name, device, dtype)
        if key not in self._constants:
            with torch.inference_mode(False):  # a normal tensor, usable in training and in inference mode
                if name == "gamma":  # exp of the rounded log, as the recurrent form computes it
                    values = self.constant("log_gamma", device, dtype).exp()[:, None, None]
                elif name == "log_gamma":
                    values = torch.tensor(self.log_decays, dtype=torch.float64)
                else:
                    values = rotary_frequencies(self.key_dim, self.rope_theta, self.rope)
                self._constants[key] = values.to(device=device, dtype=dtype, copy=True)
        return self._constants[key]

    def _apply(self, fn: Any, recurse: bool = True) -> MultiScaleRetention:
        self._constants = {}
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_constants": {}}

    def forward(self, x: torch.Tensor, mode: str = "parallel", chunk_size: int = 64,
                state: torch.Tensor | None = None, offset: int = 0, need_state: bool = True,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (x + retention output, the recurrent state after these tokens, or None unless `need_state`).

        mask: [B, T] of 0/1, optional; a token with 0 (padding) adds nothing to the state or to later tokens.
        One token in recurrent mode without autograd takes :meth:`step`, the same numbers in fewer operations.
        """
        batch, length, _ = x.shape
        if mode == "recurrent" and length == 1 and mask is None and self.fast_step and fast_step_applies(x):
            core = torch.promote_types(x.dtype, torch.float32)
            state = None if state is None else state.to(core)
            out, state = self.step(x[:, 0], state, rotary_cache(self.key_dim, self.rope_theta, self.rope, offset, 1,
                                                                x.device, core))
            return out[:, None], state
        h = self.norm(x)
        q = self.q_proj(h).view(batch, length, self.heads, self.key_dim).transpose(1, 2)
        k = self.k_proj(h).view(batch, length, self.heads, self.key_dim).transpose(1, 2)
        v = self.v_proj(h).view(batch, length, self.heads, self.value_dim).transpose(1, 2)
        out, new_state = self.retain(q, k, v, mode, chunk_size, state, offset, need_state, mask)
        gate = F.silu(self.g_proj(h))
        out = out.transpose(1, 2).reshape(batch, length, -1).to(gate.dtype)
        return x + self.out_proj(gate * out), new_state

    def retain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, chunk_size: int,
               state: torch.Tensor | None, offset: int, need_state: bool = True, mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-head normalised retention of [B, H, T, d] q, k, v, in fp32 or wider with autocast off."""
        core = torch.promote_types(q.dtype, torch.float32)
        with no_autocast(q.device):
            q, k, v = q.to(core), k.to(core), v.to(core)
            cos, sin = rotary_cache(self.key_dim, self.rope_theta, self.rope, offset, q.shape[2], q.device, core)
            q = rotate(q, cos, sin, self.rope)
            k = rotate(k, cos, sin, self.rope) * self.key_dim**-0.5
            if mask is not None:  # a padding token's key is zero: it adds nothing to any later token or the state
                k = k * mask[:, None, :, None].to(core)
            if state is not None:
                state = state.to(core)
            fla_wins = mode == "chunkwise" or (mode == "recurrent" and q.shape[2] > 1)
            if self.use_fla and fla_wins and q.is_cuda and core == torch.float32 and fla_kernels():
                zeros = q.new_zeros(self.state_shape(q.shape[0])) if state is None else state
                log_gamma = self.constant("log_gamma", q.device, core)
                out, state = retention_fla(q, k, v, log_gamma, zeros, recurrent=mode == "recurrent")
            elif mode == "parallel":
                out, state = retention_block(q, k, v, self.log_decays, state, need_state)
            elif mode == "chunkwise":
                out, state = retention_chunkwise(q, k, v, self.log_decays, state, chunk_size, need_state)
            else:
                zeros = q.new_zeros(self.state_shape(q.shape[0])) if state is None else state
                out, state = retention_recurrent(q, k, v, self.constant("log_gamma", q.device, core), zeros)
            out = self.head_norm(out)
        return out, state if need_state else None

    def head_norm(self, out: torch.Tensor) -> torch.Tensor:
        """The per-head RMS norm (no affine unless ``head_norm_affine``) of retention outputs [..., d_v]."""
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return out if self.head_norm_weight is None else out * self.head_norm_weight.to(out.dtype)

    def step(self, x: torch.Tensor, state: torch.Tensor | None, rotation: tuple[torch.Tensor, torch.Tensor],
             inplace: bool = False, packed: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode token, the recurrent form's arithmetic in fewer operations (no autograd, no autocast): x
        [B, dim]; state [B, H, d_k, d_v] in the core dtype (None: zeros); rotation: (cos, signed sin) [1, d_k] of
        this token's position (:func:`rotary_tables`), in the core dtype. q and k are rotated together; with
        `inplace` the state itself is updated (a preallocated decode state: :class:`RecurrentDecoder`); `packed` is
        :meth:`packed_weights` (one projection instead of four)."""
        batch, (cos, sin), heads = x.shape[0], rotation, self.heads
        h = self.norm.forward(x)  # a direct call: the step is one unit (hooks see the module calls of forward)
        if packed is None:
            qk = torch.cat((self.q_proj(h), self.k_proj(h)), dim=-1)
            v, gate = self.v_proj(h), self.g_proj(h)
        else:
            qk, v, gate = project(h, packed[0]).split(self.split_sizes, dim=-1)
        qk = qk.view(batch, 2 * heads, self.key_dim)
        if qk.dtype != cos.dtype:
            qk, v = qk.to(cos.dtype), v.to(cos.dtype)
        qk = qk * cos + swap_halves(qk, self.rope) * sin
        q, k = qk.view(batch, 2, heads, 1, self.key_dim).unbind(1)
        if packed is None or not self.exact_key_scale:
            k = k * self.key_dim**-0.5
        k, v = k.mT, v.view(batch, heads, 1, self.value_dim)  # k v: the outer product
        if state is None:
            state = k * v
        else:  # gamma S + k^T v rounded as the recurrent form rounds it (addcmul_ would fuse the multiply-add)
            gamma = self.constant("gamma", x.device, cos.dtype)
            state = (state.mul_(gamma) if inplace else state * gamma).add_(k * v)
        out = self.head_norm(q @ state).view(batch, -1)
        if out.dtype != h.dtype:
            out = out.to(h.dtype)
        if packed is None:
            return x + self.out_proj(F.silu(gate) * out), state
        return project_add(x, F.silu(gate) * out, packed[1]), state

    @functools.cached_property
    def split_sizes(self) -> tuple[int, int, int]:
        return 2 * self.heads * self.key_dim, self.heads * self.value_dim, self.heads * self.value_dim

    @property
    def exact_key_scale(self) -> bool:
        """Whether d_k^-0.5 is a power of two, so that scaling k's projection weight by it changes no rounding."""
        return math.log2(self.key_dim) % 2 == 0

    def packed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """For :meth:`step`, as [in, out] matrices for ``x @ W``: the q, k, v and g projections in one (a copy; k's
        scaled by d_k^-0.5 when that is exact) and the output projection (a view). Transposed views of [out, in]
        weights, so that every output is the same dot product as the separate projections compute."""
        scale = self.key_dim**-0.5 if self.exact_key_scale else 1.0
        weight = torch.cat((self.q_proj.weight, self.k_proj.weight * scale, self.v_proj.weight, self.g_proj.weight))
        return weight.mT, self.out_proj.weight.mT


class GatedFFN(nn.Module):
    """Residual SwiGLU sub-layer: x + W_down(silu(W_gate h) * W_up h), h = rmsnorm(x)."""

    def depth_spec(self) -> BlockSpec:
        return BlockSpec("ffn", removable=True)

    def __init__(self, dim: int, hidden_dim: int, norm_eps: float):
        super().__init__()
        self.norm = RMSNorm(dim, norm_eps)
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def step(self, x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """:meth:`forward` of one decode token [B, dim] with :meth:`packed_weights`."""
        gate, up = project(self.norm.forward(x), packed[0]).chunk(2, dim=-1)
        return project_add(x, F.silu(gate) * up, packed[1])

    def packed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate and up projections in one [dim, 2 hidden] matrix and the down projection as [hidden, dim]
        (see :meth:`MultiScaleRetention.packed_weights`)."""
        return torch.cat((self.gate_proj.weight, self.up_proj.weight)).mT, self.down_proj.weight.mT


class RetNetBlock(nn.Module):
    """One RetNet layer: a retention sub-layer then an FFN sub-layer; either may be an ``nn.Identity``."""

    def __init__(self, dim: int, heads: int, value_dim: int, ffn_dim: int, decay: str, norm_eps: float,
                 rope_theta: float, use_fla: bool, rope: str = "torchscale", head_norm_affine: bool = False):
        super().__init__()
        self.retention = MultiScaleRetention(dim, heads, value_dim, decay, norm_eps, rope_theta, use_fla, rope,
                                             head_norm_affine)
        self.ffn = GatedFFN(dim, ffn_dim, norm_eps)

    def forward(self, x: torch.Tensor, mode: str, chunk_size: int, state: torch.Tensor | None,
                offset: int, need_state: bool = True, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        new_state = None
        if not isinstance(self.retention, nn.Identity):
            x, new_state = self.retention(x, mode=mode, chunk_size=chunk_size, state=state, offset=offset,
                                          need_state=need_state, mask=mask)
        return self.ffn(x), new_state


def _check_mask(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor | None:
    """The attention mask as a [B, T] tensor of 0/1 (None when absent or all ones); anything else is refused."""
    if attention_mask is None:
        return None
    if not torch.is_tensor(attention_mask) or attention_mask.shape != input_ids.shape:
        found = tuple(attention_mask.shape) if torch.is_tensor(attention_mask) else type(attention_mask).__name__
        raise RetNetInputError(f"attention_mask must be a tensor of the shape of input_ids {tuple(input_ids.shape)} "
                               f"(1 = token, 0 = padding), got {found}.")
    if not ((attention_mask == 0) | (attention_mask == 1)).all():
        raise RetNetInputError("attention_mask may hold only 0 (padding) and 1 (token).")
    return None if bool(attention_mask.all()) else attention_mask.to(input_ids.device)


def _check_chunk_size(chunk_size: Any) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise RetNetInputError(f"chunk_size must be an integer >= 1 (tokens per chunk), got {chunk_size!r}.")
    return chunk_size


def _shapes_text(shapes: list[tuple[int, ...] | None]) -> str:
    distinct = sorted({str(s) for s in shapes})
    return f"[{len(shapes)} blocks: {', '.join(distinct)}]"


# INT8 weights of the decode step's projections (RecurrentDecoder(quantize='int8')).
class Int8Projection:
    """``x @ W`` of a decode step with W's 8-bit form: each output's weights rounded to signed 8-bit (symmetric, one
    scale per output), the input quantised per call (unsigned 8-bit, per row range), multiplied by torch's x86
    (fbgemm) dynamic-quantised linear kernel on the CPU. A quarter of the bytes a float32 step reads, for a step
    bound by reading weights. (torch marks its quantised tensors deprecated, pytorch#184982; they are the CPU INT8
    matmul this torch has: torchao's eager INT8 linear was slower than float32 here.)"""

    def __init__(self, matrix: torch.Tensor):
        weight = matrix.mT.float().contiguous()  # [out, in]
        scale = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*", category=UserWarning)
            rounded = torch.quantize_per_channel(weight, scale.double(), torch.zeros_like(scale, dtype=torch.long),
                                                 0, torch.qint8)
        self.params = torch.ops.quantized.linear_prepack(rounded, None)
        self.nbytes = weight.numel() + scale.numel() * 8  # int8 weights and their scale and zero point per output

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.params, reduce_range=True)


def project(x: torch.Tensor, weight: torch.Tensor | Int8Projection) -> torch.Tensor:
    """``x @ weight`` for a packed decode weight ([in, out] matrix or its :class:`Int8Projection`)."""
    return x @ weight if torch.is_tensor(weight) else weight(x)


def project_add(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor | Int8Projection) -> torch.Tensor:
    """``x + a @ weight`` (one fused ``addmm`` for a float matrix, rounded as the reference step rounds it)."""
    return torch.addmm(x, a, weight) if torch.is_tensor(weight) else x + weight(a)

