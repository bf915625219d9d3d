"""timm's model surface for feature extraction and memory, derived from one declaration per family.

A CNN family lists its ``feature_info`` as timm does (``module``, ``num_chs``, ``reduction`` of each stage output it
offers, in forward order; the same values as timm's model of the same name). From that list follow:

- ``forward_intermediates(x, indices=...)``: the outputs of those modules during ``forward_features`` (caught by
  forward hooks, so a pruned network, whose stages keep their modules and output shapes, works unchanged);
- ``zoo.create_model(name, features_only=True, out_indices=...)``: a backbone returning the stage outputs, built by
  timm's own ``FeatureListNet`` (:func:`features_only`);
- ``set_grad_checkpointing(True)``: the blocks a family runs through :func:`checkpoint_blocks` (when
  ``self.grad_checkpointing`` is set; never while scripting) are recomputed in the backward pass instead of keeping
  their activations (timm's ``checkpoint_seq``).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import ModelOptionError, first_line


def check_fraction(enable: bool | float) -> None:
    """A gradient-checkpointing setting is a bool or a share of the blocks in [0, 1] (0 is off, as in timm)."""
    if not isinstance(enable, bool) and not (isinstance(enable, (int, float)) and 0 <= enable <= 1):
        raise ModelOptionError(f"grad checkpointing={enable!r}: give true, false or the share of blocks to "
                               f"checkpoint in [0, 1].")


def take_indices(count: int, indices: int | Sequence[int] | None) -> list[int]:
    """timm's convention: None = all, an int n = the last n, a sequence = those (negative counts from the end);
    returned in forward order, each once."""
    if indices is None:
        return list(range(count))
    if isinstance(indices, numbers.Integral):
        if not 0 < int(indices) <= count:
            raise ModelOptionError(f"indices={indices}: there are {count} feature stages; take 1 to {count}.")
        return list(range(count - int(indices), count))
    chosen = [int(i) + count if int(i) < 0 else int(i) for i in indices]
    bad = [i for i, c in zip(indices, chosen) if not 0 <= c < count]
    if bad:
        raise ModelOptionError(f"indices {bad} are out of range: there are {count} feature stages (0 to {count - 1}).")
    return sorted(set(chosen))


def saved_storage_bytes(tensor: torch.Tensor) -> dict[int, int]:
    """``{storage address: bytes}`` of a tensor autograd saves: what it holds in memory, once per storage (several
    saved views of one storage, or one tensor saved by several operations, count once)."""
    storage = tensor.untyped_storage()
    return {storage.data_ptr(): storage.nbytes()}


def checkpoint_blocks(blocks: nn.Module, x: torch.Tensor, share: bool | float) -> torch.Tensor:
    """`blocks` (nested Sequentials flattened) with the first `share` of them (True: all) recomputed in the backward
    pass (timm's ``checkpoint_seq``); a plain call outside training or without gradients."""
    if not (blocks.training and torch.is_grad_enabled()):
        return blocks(x)
    from timm.models import checkpoint_seq

    flat = [m for child in blocks for m in (child if isinstance(child, nn.Sequential) else [child])]
    count = max(1, round((1.0 if share is True else float(share)) * len(flat)))
    x = checkpoint_seq(flat[:count], x)
    for module in flat[count:]:
        x = module(x)
    return x


class _StopForward(Exception):  # noqa: N818 - control flow, not an error: the last wanted stage has run
    def __init__(self, output: torch.Tensor):
        super().__init__()
        self.output = output


class FeatureMixin:
    """``forward_intermediates``, ``prune_intermediate_layers`` and gradient checkpointing from the family's
    ``feature_info`` (a list of dicts: module, num_chs, reduction), its ``feature_trunk`` (the top-level modules
    ``forward_features`` runs, in order) and its ``feature_norms`` (what it applies after the last stage). No
    class-level annotations here, so that the models stay scriptable."""

    grad_checkpointing = False
    feature_trunk = ()
    feature_norms = ()

    def set_grad_checkpointing(self, enable: bool | float = True) -> None:
        """Recompute blocks in the backward pass instead of storing their activations (training only). True: every
        block; a share in (0, 1]: the first blocks up to that share, which run at the highest resolution and so hold
        the most activation memory per unit of compute (a cheaper trade); 0 or False: off. As in timm, BatchNorm
        layers in recomputed blocks update their running statistics twice per step (outputs and gradients are
        unchanged)."""
        check_fraction(enable)
        self.grad_checkpointing = False if enable == 0 else enable

    def like_the_model(self, module: nn.Module) -> nn.Module:
        """`module` (a new classifier, say) on the device and in the dtype and mode of the model's parameters."""
        reference = next(self.parameters())
        return module.to(device=reference.device, dtype=reference.dtype).train(self.training)

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's ``prune_intermediate_layers``: what runs after the last of the stages `indices` is removed (each
        Sequential on the way to that stage keeps its children up to it, later trunk modules become empty), the final
        norm with it (at the last stage too with `prune_norm`) and the classifier with `prune_head`. Returns the
        stage indices in forward order, as ``forward_intermediates`` takes them."""
        chosen = take_indices(len(self.feature_info), indices)
        last = chosen[-1]
        path = self.feature_info[last]["module"].split(".")
        for name in self.feature_trunk[self.feature_trunk.index(path[0]) + 1:]:
            setattr(self, name, nn.Sequential())
        for depth in range(1, len(path)):
            parent = self.get_submodule(".".join(path[:depth]))
            if isinstance(parent, nn.Sequential):
                names = [name for name, _ in parent.named_children()]
                for name in names[names.index(path[depth]) + 1:]:
                    delattr(parent, name)  # (not `del parent[i]`, which renumbers named children)
        if prune_norm or last < len(self.feature_info) - 1:
            for name in self.feature_norms:
                setattr(self, name, nn.Identity())
        if prune_head:
            self.reset_classifier(0, "")
        return chosen

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's ``forward_intermediates``: the outputs of the ``feature_info`` stages `indices` (None: all, an int:
        the last n; in forward order) and, unless `intermediates_only`, the ``forward_features`` output. `norm`
        applies the final norm (where the family has one, e.g. BiT) to the last stage's output. `stop_early` stops
        after the last wanted stage; the final output is then that stage's output, as in timm."""
        if output_fmt != "NCHW":
            raise ModelOptionError(f"output_fmt={output_fmt!r}: only 'NCHW' is supported.")
        chosen = take_indices(len(self.feature_info), indices)
        caught: dict[int, torch.Tensor] = {}
        hooks = []

        def keep(index: int, output: torch.Tensor) -> None:
            caught[index] = output
            if stop_early and index == chosen[-1]:
                raise _StopForward(output)

        for index in chosen:
            module = self.get_submodule(self.feature_info[index]["module"])
            while isinstance(module, nn.Sequential) and len(module):  # its last block gives its output, and runs
                module = module[-1]  # even when checkpointing calls a stage's blocks one by one
            hooks.append(module.register_forward_hook(lambda _m, _a, out, index=index: keep(index, out)))
        try:
            final = self.forward_features(x)
        except _StopForward as stopped:
            final = stopped.output
        finally:
            for hook in hooks:
                hook.remove()
        last = len(self.feature_info) - 1
        final_norm = getattr(self, "norm", None)
        intermediates = [final_norm(caught[i]) if norm and i == last and final_norm is not None else caught[i]
                         for i in chosen]
        return intermediates if intermediates_only else (final, intermediates)


