"""What :func:`zoo.export` traces of a RetNet (``model.export_form(form)``): the parallel form over token ids, or the
recurrent decode step as a pure function of token, position and states."""

from __future__ import annotations

import torch
from torch import nn

from .decode import decode_frequencies, decode_step
from .layers import MultiScaleRetention


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

