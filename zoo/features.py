"""timm's model surface for feature extraction and memory, derived from one declaration per family.

A CNN family lists its ``feature_info`` as timm does (``module``, ``num_chs``, ``reduction`` of each stage output it
offers, in forward order; the same values as timm's model of the same name). From that list follow:

- ``forward_intermediates(x, indices=...)``: the outputs of those modules during ``forward_features`` (caught by
  forward hooks, so a pruned network, whose stages keep their modules and output shapes, works unchanged);
- ``zoo.create_model(name, features_only=True, out_indices=...)``: a backbone returning the stage outputs, built by
  timm's own ``FeatureListNet`` (:func:`features_only`);
- ``set_grad_checkpointing(True)``: the blocks a family runs through :meth:`FeatureMixin.run_blocks` are each
  recomputed in the backward pass instead of keeping their activations (timm's ``checkpoint_seq``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .errors import ModelOptionError


def check_fraction(enable: bool | float) -> None:
    """A gradient-checkpointing setting is a bool or a share of the blocks in (0, 1]."""
    if not isinstance(enable, bool) and not (isinstance(enable, (int, float)) and 0 < enable <= 1):
        raise ModelOptionError(f"grad checkpointing={enable!r}: give true, false or the share of blocks to "
                               f"checkpoint in (0, 1].")


def take_indices(count: int, indices: int | Sequence[int] | None) -> list[int]:
    """timm's convention: None = all, an int n = the last n, a sequence = those (negative counts from the end)."""
    if indices is None:
        return list(range(count))
    if isinstance(indices, int):
        if not 0 < indices <= count:
            raise ModelOptionError(f"indices={indices}: there are {count} feature stages; take 1 to {count}.")
        return list(range(count - indices, count))
    chosen = [i + count if i < 0 else i for i in indices]
    bad = [i for i, c in zip(indices, chosen) if not 0 <= c < count]
    if bad:
        raise ModelOptionError(f"indices {bad} are out of range: there are {count} feature stages (0 to {count - 1}).")
    return chosen


class FeatureMixin:
    """``forward_intermediates`` and gradient checkpointing from the family's ``feature_info``."""

    feature_info: list[dict[str, Any]]
    grad_checkpointing: bool | float = False

    def set_grad_checkpointing(self, enable: bool | float = True) -> None:
        """Recompute blocks in the backward pass instead of storing their activations (training only). True: every
        block; a fraction in (0, 1]: the first blocks up to that share, which run at the highest resolution and so
        hold the most activation memory per unit of compute (a cheaper trade)."""
        check_fraction(enable)
        self.grad_checkpointing = enable

    def run_blocks(self, blocks: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """``blocks(x)``, or with (nested) blocks checkpointed when gradient checkpointing is on and training."""
        if self.grad_checkpointing and self.training and torch.is_grad_enabled() and not torch.jit.is_scripting():
            from timm.models import checkpoint_seq

            flat = [m for child in blocks for m in (child if isinstance(child, nn.Sequential) else [child])]
            share = 1.0 if self.grad_checkpointing is True else float(self.grad_checkpointing)
            count = max(1, round(share * len(flat)))
            x = checkpoint_seq(flat[:count], x)
            for module in flat[count:]:
                x = module(x)
            return x
        return blocks(x)

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's ``forward_intermediates``: the outputs of the ``feature_info`` stages `indices` (None: all, an int:
        the last n) and, unless `intermediates_only`, the ``forward_features`` output. `norm` applies the final
        norm (where the family has one, e.g. BiT) to the last stage's output. `stop_early` is accepted for
        compatibility; the whole ``forward_features`` runs."""
        if output_fmt != "NCHW":
            raise ModelOptionError(f"output_fmt={output_fmt!r}: only 'NCHW' is supported.")
        chosen = take_indices(len(self.feature_info), indices)
        caught: dict[int, torch.Tensor] = {}
        hooks = []
        for index in chosen:
            module = self.get_submodule(self.feature_info[index]["module"])
            while isinstance(module, nn.Sequential) and len(module):  # its last block gives its output, and runs
                module = module[-1]  # even when checkpointing calls a stage's blocks one by one
            hooks.append(module.register_forward_hook(
                lambda _m, _args, out, index=index: caught.__setitem__(index, out)))
        try:
            final = self.forward_features(x)
        finally:
            for hook in hooks:
                hook.remove()
        last = len(self.feature_info) - 1
        final_norm = getattr(self, "norm", None)
        intermediates = [final_norm(caught[i]) if norm and i == last and final_norm is not None else caught[i]
                         for i in chosen]
        return intermediates if intermediates_only else (final, intermediates)


def features_only(model: nn.Module, out_indices: Sequence[int] | None = None) -> nn.Module:
    """A backbone returning the stage outputs `out_indices` (default: the family's, as timm's) as a list: timm's
    ``FeatureListNet`` over the model's ``feature_info``; ``.feature_info`` gives channels and reductions."""
    from timm.models import FeatureListNet

    info = getattr(model, "feature_info", None)
    if not info:
        raise ModelOptionError(f"{getattr(model, 'zoo_name', type(model).__name__)} has no feature stages "
                               f"(features_only=True is for the CNN families).")
    default = getattr(model, "feature_out_indices", tuple(range(len(info))))
    indices = tuple(take_indices(len(info), list(out_indices) if out_indices is not None else list(default)))
    features = FeatureListNet(model, out_indices=indices, flatten_sequential=True)
    features.zoo_name = getattr(model, "zoo_name", None)
    features.default_cfg = features.pretrained_cfg = getattr(model, "default_cfg", {})
    return features