def feature_class(name: str | type) -> type:
    """timm's features wrapper named by ``feature_cls`` (``list``, ``dict``, ``hook``, ``fx``, ``getter``), as
    timm's builder reads it, or the class given."""
    from timm.models._features import FeatureDictNet, FeatureGetterNet, FeatureHookNet, FeatureListNet
    from timm.models._features_fx import FeatureGraphNet

    if isinstance(name, type):
        return name
    named = {"list": FeatureListNet, "dict": FeatureDictNet, "fx": FeatureGraphNet, "getter": FeatureGetterNet}
    key = str(name).lower()
    if "hook" in key:
        return FeatureHookNet
    if key not in named:
        raise ModelOptionError(f"feature_cls={name!r}; allowed: list, dict, hook, fx, getter (timm's feature "
                               f"wrappers).")
    return named[key]


def features_only(model: nn.Module, out_indices: int | Sequence[int] | None = None,
                  feature_cls: str | type = "list", feature_cfg: dict[str, Any] | None = None) -> nn.Module:
    """A backbone returning the stage outputs `out_indices` (default: the family's, as timm's; an int n: the last n)
    as timm's wrapper `feature_cls` builds it over the model's ``feature_info`` (``list``: ``FeatureListNet``, the
    default; ``dict``, ``hook``, ``fx``, ``getter``, as in timm; `feature_cfg` holds the wrapper's other settings);
    ``.feature_info`` gives channels and reductions. Its state-dict keys are the wrapper's (``blocks_0...`` for a
    list), not those of timm's backbone classes: load weights into the model before wrapping it
    (``create_model(..., pretrained=..., features_only=True)``)."""
    info = getattr(model, "feature_info", None)
    if not info:
        raise ModelOptionError(f"{getattr(model, 'zoo_name', type(model).__name__)} has no feature stages "
                               f"(features_only=True is for the CNN families).")
    settings = dict(feature_cfg or {})
    wrapper = feature_class(settings.pop("feature_cls", feature_cls))
    default = getattr(model, "feature_out_indices", tuple(range(len(info))))
    indices = tuple(take_indices(len(info), out_indices if out_indices is not None else list(default)))
    if wrapper.__name__ in ("FeatureListNet", "FeatureDictNet", "FeatureHookNet"):
        settings.setdefault("flatten_sequential", True)
    try:
        features = wrapper(model, out_indices=indices, **settings)
    except TypeError as exc:  # a setting the wrapper does not take
        raise ModelOptionError(f"feature_cfg={feature_cfg}: timm's {wrapper.__name__} refuses it "
                               f"({first_line(exc)}).") from None
    features.zoo_name = getattr(model, "zoo_name", None)
    features.default_cfg = features.pretrained_cfg = getattr(model, "default_cfg", {})
    return features


