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
is importable. A one-token decode step stays on the PyTorch path (measured in docs/benchmarks.md).

Speed: the decay matrices and rotary tables are made once per length, device and dtype and shared by every layer
and call (:func:`decay_tables`, :func:`rotary_cache`), and a forward without ``return_state`` computes no state.
A one-token recurrent call without autograd takes :meth:`MultiScaleRetention.step`: the recurrent form's arithmetic
(bit for bit) in fewer operations. ``generate`` decodes with :class:`RecurrentDecoder`: the state preallocated and
updated in place, packed projections, no host sync per token, and on CUDA the step captured in a CUDA graph.
Prompts of different lengths decode in one batch (left padding: a padding token's key is zero).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..depth import DepthMixin
from ..features import check_fraction
from ..registry import register_family, register_model
from .config import DECAYS, DECODES, MODES, RETNET_SIZES, ROPES
from .convert import fla_form, read_foreign
from .decode import RecurrentDecoder, RecurrentStep
from .forms import ParallelForm, RecurrentForm
from .layers import (
    GatedFFN,
    Int8Projection,
    MultiScaleRetention,
    RetNetBlock,
    RetNetInputError,
    RetNetState,
    RMSNorm,
    _check_chunk_size,
    _check_mask,
    _shapes_text,
)


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

    def decode_inputs(self, batch_size: int, context: int | None = None, device: Any = None) -> dict[str, Any]:
        """The forward keywords of one decode step that every call starts from (the ``decode`` workload): the
        recurrent form from the empty state (a RetNet's step costs the same at any context)."""
        state = self.init_state(batch_size)
        return {"mode": "recurrent", "state": state if device is None else state.to(device)}

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


def _pick_token(logits: torch.Tensor, temperature: float, top_k: int | None, do_sample: bool) -> torch.Tensor:
    """Next token ids [B, 1] from last-position logits [B, V]."""
    if not do_sample:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1)


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


_EAGER_ONLY = ("RetNet's forward checks its token ids on the host, a data-dependent branch that torch.compile and "
               "torch.export cannot trace, so its latency table is timed in eager PyTorch: use prune.runtime=eager "
               "(and ship an exported program with prune.export=onnx or torch_export)")
RETNET_DEPLOY = {
    "runtime": {"eager": None, "compile": _EAGER_ONLY, "onnxruntime": _EAGER_ONLY, "tensorrt": _EAGER_ONLY},
    "export": {"onnx": None, "torch_export": None, "hf": None},
    "quantize": {"int8": "prune.quantize=int8 covers image classifiers (onnxruntime's static INT8); a RetNet decodes "
                         "with 8-bit weights through generate(..., quantize='int8') instead: use prune.quantize=null"},
    "workload": {"forward": None, "decode": None},
}


def hf_refusal(options: dict[str, Any]) -> str | None:
    """Why a RetNet built with these options cannot be written as a flash-linear-attention model folder (None: it
    can): the conditions :func:`~zoo.models.retnet.convert.fla_form` checks on the model, known from the options."""
    if options.get("rope", "torchscale") != "neox":
        return ("a flash-linear-attention model rotates halves (rope=neox); this RetNet is built with torchscale's "
                "interleaved rotary: add +model.overrides.rope=neox (models loaded from fla checkpoints have it)")
    if options.get("decay", "torchscale") != "torchscale":
        return "fla's RetNet has torchscale's decays; this one is built with decay=linspace"
    if float(options.get("rope_theta", 10000.0)) != 10000.0:
        return f"fla's RetNet rotates with base 10000; this one is built with rope_theta={options['rope_theta']}"
    return None


register_family("retnet", task="language_model", reference="retnet_small", small="retnet_tiny", test_input_size=(16,),
                capabilities=("published_weights", "decode"), deploy=RETNET_DEPLOY,
                option_checks={"export:hf": hf_refusal})

