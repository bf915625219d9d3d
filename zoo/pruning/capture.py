"""What a segment receives and returns inside the running network, and modules that replay it.

The latency table times each segment variant on the input its segment really receives (:func:`capture_segments`)
and times the fixed part with every segment replaying its captured output (:func:`replay_model`);
:class:`zoo.pruning.importance.PlanLoss` replays the outputs of the segments a plan shares with the plan scored before
it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import PlanError
from .surgery import Segment


@dataclass
class Capture:
    """What one segment receives and returns inside the network (for isolated timing and for replay)."""

    args: tuple
    kwargs: dict[str, Any]
    output: Any = None


class Replay(nn.Module):
    """Stands in for a segment when timing the fixed part: returns the segment's captured output."""

    def __init__(self, output: Any):
        super().__init__()
        self.output = output

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.output

    def extra_repr(self) -> str:
        return describe(self.output)


def describe(value: Any) -> str:
    """Shapes, dtypes and layouts of the tensors in `value`, and the repr of anything else (for cache keys)."""
    if torch.is_tensor(value):
        layout = "cl" if value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last) else "c"
        return f"T{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}:{layout}"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(describe(v) for v in value) + ")"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}={describe(v)}" for k, v in sorted(value.items())) + "}"
    if hasattr(value, "__dataclass_fields__"):
        return type(value).__name__ + describe({k: getattr(value, k) for k in value.__dataclass_fields__})
    return repr(value)[:200]


def clone_tree(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(clone_tree(v) for v in value)
    if isinstance(value, Mapping):
        return {k: clone_tree(v) for k, v in value.items()}
    return value


def capture_segments(model: nn.Module, segs: Sequence[Segment], example: Any,
                     forward_kwargs: Mapping[str, Any]) -> list[Capture]:
    """Inputs and output of every segment in one hooked forward of ``model(example, **forward_kwargs)``."""
    captures: dict[str, Capture] = {}
    handles = []
    for seg in segs:
        module = model.get_submodule(seg.name)

        def pre(mod: nn.Module, args: tuple, kwargs: dict, name: str = seg.name) -> None:
            captures.setdefault(name, Capture(clone_tree(args), clone_tree(kwargs)))

        def post(mod: nn.Module, args: tuple, output: Any, name: str = seg.name) -> None:
            if captures[name].output is None:
                captures[name].output = clone_tree(output)

        handles += [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)]
    try:
        model(example, **forward_kwargs)
    finally:
        for h in handles:
            h.remove()
    missing = [s.name for s in segs if s.name not in captures]
    if missing:
        raise PlanError(f"Segments {missing[:5]} were not called in the forward pass, so they cannot be timed.")
    return [captures[s.name] for s in segs]


def replay_model(model: nn.Module, segs: Sequence[Segment], captures: Sequence[Capture]) -> nn.Module:
    """A copy of `model` whose segments replay their captured outputs (the model itself is left as it was)."""
    originals = [model.get_submodule(s.name) for s in segs]
    try:
        for seg, cap in zip(segs, captures):
            model.set_submodule(seg.name, Replay(cap.output))
        return copy.deepcopy(model)
    finally:
        for seg, module in zip(segs, originals):
            model.set_submodule(seg.name, module)