FEATURE_OPTIONS = ("feature_cls", "feature_cfg")  # timm's features_only options beside out_indices
WRAPPERS = ("FeatureListNet", "FeatureDictNet", "FeatureHookNet", "FeatureGetterNet", "FeatureGraphNet")


def _own_features_class(model: nn.Module, theirs: nn.Module, arch: str, options: dict[str, Any],
                        asked: dict[str, Any]) -> nn.Module:
    """timm's features model of an architecture that has a class of its own for it, built for real and given
    `model`'s weights (every one of its keys must come from `model`); a pruned model is refused (that class has
    no depth interface to remove its units)."""
    import timm

    if getattr(model, "zoo_plan", None):
        raise ModelOptionError(f"timm/{arch} builds its backbone form with a class of its own ({type(theirs).__name__})"
                               f", which cannot take a depth plan: use forward_intermediates on the pruned model.")
    device = next(model.parameters()).device
    with torch.device(device):
        features = timm.create_model(arch, pretrained=False, features_only=True, **options, **copy.deepcopy(asked))
    state = model.state_dict()
    missing = [k for k in features.state_dict() if k not in state]
    if missing:
        raise ModelOptionError(f"timm/{arch}: timm's {type(features).__name__} has weights the model has not "
                               f"({missing[:3]}...).")
    features.load_state_dict({k: state[k] for k in features.state_dict()})
    return features


