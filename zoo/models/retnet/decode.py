"""RetNet decoding at a constant cost per token: the step as a pure function (:func:`decode_step`), its INT8 weights
(:class:`Int8Projection`), and :class:`RecurrentDecoder` (the state preallocated and updated in place, packed
projections, no host sync per token; on CUDA the step captured in a CUDA graph)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .layers import MultiScaleRetention, RetNetInputError, RetNetState, project
from .ops import (
    rotary_frequencies,
)


class RecurrentStep(nn.Module):
    """One decode step through the public API, ``model(token, mode="recurrent", state=...)``, as a module: token ids
    [B, 1] -> their logits [B, vocab], each call continuing the previous one's state (decoding). One step timed again
    and again from the same state (the ``decode`` workload) is :class:`zoo.jobs.final_timing.DecodeStep`'s."""

    def __init__(self, model: nn.Module, state: RetNetState):
        super().__init__()
        self.model, self.state = model, state

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        logits, self.state = self.model(token, mode="recurrent", state=self.state, return_state=True)
        return logits[:, -1]


def decode_frequencies(model: nn.Module) -> torch.Tensor | None:
    """The signed rotary frequencies [1, d_k] (fp64) that :func:`decode_step` turns by the position; None when no
    retention sub-layer is left."""
    first = next((b.retention for b in model.blocks if isinstance(b.retention, MultiScaleRetention)), None)
    if first is None:
        return None
    return rotary_frequencies(first.key_dim, first.rope_theta, first.rope).to(model.embed.weight.device)[None]


def decode_step(model: nn.Module, token: torch.Tensor, position: torch.Tensor, frequencies: torch.Tensor | None,
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


DECODE_QUANTIZE = (None, "int8")


def check_decode_quantize(model: nn.Module, quantize: str | None, graph: bool) -> None:
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

    def __init__(self, model: nn.Module, state: RetNetState, batch_size: int, graph: bool = False,
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

