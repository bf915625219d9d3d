"""RetNet (Sun et al., 2023): a decoder-only language model built from multi-scale retention.

Each block is pre-norm: ``x + retention(rmsnorm(x))`` then ``x + ffn(rmsnorm(x))`` (SwiGLU FFN). Retention
per head h, with decay gamma_h, rotary-rotated q and k, and k scaled by d_k^-0.5, computes

    o_n = sum_{m <= n} gamma_h^(n-m) (q_n . k_m) v_m

in one of three forms that give the same o_n:

* ``parallel``:  O = (Q K^T * D) V with D[n, m] = gamma^(n-m) for n >= m, else 0;
* ``recurrent``: S_n = gamma S_(n-1) + k_n^T v_n, o_n = q_n S_n (constant memory per token);
* ``chunkwise``: the parallel form inside chunks of B tokens plus a state carried across chunks
  (decayed by gamma^B), so memory is O(T B) instead of O(T^2).

How the normalisation makes the three forms agree by construction: nothing scale-dependent happens before
the per-head normalisation. The reference implementation divides D by its row sums and the scores by their
clamped absolute row sums; those divisors differ between the forms (a chunk sees other rows than the full
sequence) and cancel only in a norm without eps, which is why its chunkwise form drifts. Here o_n is the
plain sum above in every form, with no row normalisation and no chunk-dependent scaling, so the per-head
RMS norm ``o / sqrt(mean(o^2) + eps)`` (eps > 0, no affine) receives the same numbers in all three forms and
returns the same numbers: eps is part of one function applied once, not a correction that has to cancel.
The forms differ only by floating-point summation order (about 1e-6 relative in fp32).

Numerical range: every decay factor is a power gamma^n <= 1 (built as exp(n log gamma) with masked
entries set to exp(-inf) = 0), so nothing is ever divided and no weight exceeds 1. What grows is the sum of
up to ~1/(1 - gamma) terms q.k v, which can pass fp16's 65504 on long sequences (the known overflow of
other implementations). The retention core (rotation, decays, state, per-head norm) therefore runs with
autocast disabled in at least fp32; projections and FFN follow autocast. The recurrent state is fp32
(fp64 for an fp64 model) whatever the autocast dtype.

Depth units: each block's ``retention`` and ``ffn`` sub-layer holds its own residual add, so either can be
replaced by ``nn.Identity`` (zoo.remove_units); a removed retention sub-layer has no recurrent state.

Sizes: ``retnet_tiny``/``retnet_small``/``retnet_base`` use a byte vocabulary (256) and train on a CPU;
``retnet_1_3b``/``retnet_2_7b``/``retnet_6_7b`` follow the paper (layers, width, heads; d_k = d/H, values
2d, FFN 2d). With the gated FFN (three matrices) and a GPT-2 vocabulary their parameter counts come out
above the nominal ones (1.6B, 3.2B, 7.9B untied). Optional fast path: flash-linear-attention's kernels are
used for the chunkwise form, and the recurrent form over more than one token, of CUDA fp32 tensors when ``fla``
is importable. A one-token decode step stays on the PyTorch path, which was faster there (retnet_small shapes,
batch 4, H200: 0.12 ms vs 0.29 ms per recurrent kernel call; fla was 10.7x faster over 64 tokens and 8.2x faster
for the chunkwise forward at 2048 tokens; docs/benchmarks.md).

Speed: the decay matrices and rotary tables are made once per length, device and dtype and shared by every layer
and call (:func:`decay_tables`, :func:`rotary_cache`), and a forward without ``return_state`` computes no state.
A one-token recurrent call without autograd takes :meth:`MultiScaleRetention.step`: the recurrent form's arithmetic
(bit for bit) in fewer operations. ``generate`` decodes with :class:`RecurrentDecoder`: the state preallocated and
updated in place, packed projections, no host sync per token, and on CUDA the step captured in a CUDA graph.
Prompts of different lengths decode in one batch (left padding: a padding token's key is zero).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ZooError
from .depth import BlockSpec, DepthMixin
from .features import check_fraction
from .registry import register_family, register_model
from .retention import (
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

MODES = ("parallel", "recurrent", "chunkwise")
DECODES = ("auto", "graph", "static", "forward")
DECAYS = ("torchscale", "linspace")
ROPES = ("torchscale", "neox")  # interleaved pairs, linspace frequencies | rotate-half, theta^(-2i/d) (fla's)


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


# ----------------------------------------------------------------------------------------------------------
# Modules.


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


class RetNet(DepthMixin, nn.Module):
    """Decoder-only RetNet language model: embedding, pre-norm retention/FFN blocks, final norm, LM head."""

    task = "language_model"
    recurrent = True

    def __init__(self, vocab_size: int = 256, dim: int = 256, depth: int = 6, heads: int = 4,
                 ffn_dim: int | None = None, value_factor: float = 2.0, tie_embeddings: bool = False,
                 decay: str = "torchscale", norm_eps: float = 1e-6, chunk_size: int = 64,
                 rope_theta: float = 10000.0, use_fla: bool = True, rope: str = "torchscale",
                 head_norm_affine: bool = False):
        super().__init__()
        value_dim = int(dim * value_factor)
        if vocab_size < 1 or depth < 1 or heads < 1:
            raise RetNetInputError(f"vocab_size, depth and heads must be >= 1, got {vocab_size}, {depth}, {heads}.")
        if dim % heads or (dim // heads) % 2 or value_dim % heads:
            raise RetNetInputError(
                f"dim={dim} and value dim={value_dim} must be divisible by heads={heads}, with an even key "
                f"head dim (rotary rotates pairs); got key head dim {dim / heads}."
            )
        if decay not in DECAYS:
            raise RetNetInputError(f"Unknown decay {decay!r}; allowed are {', '.join(DECAYS)}.")
        if rope not in ROPES:
            raise RetNetInputError(f"Unknown rope layout {rope!r}; allowed are {', '.join(ROPES)}.")
        _check_chunk_size(chunk_size)
        self.vocab_size, self.dim, self.depth, self.heads = vocab_size, dim, depth, heads
        self.ffn_dim = ffn_dim or 2 * dim
        self.value_dim, self.chunk_size, self.tie_embeddings = value_dim, chunk_size, tie_embeddings
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(
            RetNetBlock(dim, heads, value_dim, self.ffn_dim, decay, norm_eps, rope_theta, use_fla, rope,
                        head_norm_affine)
            for _ in range(depth)
        )
        self.norm = RMSNorm(dim, norm_eps)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self._init_weights()
        if tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def _init_weights(self) -> None:
        """GPT-2 style: N(0, 0.02), residual output projections scaled by 1/sqrt(2 depth)."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02 / math.sqrt(2 * self.depth) if name.endswith(("out_proj.weight", "down_proj.weight")) else 0.02
            nn.init.normal_(p, std=std)

    # -- zoo conventions ---------------------------------------------------------------------------------

    @staticmethod
    def read_foreign(arch: str, state: dict[str, torch.Tensor], config: dict[str, Any] | None,
                     overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
        """Weights published in another project's format (flash-linear-attention, torchscale): see
        :func:`read_foreign`. ``zoo.create_model`` calls it for any weights without depthzoo metadata."""
        return read_foreign(arch, state, config, overrides)

    def export_form(self, form: str) -> nn.Module:
        """What :func:`zoo.export` traces: ``parallel`` (token ids [B, T] -> logits [B, T, vocab], without host-side
        input checks) or ``recurrent`` (the decode step as a pure function of token, position and states)."""
        return RecurrentForm(self) if form == "recurrent" else ParallelForm(self)

    def hf_form(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(config.json, state dict) as a flash-linear-attention model that transformers loads (:func:`fla_form`)."""
        return fla_form(self)

    def example_input(self, batch_size: int = 1, input_size: Sequence[int] | None = None) -> torch.Tensor:
        """Zero token ids of shape [batch, T] on the model's device (T from input_size or default_cfg)."""
        length = (input_size or self.default_cfg["input_size"])[0]
        return torch.zeros(batch_size, length, dtype=torch.long, device=self.embed.weight.device)

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        return [(f"blocks.{i}.{kind}", 0, i) for i in range(len(self.blocks)) for kind in ("retention", "ffn")]

    # -- forward -----------------------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, mode: str = "parallel", chunk_size: int | None = None,
                state: RetNetState | None = None, return_state: bool = False,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, RetNetState]:
        """Logits [B, T, vocab] of token ids [B, T], optionally continuing from / returning a recurrent state.

        mode: ``parallel`` (O(T^2) memory), ``chunkwise`` (chunks of `chunk_size`, default the model's) or
        ``recurrent`` (token by token). All three give the same logits and the same final state.
        attention_mask: [B, T] of 1 (token) and 0 (padding, e.g. the left padding of prompts of different lengths):
        a padding token adds nothing to the state or to any later token, so every row computes what it would
        alone (retention depends on relative positions only). Logits at padding positions are meaningless.
        """
        self._check_ids(input_ids)
        if mode not in MODES:
            raise RetNetInputError(f"Unknown mode {mode!r}; allowed are {', '.join(map(repr, MODES))}.")
        chunk_size = self.chunk_size if chunk_size is None else _check_chunk_size(chunk_size)
        layer_states, offset = self._check_state(state, input_ids.shape[0])
        mask = _check_mask(attention_mask, input_ids)
        x, new_states = self._run_blocks(self.embed(input_ids), mode, chunk_size, layer_states, offset,
                                         need_state=return_state, mask=mask)
        logits = self.lm_head(self.norm(x))
        if return_state:
            return logits, RetNetState(new_states, offset + input_ids.shape[1])
        return logits

    def _run_blocks(self, x: torch.Tensor, mode: str, chunk_size: int, layer_states: list[torch.Tensor | None],
                    offset: int, hidden: list[torch.Tensor] | None = None, need_state: bool = True,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Every block in turn (each recomputed in the backward pass under gradient checkpointing); `hidden`, when
        given, collects the input of the first block and every block's output; the new states are None unless
        `need_state`."""
        checkpointing = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        share = 1.0 if self.grad_checkpointing is True else float(self.grad_checkpointing)
        checkpointed = max(1, round(share * len(self.blocks))) if checkpointing else 0
        new_states = []
        if hidden is not None:
            hidden.append(x)
        for index, (block, layer_state) in enumerate(zip(self.blocks, layer_states)):
            if index < checkpointed:
                from torch.utils.checkpoint import checkpoint

                x, new_state = checkpoint(block, x, mode, chunk_size, layer_state, offset, need_state, mask,
                                          use_reentrant=False)
            else:
                x, new_state = block(x, mode, chunk_size, layer_state, offset, need_state=need_state, mask=mask)
            new_states.append(new_state)
            if hidden is not None:
                hidden.append(x)
        return x, new_states

    grad_checkpointing: bool | float = False

    def set_grad_checkpointing(self, enable: bool | float = True) -> None:
        """Recompute blocks in the backward pass instead of storing their activations (training only): True every
        block, a fraction in (0, 1] the first blocks up to that share."""
        check_fraction(enable)
        self.grad_checkpointing = False if enable == 0 else enable

    def hidden_states(self, input_ids: torch.Tensor, mode: str = "parallel", chunk_size: int | None = None
                      ) -> list[torch.Tensor]:
        """The residual stream [B, T, dim] before the first block and after every block (depth + 1 tensors, no
        final norm): features for extraction and for layer-importance rules (e.g. the similarity of a block's
        input and output)."""
        self._check_ids(input_ids)
        if mode not in MODES:
            raise RetNetInputError(f"Unknown mode {mode!r}; allowed are {', '.join(map(repr, MODES))}.")
        chunk_size = self.chunk_size if chunk_size is None else _check_chunk_size(chunk_size)
        hidden: list[torch.Tensor] = []
        self._run_blocks(self.embed(input_ids), mode, chunk_size, [None] * self.depth, 0, hidden, need_state=False)
        return hidden

    def init_state(self, batch_size: int = 1) -> RetNetState:
        """The empty state (zeros), in fp32 or the model's wider dtype."""
        dtype = torch.promote_types(self.embed.weight.dtype, torch.float32)
        layers = [
            None if isinstance(b.retention, nn.Identity)
            else torch.zeros(b.retention.state_shape(batch_size), dtype=dtype, device=self.embed.weight.device)
            for b in self.blocks
        ]
        return RetNetState(layers, 0)

    def _check_ids(self, input_ids: torch.Tensor) -> None:
        if not torch.is_tensor(input_ids) or input_ids.dtype.is_floating_point or input_ids.dtype.is_complex \
                or input_ids.dtype == torch.bool:
            kind = input_ids.dtype if torch.is_tensor(input_ids) else type(input_ids).__name__
            raise RetNetInputError(f"input_ids must be an integer tensor of token ids, got {kind}.")
        if input_ids.dim() != 2 or input_ids.numel() == 0:
            raise RetNetInputError(
                f"input_ids must have shape [batch, length] with batch >= 1 and length >= 1, got "
                f"{tuple(input_ids.shape)}. Add a batch dimension with input_ids[None] for a single sequence."
            )
        if input_ids.device.type != "meta":
            low, high = torch.stack(torch.aminmax(input_ids)).tolist()  # one device sync on CUDA, not two
            if low < 0 or high >= self.vocab_size:
                raise RetNetInputError(
                    f"Token ids must lie in [0, {self.vocab_size - 1}] (vocab_size={self.vocab_size}), got ids in "
                    f"[{low}, {high}]. Tokenise with the model's vocabulary or build it with vocab_size=..."
                )

    def _check_state(self, state: RetNetState | None, batch_size: int) -> tuple[list[torch.Tensor | None], int]:
        """The per-block states and the position offset; a state of another model or batch is refused."""
        if state is None:
            return [None] * self.depth, 0
        if not isinstance(state, RetNetState):
            raise RetNetInputError(f"state must be a RetNetState returned by this model, got {type(state).__name__}.")
        found = [None if s is None else tuple(s.shape) for s in state.layers]
        expected = []
        for i, block in enumerate(self.blocks):
            if isinstance(block.retention, nn.Identity):
                expected.append(None)
            elif hasattr(block.retention, "state_shape"):
                expected.append(block.retention.state_shape(batch_size))
            else:  # a stand-in without a state of its own (a latency-table replay) takes what it is given
                expected.append(found[i] if i < len(found) else None)
        if found != expected:
            raise RetNetInputError(
                f"The state does not fit this model and batch: it holds per-block shapes {_shapes_text(found)} "
                f"but this model ({getattr(self, 'zoo_name', 'RetNet')}, {self.depth} blocks, batch {batch_size}) "
                f"needs {_shapes_text(expected)} (None = retention removed). A state can only continue the "
                f"model (size and pruning plan) and batch size that produced it."
            )
        return list(state.layers), state.offset

    # -- generation --------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor | Sequence[torch.Tensor], max_new_tokens: int,
                 temperature: float = 1.0, top_k: int | None = None, do_sample: bool = False,
                 prefill: str = "chunkwise", chunk_size: int | None = None,
                 attention_mask: torch.Tensor | None = None, decode: str = "auto", quantize: str | None = None
                 ) -> torch.Tensor | list[torch.Tensor]:
        """Prompt [B, T] followed by `max_new_tokens` generated tokens: one parallel/chunkwise prefill pass,
        then recurrent steps with constant memory. Greedy unless `do_sample` (temperature, then top-k).

        Prompts of different lengths: a list of 1-D tensors (returned as a list, each its prompt and new tokens),
        or a left-padded [B, T] batch with its `attention_mask` (0 = padding). Every row generates what it would
        alone. decode: ``auto`` (``graph`` on CUDA, else ``static``), ``graph`` (the static step captured once in
        a CUDA graph and replayed per token), ``static`` (:class:`RecurrentDecoder` run eagerly: preallocated state
        updated in place, no host sync per token) or ``forward`` (``model(token, mode="recurrent", state=...)``
        per token, the public API). quantize: ``"int8"`` decodes with 8-bit weights (see :class:`RecurrentDecoder`;
        the prompt's prefill stays float).
        """
        prompts = list(input_ids) if isinstance(input_ids, (list, tuple)) else None
        if prompts is not None:
            if attention_mask is not None:
                raise RetNetInputError("attention_mask goes with a padded [B, T] batch; a list of prompts is padded "
                                       "here, without one.")
            input_ids, attention_mask = self._left_pad(prompts)
        self._check_decode(decode)
        if prefill not in ("parallel", "chunkwise"):
            raise RetNetInputError(f"prefill must be 'parallel' or 'chunkwise', got {prefill!r}.")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise RetNetInputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}.")
        if do_sample and not temperature > 0:
            raise RetNetInputError(f"temperature must be > 0 when sampling, got {temperature}.")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise RetNetInputError(f"top_k must be None or an integer >= 1, got {top_k!r}.")
        if attention_mask is not None and torch.is_tensor(attention_mask) and attention_mask.shape == \
                input_ids.shape and not bool((attention_mask[:, -1] == 1).all()):
            raise RetNetInputError("generate needs left padding: the last column of attention_mask must be 1 in every "
                                   "row (the next token follows each prompt's last token).")
        logits, state = self(input_ids, mode=prefill, chunk_size=chunk_size, return_state=True,
                             attention_mask=attention_mask)
        step = self.decoder(state, input_ids.shape[0], decode, quantize) if max_new_tokens > 1 else None
        tokens, logits = [input_ids], logits[:, -1]
        for index in range(max_new_tokens):
            next_token = _pick_token(logits.float(), temperature, top_k, do_sample)
            tokens.append(next_token)
            if index + 1 < max_new_tokens:
                logits = step(next_token)
        out = torch.cat(tokens, dim=1)
        if prompts is None:
            return out
        return [row[input_ids.shape[1] - len(prompt):] for row, prompt in zip(out, prompts)]

    def decoder(self, state: RetNetState, batch_size: int, decode: str = "auto", quantize: str | None = None
                ) -> Callable[[torch.Tensor], torch.Tensor]:
        """A function from the next token ids [B, 1] to their logits [B, vocab] that continues `state` (see
        :meth:`generate` for `decode` and `quantize`). Under autocast, or with :meth:`set_fast_step` off, every
        decode is ``forward`` (the fast step keeps the retention core out of low precision only through that path);
        ``quantize`` needs the fast step, so it is refused there."""
        self._check_decode(decode)
        self._check_state(state, batch_size)
        if quantize is not None:  # (RecurrentDecoder checks the model and the value)
            if decode == "forward" or any(not getattr(b.retention, "fast_step", True) for b in self.blocks):
                raise RetNetInputError("quantize='int8' runs in the fast decode step: use decode='static' or 'auto', "
                                       "with set_fast_step on.")
            return RecurrentDecoder(self, state, batch_size, quantize=quantize)
        device = self.embed.weight.device
        autocast = torch.amp.autocast_mode.is_autocast_available(device.type) and torch.is_autocast_enabled(
            device.type)
        slow = any(not getattr(b.retention, "fast_step", True) for b in self.blocks)
        if decode == "forward" or autocast or slow:
            return RecurrentStep(self, state)
        if decode == "graph" or (decode == "auto" and device.type == "cuda"):
            try:
                return RecurrentDecoder(self, state, batch_size, graph=True)
            except RuntimeError as error:  # a capture the model does not allow (e.g. hooks that sync)
                if decode == "graph":
                    raise
                warnings.warn(f"CUDA graph capture of the decode step failed ({error}); decoding eagerly.",
                              stacklevel=3)
        return RecurrentDecoder(self, state, batch_size, graph=False)

    def _check_decode(self, decode: str) -> None:
        if decode not in DECODES:
            raise RetNetInputError(f"Unknown decode {decode!r}; allowed are {', '.join(map(repr, DECODES))}.")
        if decode == "graph" and not self.embed.weight.is_cuda:
            raise RetNetInputError("decode='graph' captures a CUDA graph and needs the model on a CUDA device; use "
                                   "'static' (or 'auto') on the CPU.")

    def set_fast_step(self, enable: bool = True) -> None:
        """Whether a one-token recurrent call without autograd takes :meth:`MultiScaleRetention.step` (the default)
        or the reference recurrent form (the same numbers to ~1e-7, in more operations)."""
        for block in self.blocks:
            if isinstance(block.retention, MultiScaleRetention):
                block.retention.fast_step = enable

    def packed_decode_weights(self, quantize: str | None = None) -> list[tuple[Any, Any]]:
        """For :class:`RecurrentDecoder`: per block (``packed_weights`` of the retention, of the FFN; None for a
        removed or foreign sub-layer), then (the LM head as [dim, vocab], None). The packed copies (q/k/v/g and
        gate/up concatenated) are made once and kept with the model until its weights change (any in-place update
        or reload); for fp32/fp64 weights the packed step computes the same numbers as the reference step.
        ``quantize="int8"``: every matrix an :class:`Int8Projection` instead (weights rounded to 8 bits)."""
        key = (quantize, *((p.data_ptr(), p._version, p.dtype) for p in self.parameters()))
        cached = self.__dict__.get("_decode_pack")
        if cached is not None and cached[0] == key:
            return cached[1]

        def weights(sub: nn.Module) -> tuple[torch.Tensor, ...] | None:
            if not isinstance(sub, (MultiScaleRetention, GatedFFN)):
                return None
            return tuple(form(w.detach()) for w in sub.packed_weights())

        form = Int8Projection if quantize == "int8" else (lambda matrix: matrix)
        with torch.inference_mode(False), torch.no_grad():
            packed = [(weights(b.retention), weights(b.ffn)) for b in self.blocks]
            packed.append((form(self.lm_head.weight.detach().mT), None))
        self.__dict__["_decode_pack"] = (key, packed)
        return packed

    def packed_decode_bytes(self) -> int:
        """Bytes that :meth:`packed_decode_weights` copies: the q/k/v/g and gate/up weights of every block."""
        return sum(p.numel() * p.element_size() for name, p in self.named_parameters() if name.startswith("blocks.")
                   and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight",
                                      "gate_proj.weight", "up_proj.weight")))

    def _apply(self, fn: Any, recurse: bool = True) -> RetNet:
        self.__dict__.pop("_decode_pack", None)  # moved or cast weights: the packed copies are stale
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("_decode_pack", None)
        return state

    def _left_pad(self, prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts of different lengths as one left-padded batch and its attention mask."""
        if not prompts or any(not torch.is_tensor(p) or p.dim() != 1 or p.numel() == 0 or p.dtype.is_floating_point
                              or p.dtype.is_complex or p.dtype == torch.bool for p in prompts):
            raise RetNetInputError("A list of prompts must hold 1-D integer tensors of token ids, each of length >= 1.")
        length = max(len(p) for p in prompts)
        device = self.embed.weight.device
        ids = torch.zeros(len(prompts), length, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, length - len(prompt):] = prompt
            mask[row, length - len(prompt):] = 1
        return ids, mask


class RecurrentStep(nn.Module):
    """One decode step through the public API, ``model(token, mode="recurrent", state=...)``, as a module: token ids
    [B, 1] -> their logits [B, vocab]. `advance`: each call continues the previous one's state (decoding);
    otherwise every call starts from the same `state` (one step timed again and again: the ``decode`` workload)."""

    def __init__(self, model: RetNet, state: RetNetState, advance: bool = True):
        super().__init__()
        self.model, self.state, self.advance = model, state, advance

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        if not self.advance:
            return self.model(token, mode="recurrent", state=self.state)[:, -1]
        logits, self.state = self.model(token, mode="recurrent", state=self.state, return_state=True)
        return logits[:, -1]


def decode_frequencies(model: RetNet) -> torch.Tensor | None:
    """The signed rotary frequencies [1, d_k] (fp64) that :func:`decode_step` turns by the position; None when no
    retention sub-layer is left."""
    first = next((b.retention for b in model.blocks if isinstance(b.retention, MultiScaleRetention)), None)
    if first is None:
        return None
    return rotary_frequencies(first.key_dim, first.rope_theta, first.rope).to(model.embed.weight.device)[None]


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


def decode_step(model: RetNet, token: torch.Tensor, position: torch.Tensor, frequencies: torch.Tensor | None,
                states: Sequence[torch.Tensor | None], inplace: bool = False,
                packed: list[tuple[Any, Any]] | None = None) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One decode token through every block as tensor operations only (no host value, so that a CUDA graph or an
    exporter can record it): token ids [B, 1]; position, an fp64 scalar tensor; frequencies from
    :func:`decode_frequencies`; one state per block (None: its retention is skipped). Returns (logits [B, vocab],
    the new states); `inplace` updates the given states, `packed` is :meth:`RetNet.packed_decode_weights`."""
    core = torch.promote_types(model.embed.weight.dtype, torch.float32)
    x = model.embed(token[:, 0])
    rotation = None
    if frequencies is not None:  # the rotary tables of this position, once for every layer
        angles = position.to(torch.float64) * frequencies
        rotation = angles.cos().to(core), angles.sin().to(core)
    packed = packed or [(None, None)] * (len(model.blocks) + 1)
    new_states = []
    for block, state, (retention_weight, ffn_weight) in zip(model.blocks, states, packed):
        if state is not None:
            x, state = block.retention.step(x, state, rotation, inplace=inplace, packed=retention_weight)
        new_states.append(state)
        x = block.ffn(x) if ffn_weight is None else block.ffn.step(x, ffn_weight)
    head = packed[-1][0]
    return (model.lm_head(model.norm(x)) if head is None else project(model.norm(x), head)), new_states


class ParallelForm(nn.Module):
    """A RetNet's parallel forward without its host-side input checks (a traced program cannot branch on data)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        m = self.model
        x, _ = m._run_blocks(m.embed(input_ids), "parallel", m.chunk_size, [None] * m.depth, 0, need_state=False)
        return m.lm_head(m.norm(x))


class RecurrentForm(nn.Module):
    """A RetNet's one-token decode step as a pure function: (token ids [B, 1], position, states...) -> (logits
    [B, vocab], new states...), one state per retention sub-layer that is present."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.present = [isinstance(b.retention, MultiScaleRetention) for b in model.blocks]
        self.register_buffer("frequencies", decode_frequencies(model), persistent=False)

    def forward(self, token: torch.Tensor, position: torch.Tensor, *states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = iter(states)
        per_block = [next(given) if present else None for present in self.present]
        logits, new_states = decode_step(self.model, token, position, self.frequencies, per_block)
        return (logits, *(s for s, present in zip(new_states, self.present) if present))

    def example(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """A token, position 7 and random states (so that every part of the step matters)."""
        m = self.model
        device = m.embed.weight.device
        generator = torch.Generator().manual_seed(0)
        states = m.init_state(batch_size).layers
        states = [torch.randn(s.shape, generator=generator, dtype=s.dtype).to(device) for s in states if s is not None]
        return (torch.ones(batch_size, 1, dtype=torch.long, device=device),
                torch.tensor(7.0, dtype=torch.float64, device=device), *states)


DECODE_QUANTIZE = (None, "int8")


def check_decode_quantize(model: RetNet, quantize: str | None, graph: bool) -> None:
    """``quantize`` of a decode: None, or ``"int8"`` for a float32 model on the CPU decoded eagerly (RetNetInputError
    saying what is allowed otherwise)."""
    if quantize not in DECODE_QUANTIZE:
        raise RetNetInputError(f"quantize={quantize!r}; allowed: None or 'int8' (8-bit weights in the decode step).")
    if quantize is None:
        return
    weight = model.embed.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or graph:
        found = f"{weight.dtype} weights on {weight.device}" + (", in a CUDA graph" if graph else "")
        raise RetNetInputError(f"quantize='int8' decodes with torch's x86 INT8 kernels: a float32 model on the CPU, "
                               f"decoded eagerly (decode='static' or 'auto'); this is {found}.")


class RecurrentDecoder:
    """Token-by-token decoding at a fixed, small cost per token. The token, its position and the recurrent state
    live in preallocated tensors that every step updates in place (no new state, no host sync, no input check:
    the tokens are the model's own); with ``graph`` the step is captured once in a CUDA graph and replayed.

        decoder = RecurrentDecoder(model, state, batch_size=1, graph=True)
        logits = decoder(next_token)  # [B, vocab]; with a graph, a buffer that the next call overwrites

    pack: use :meth:`RetNet.packed_decode_weights` (one projection instead of four, and of two: the same dot
    products; ~10 % faster per token for retnet_small on a CPU). Default: for fp32/fp64 weights, without a graph (a
    replay has no per-operator overhead to save), while the packed copy stays under ``PACK_LIMIT_BYTES``.
    quantize: ``"int8"`` runs every projection and the LM head with 8-bit weights (:class:`Int8Projection`; float32
    weights on the CPU, no graph); the state, norms and retention stay float32.
    """

    PACK_LIMIT_BYTES = 256 * 2**20

    def __init__(self, model: RetNet, state: RetNetState, batch_size: int, graph: bool = False,
                 pack: bool | None = None, quantize: str | None = None):
        check_decode_quantize(model, quantize, graph)
        device = model.embed.weight.device
        self.model, self.offset = model, state.offset
        self.core = torch.promote_types(model.embed.weight.dtype, torch.float32)
        with torch.inference_mode(False), torch.no_grad():  # plain tensors: usable in and out of inference mode
            self.token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
            self.position = torch.tensor(float(state.offset), dtype=torch.float64, device=device)
            self.layers = [None if s is None else s.to(self.core, copy=True) for s in state.layers]
            self.frequencies = decode_frequencies(model)
            exact = model.embed.weight.dtype in (torch.float32, torch.float64)  # see packed_decode_weights
            self.packed = model.packed_decode_weights(quantize) if pack or quantize or (
                pack is None and exact and not graph and model.packed_decode_bytes() <= self.PACK_LIMIT_BYTES) \
                else None
            self.graph, self.logits = None, None
            if graph:
                self._capture()

    def _step(self) -> torch.Tensor:
        """Embed self.token, run every block with the in-place state update, advance self.position."""
        logits, _ = decode_step(self.model, self.token, self.position, self.frequencies, self.layers, inplace=True,
                                packed=self.packed)
        self.position.add_(1)
        return logits

    def _capture(self) -> None:
        """Warm the step up on a side stream, then record it in a CUDA graph (the buffers restored after warm-up)."""
        snapshot = [None if s is None else s.clone() for s in self.layers], self.position.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (lazy caches, allocator)
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits = self._step()
        for buffer, saved in zip([*self.layers, self.position], [*snapshot[0], snapshot[1]]):
            if buffer is not None:  # the warm-up advanced the state: back to where the decoder started
                buffer.copy_(saved)
        self.graph = graph

    @torch.no_grad()
    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """Logits [B, vocab] of the next token ids [B, 1]; the state advances by one token."""
        self.token.copy_(token)
        self.offset += 1
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        return self._step()

    def state(self) -> RetNetState:
        """A copy of the current state (the decoder's own buffers keep changing)."""
        return RetNetState([None if s is None else s.clone() for s in self.layers], self.offset)


def _pick_token(logits: torch.Tensor, temperature: float, top_k: int | None, do_sample: bool) -> torch.Tensor:
    """Next token ids [B, 1] from last-position logits [B, V]."""
    if not do_sample:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1)


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


# ----------------------------------------------------------------------------------------------------------
# Published checkpoints: flash-linear-attention's RetNet (config.json + safetensors; fla-hub/retnet-1.3B-100B and
# siblings) and torchscale's RetNetDecoder state dict. Each becomes RetNet options plus our state-dict keys.

SHAPE_KEYS = ("dim", "depth", "heads")


def fla_options(config: dict[str, Any]) -> dict[str, Any]:
    """RetNet options equal to a flash-linear-attention RetNet ``config.json``; options we do not support are named
    (WeightsError) instead of being loaded into a different network."""
    from ..errors import WeightsError

    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_heads") if k not in config]
    if missing:
        raise WeightsError(f"This flash-linear-attention config.json lacks {', '.join(missing)}: it does not describe "
                           f"a RetNet (fla writes these keys in every RetNetConfig).")
    heads = int(config["num_heads"])
    unsupported = []
    checks = [("model_type", "retnet"), ("feature_map", None), ("use_short_conv", False), ("use_output_gate", True),
              ("hidden_act", "swish"), ("expand_k", 1), ("attnres_block_size", None), ("attn", None)]
    for key, supported in checks:
        value = config.get(key, supported)
        if value != supported and not (key == "expand_k" and float(value) == 1.0):
            unsupported.append(f"{key}={value!r} (supported: {supported!r})")
    if config.get("num_kv_heads") not in (None, heads):
        unsupported.append(f"num_kv_heads={config['num_kv_heads']} (grouped keys; supported: null or num_heads)")
    if unsupported:
        raise WeightsError(f"This flash-linear-attention config has options the zoo RetNet does not support: "
                           f"{'; '.join(unsupported)}.")
    dim = int(config["hidden_size"])
    ffn_dim = config.get("intermediate_size")
    if ffn_dim is None:  # fla's GatedMLP: 2/3 * hidden_ratio * hidden, rounded up to a multiple of 256
        ratio = config.get("hidden_ratio", 2)  # RetNetConfig's default is 2; GatedMLP takes None as 4
        ffn_dim = int(dim * (4 if ratio is None else ratio) * 2 / 3)
        ffn_dim = 256 * ((ffn_dim + 255) // 256)
    return {"vocab_size": int(config.get("vocab_size", 32000)), "dim": dim,
            "depth": int(config["num_hidden_layers"]), "heads": heads, "ffn_dim": int(ffn_dim),
            "value_factor": float(config.get("expand_v", 2.0)),
            "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
            "norm_eps": float(config.get("norm_eps", 1e-6)), "rope": "neox",
            "rope_theta": float(config.get("rope_theta", 10000.0)),
            "head_norm_affine": bool(config.get("elementwise_affine", True)), "decay": "torchscale"}


def rename_keys(state: dict[str, torch.Tensor], layer_prefix: str, layer_renames: dict[str, str],
                renames: dict[str, str]) -> dict[str, torch.Tensor]:
    """Another project's keys -> ours: ``<layer_prefix><i>.<rest>`` -> ``blocks.<i>.<rest>`` with the first matching
    prefix of `rest` renamed by `layer_renames`; other keys renamed by `renames` (or kept)."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.startswith(layer_prefix):
            index, rest = key.removeprefix(layer_prefix).split(".", 1)
            old = next((o for o in layer_renames if rest.startswith(o)), None)
            out[f"blocks.{index}.{layer_renames[old] + rest[len(old):] if old else rest}"] = tensor
        else:
            out[renames.get(key, key)] = tensor
    return out


def fla_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """flash-linear-attention RetNet keys -> ours (an older fused ``mlp.gate_proj`` of twice the width is split)."""
    renames = {"attn_norm": "retention.norm", "attn.o_proj": "retention.out_proj",
               "attn.g_norm_swish_gate.weight": "retention.head_norm_weight",
               "attn.g_norm.weight": "retention.head_norm_weight", "attn.": "retention.", "mlp_norm": "ffn.norm",
               "mlp.": "ffn."}
    out = rename_keys(state, "model.layers.", renames,
                      {"model.embeddings.weight": "embed.weight", "model.norm.weight": "norm.weight"})
    for key in [k for k in out if k.endswith("ffn.gate_proj.weight")]:
        up = key.replace("gate_proj", "up_proj")
        if up not in out:  # fused gate and up projections: first half gate, second half up
            out[key], out[up] = out[key].chunk(2, dim=0)
    return out


def torchscale_options(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """RetNet options of a torchscale ``RetNetDecoder`` state dict (sizes from the tensors; its rotary angles and
    decays are checked against ours). A state dict does not record every option: torchscale's defaults are assumed
    for those (``no_scale_embedding=True``, no ``deepnorm``); ``layernorm_embedding`` shows in its keys and is refused.
    An output projection equal to the embedding was tied (``share_decoder_input_output_embed``) and stays tied."""
    from ..errors import WeightsError

    if "layernorm_embedding.weight" in state:
        raise WeightsError("This torchscale checkpoint was trained with layernorm_embedding=True, which the zoo RetNet "
                           "does not support (a LayerNorm after the embedding).")

    dim = state["embed_tokens.weight"].shape[1]
    heads = state["retnet_rel_pos.decay"].shape[0] if "retnet_rel_pos.decay" in state else None
    if heads is None:
        raise WeightsError("This torchscale state dict has no retnet_rel_pos.decay, so its number of heads is unknown.")
    options = {"vocab_size": state["embed_tokens.weight"].shape[0], "dim": dim,
               "depth": 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers.")), "heads": int(heads),
               "ffn_dim": state["layers.0.ffn.fc1.weight"].shape[0],
               "value_factor": state["layers.0.retention.v_proj.weight"].shape[0] / dim,
               "tie_embeddings": "output_projection.weight" not in state or torch.equal(
                   state["output_projection.weight"], state["embed_tokens.weight"]),
               "rope": "torchscale", "decay": "torchscale"}
    decay = torch.tensor(decay_logs(options["heads"], "torchscale"), dtype=torch.float32)
    if not torch.allclose(state["retnet_rel_pos.decay"].float(), decay, atol=1e-6):
        raise WeightsError("This torchscale checkpoint's decays (retnet_rel_pos.decay) are not 1 - 2^(-5-h), the "
                           "only schedule torchscale writes that the zoo RetNet supports.")
    angle = rotary_frequencies(dim // options["heads"]).abs().float()
    if "retnet_rel_pos.angle" in state and not torch.allclose(state["retnet_rel_pos.angle"].float(), angle, rtol=1e-5):
        raise WeightsError("This torchscale checkpoint's rotary angles (retnet_rel_pos.angle) are not 1/10000^"
                           "linspace(0, 1, head_dim/2), the only ones the zoo RetNet supports.")
    return options


def torchscale_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torchscale RetNetDecoder keys -> ours: its GLU ``fc2(swish(fc1 x) * gate x)`` is our gate/up/down."""
    renames = {"retention_layer_norm": "retention.norm", "final_layer_norm": "ffn.norm", "ffn.fc1": "ffn.gate_proj",
               "ffn.gate": "ffn.up_proj", "ffn.fc2": "ffn.down_proj"}
    kept = {k: v for k, v in state.items() if not k.startswith("retnet_rel_pos.")}  # fixed buffers, checked above
    return rename_keys(kept, "layers.", renames, {"embed_tokens.weight": "embed.weight",
                                                  "output_projection.weight": "lm_head.weight",
                                                  "layer_norm.weight": "norm.weight"})


def foreign_format(state: dict[str, torch.Tensor], config: dict[str, Any] | None) -> str | None:
    """``fla`` or ``torchscale`` when the weights are in that format, else None (ours, or not a RetNet)."""
    if "model.embeddings.weight" in state or (config or {}).get("model_type") == "retnet":
        return "fla"
    if "embed_tokens.weight" in state and any(k.startswith("layers.0.retention.") for k in state):
        return "torchscale"
    return None


def read_foreign(arch: str, state: dict[str, torch.Tensor], config: dict[str, Any] | None,
                 overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """(options, our state dict) of flash-linear-attention or torchscale weights for the registered `arch`, or None
    when they are in neither format. Their sizes must be `arch`'s (or given as overrides); else the message names
    the registered size that fits."""
    from ..errors import WeightsError

    fmt = foreign_format(state, config)
    if fmt is None:
        return None
    if fmt == "fla":
        if config is None:
            raise WeightsError("flash-linear-attention weights need their config.json: pass the model folder (or hub "
                               "id) that holds config.json and the safetensors, not the weight file alone.")
        options, converted = fla_options(config), fla_state_dict(state)
    else:
        options, converted = torchscale_options(state), torchscale_state_dict(state)
    expected = {**{k: v for k, v in RETNET_SIZES[arch].items() if k in SHAPE_KEYS}, **overrides}
    found = {k: options[k] for k in SHAPE_KEYS}
    if any(expected.get(k) != v for k, v in found.items()):
        fits = [n for n, size in RETNET_SIZES.items() if all(size[k] == v for k, v in found.items())]
        hint = (f"use model {fits[0]}" if fits else
                f"build it with {', '.join(f'{k}={v}' for k, v in found.items())} as model options")
        raise WeightsError(f"These {fmt} weights are a RetNet of {', '.join(f'{k} {v}' for k, v in found.items())}, "
                           f"not {arch} ({', '.join(f'{k} {expected.get(k)}' for k in SHAPE_KEYS)}): {hint}.")
    return options, converted


def fla_form(model: RetNet) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, state dict) of `model` as a flash-linear-attention RetNet (``RetNetForCausalLM``), the inverse
    of :func:`fla_options` and :func:`fla_state_dict`: what ``zoo.export(model, folder, format="hf")`` writes.

    A layer whose retention and FFN sub-layers were both removed is left out (fla numbers the rest); fla's layers
    always have both, so a plan that removed one of them, and options fla's RetNet does not have (torchscale's
    interleaved rotary, the paper's linspace decays), are refused with what to do instead. fla's fused kernels are
    switched off in the config (``fuse_norm``, ``fuse_swiglu``, ``fuse_cross_entropy``: false, so the head norm's
    key is ``g_norm``): the same numbers from fla's unfused modules."""
    from ..errors import ExportError

    first = next((b.retention for b in model.blocks if isinstance(b.retention, MultiScaleRetention)), None)
    problems = []
    gone = [(isinstance(b.retention, nn.Identity), isinstance(b.ffn, nn.Identity)) for b in model.blocks]
    half = [f"blocks.{i}.{'retention' if retention else 'ffn'}" for i, (retention, ffn) in enumerate(gone)
            if retention != ffn]
    if half:
        problems.append(f"the plan removed single sub-layers ({', '.join(half)}), and fla's RetNet layers always have "
                        f"both: prune whole layers (both blocks.i.retention and blocks.i.ffn), or export this plan as "
                        f"ONNX / torch.export or a depthzoo checkpoint")
    if first is None:
        problems.append("every retention sub-layer was removed")
    elif first.rope != "neox":
        problems.append(f"rope={first.rope!r} (torchscale's interleaved rotary); fla's RetNet rotates halves: build "
                        f"the model with model.overrides.rope=neox (as models loaded from fla checkpoints are)")
    elif list(first.log_decays) != decay_logs(model.heads, "torchscale"):
        problems.append("decay='linspace' (the paper's experiments); fla's RetNet has torchscale's decays")
    elif first.rope_theta != 10000.0:
        problems.append(f"rope_theta={first.rope_theta:g}; fla's RetNet rotates with base 10000")
    if problems:
        raise ExportError(f"This RetNet cannot be written as a flash-linear-attention model: {'; '.join(problems)}.")
    kept = [i for i, b in enumerate(model.blocks) if not isinstance(b.retention, nn.Identity)]
    config = {"model_type": "retnet", "architectures": ["RetNetForCausalLM"], "hidden_size": model.dim,
              "num_hidden_layers": len(kept), "num_heads": model.heads, "num_kv_heads": None, "expand_k": 1,
              "expand_v": model.value_dim / model.dim, "intermediate_size": model.ffn_dim, "hidden_act": "swish",
              "use_short_conv": False, "use_output_gate": True, "feature_map": None, "attn": None,
              "elementwise_affine": first.head_norm_weight is not None, "norm_eps": model.norm.eps,
              "vocab_size": model.vocab_size, "tie_word_embeddings": model.tie_embeddings,
              "max_position_embeddings": int(getattr(model, "default_cfg", {}).get("input_size", (2048,))[0]),
              "fuse_norm": False, "fuse_swiglu": False, "fuse_cross_entropy": False,
              "torch_dtype": str(model.embed.weight.dtype).removeprefix("torch.")}
    sub = {"retention.norm": "attn_norm", "retention.out_proj": "o_proj", "retention.head_norm_weight": "g_norm.weight",
           "retention.": "", "ffn.norm": "mlp_norm", "ffn.": "mlp."}
    state: dict[str, torch.Tensor] = {"model.embeddings.weight": model.embed.weight,
                                      "model.norm.weight": model.norm.weight}
    for new, old in enumerate(kept):
        for key, tensor in model.blocks[old].state_dict().items():
            prefix = next(o for o in sub if key.startswith(o))
            rest = key[len(prefix):]
            name = sub[prefix] + rest if prefix != "retention." else rest
            if prefix.startswith("retention") and prefix != "retention.norm":
                name = "attn." + name
            state[f"model.layers.{new}.{name}"] = tensor
    if not model.tie_embeddings:
        state["lm_head.weight"] = model.lm_head.weight
    return config, {k: v.detach().contiguous() for k, v in state.items()}


# ----------------------------------------------------------------------------------------------------------
# Registered sizes.

GPT2_VOCAB = 50257

RETNET_SIZES: dict[str, dict[str, Any]] = {
    "retnet_tiny": dict(dim=64, depth=2, heads=2, vocab_size=256, chunk_size=16, context=64),
    "retnet_small": dict(dim=256, depth=6, heads=4, vocab_size=256, chunk_size=64, context=256),
    "retnet_base": dict(dim=512, depth=12, heads=4, vocab_size=256, chunk_size=128, context=512),
    "retnet_1_3b": dict(dim=2048, depth=24, heads=8, vocab_size=GPT2_VOCAB, chunk_size=512, context=2048),
    "retnet_2_7b": dict(dim=2560, depth=32, heads=10, vocab_size=GPT2_VOCAB, chunk_size=512, context=2048),
    "retnet_6_7b": dict(dim=4096, depth=32, heads=16, vocab_size=GPT2_VOCAB, chunk_size=512, context=2048),
}


def _cfg(name: str) -> dict[str, Any]:
    size = RETNET_SIZES[name]
    return {"input_size": (size["context"],), "vocab_size": size["vocab_size"], "chunk_size": size["chunk_size"]}


def _create(name: str, **kwargs: Any) -> RetNet:
    arch = {k: v for k, v in RETNET_SIZES[name].items() if k != "context"}
    return RetNet(**{**arch, **kwargs})


@register_model("retnet", task="language_model", **_cfg("retnet_tiny"))
def retnet_tiny(**kwargs: Any) -> RetNet:
    return _create("retnet_tiny", **kwargs)


@register_model("retnet", task="language_model", **_cfg("retnet_small"))
def retnet_small(**kwargs: Any) -> RetNet:
    return _create("retnet_small", **kwargs)


@register_model("retnet", task="language_model", **_cfg("retnet_base"))
def retnet_base(**kwargs: Any) -> RetNet:
    return _create("retnet_base", **kwargs)


@register_model("retnet", task="language_model", **_cfg("retnet_1_3b"))
def retnet_1_3b(**kwargs: Any) -> RetNet:
    return _create("retnet_1_3b", **kwargs)


@register_model("retnet", task="language_model", **_cfg("retnet_2_7b"))
def retnet_2_7b(**kwargs: Any) -> RetNet:
    return _create("retnet_2_7b", **kwargs)


@register_model("retnet", task="language_model", **_cfg("retnet_6_7b"))
def retnet_6_7b(**kwargs: Any) -> RetNet:
    return _create("retnet_6_7b", **kwargs)


register_family("retnet", task="language_model", reference="retnet_small", small="retnet_tiny", test_input_size=(16,),
                capabilities=("published_weights", "decode"))