def _wrapper_settings(theirs: nn.Module, asked: dict[str, Any]) -> dict[str, Any]:
    """The settings of timm's feature wrapper `theirs` that can be read back from it (the rest as `asked`)."""
    cfg = dict(asked.get("feature_cfg") or {})
    fmt = getattr(theirs, "output_fmt", "NCHW")
    settings: dict[str, Any] = {"output_fmt": getattr(fmt, "value", fmt)}
    name = type(theirs).__name__
    if name == "FeatureGetterNet":
        return {**settings, "out_indices": theirs.out_indices, "return_dict": theirs.return_dict, "norm": theirs.norm,
                "prune": cfg.get("prune", True), "out_map": theirs.out_map}
    settings["out_indices"] = tuple(theirs.feature_info.out_indices)
    if name == "FeatureGraphNet":
        return {**settings, "return_dict": theirs.return_dict, "out_map": cfg.get("out_map")}
    if name == "FeatureHookNet":
        return {**settings, "return_dict": theirs.return_dict, "out_map": cfg.get("out_map"),
                "no_rewrite": cfg.get("no_rewrite"), "default_hook_type": cfg.get("default_hook_type", "forward")}
    settings["feature_concat"] = theirs.concat
    return {**settings, "out_map": cfg.get("out_map")} if name == "FeatureDictNet" else settings


def timm_features(model: nn.Module, arch: str, options: dict[str, Any], out_indices: int | Sequence[int] | None,
                  feature_options: dict[str, Any]) -> nn.Module:
    """`model` (timm's `arch` built with `options`, pruned or not) wrapped as ``timm.create_model(arch,
    features_only=True, ...)`` wraps it: the wrapper class and its settings are read from timm's own build on the meta
    device (no weights), so the architecture's own feature config, ``feature_cls``, ``feature_cfg`` and
    `out_indices` mean what they mean in timm; the result must give timm's feature_info (channels, reductions) and
    its module names, else it is refused."""
    import timm
    from timm.models._builder import pretrained_cfg_for_features
    from timm.models._features import _module_list

    asked = {**feature_options, **({"out_indices": out_indices} if out_indices is not None else {})}
    try:
        with torch.device("meta"):  # a copy: timm's builder pops from the feature_cfg it is given
            theirs = timm.create_model(arch, pretrained=False, features_only=True, **options, **copy.deepcopy(asked))
    except Exception as exc:  # noqa: BLE001 - timm's own refusal of these options, in one line
        raise ModelOptionError(f"timm/{arch} with features_only=True and {asked or 'no other options'}: timm refuses "
                               f"them ({type(exc).__name__}: {first_line(exc)[:200]}).") from None
    if type(theirs).__name__ not in WRAPPERS:  # the architecture's own features class (MobileNetV3Features, ...)
        return _own_features_class(model, theirs, arch, options, asked)
    settings = _wrapper_settings(theirs, asked)
    if type(theirs).__name__ in ("FeatureListNet", "FeatureDictNet"):
        keys = list(theirs.keys())
        flat = [f for f in (False, True) if [n for n, _, _ in _module_list(model, f)][:len(keys)] == keys]
        if not flat:
            raise ModelOptionError(f"timm/{arch}: timm's feature wrapper takes modules {keys[:4]}..., which this "
                                   f"model does not have in that order.")
        settings["flatten_sequential"] = flat[0]
    features = type(theirs)(model, **settings)
    mine, timms = features.feature_info, theirs.feature_info
    if (mine.channels(), mine.reduction()) != (timms.channels(), timms.reduction()):
        raise ModelOptionError(f"timm/{arch}: the feature stages built here (channels {mine.channels()}) are not "
                               f"timm's ({timms.channels()}).")
    features.zoo_name = getattr(model, "zoo_name", None)
    features.default_cfg = features.pretrained_cfg = pretrained_cfg_for_features(getattr(model, "pretrained_cfg", {}))
    return features
