"""Any Hugging Face causal language model's depth (issue 61, first part: the Python API).

A decoder-only model that ``transformers.AutoModelForCausalLM`` builds keeps its decoder layers in one
``nn.ModuleList`` of ``config.num_hidden_layers`` modules of one class (``model.layers``, ``transformer.h``,
``gpt_neox.layers``, ``model.decoder.layers``): :func:`decoder_layers` finds it from the module structure, nothing
named per family. Each layer is a depth unit only once it is **proven**: on random tokens, in float64, the network
with the layer removed must equal the network with every parameter of that layer zeroed (its branches then add
nothing to the stream), within :data:`TOLERANCE` of the logits' scale (:func:`prove_layers`). A post-norm layer
(``LN(x + f(x))``), a layer that is not a residual around its input, or one whose forward does not take a removal,
fails, with why. Each layer's sub-layers (children with a weight matrix whose output is shaped like their input:
its attention and MLP) are proven the same way against their own parameters zeroed, and removed by
:func:`remove_sublayers` as :class:`ZeroOutput` (zeros, nothing computed), which no stock config can say.

:func:`remove_layers` takes proven layers out the way a stock config can say it: the list shortened, every
``layer_idx`` renumbered (the KV cache's slots), ``num_hidden_layers`` and every per-layer config list
(``layer_types``, ...) cut to the kept layers, layer-index lists (``mlp_only_layers``) renumbered.
:func:`save_stock` writes the result with ``save_pretrained`` (and the tokenizer), loads it back with
``AutoModelForCausalLM`` (no custom code) and keeps the folder only if its logits equal the pruned model's.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import PlanError, ZooError
from .depth import PassThrough, ZeroLike
from .discovery import _genericise

TOLERANCE = 1e-9  # float64: the removed and the zeroed network differ by at most this much of the logits' scale
SAVE_TOLERANCE = 1e-5  # the reloaded stock folder's logits against the pruned model's (float32)
TRUST = "with trust_remote_code=True (prune.py, train.py: +model.overrides.trust_remote_code=true)"
INDEX_LISTS = ("mlp_only_layers",)  # config lists that hold layer indices (renumbered), not one value per layer


@dataclass
class LayerProof:
    """One unit's proof (a decoder layer, ``kind="layer"``, or one of its sub-layers, ``kind="sublayer"``: a child
    module with a weight matrix whose output is shaped like its input, such as its attention or MLP): removable, the
    two networks' difference (of the logits' scale) and why not."""

    index: int
    name: str
    removable: bool
    error: float | None
    reason: str = ""
    kind: str = "layer"
    returns: tuple[bool, ...] | None = None  # the module's stream: one tensor (None), or where it is in its tuple


class ZeroOutput(ZeroLike):
    """A removed sub-layer: zeros shaped like its input (given by position or as ``hidden_states``), in the structure
    its module returned (a tensor, or a tuple whose other entries were None: an attention's unrequested weights),
    computing nothing. A :class:`~zoo.models.depth.ZeroLike`, so the zoo knows it for a removal."""

    def __init__(self, structure: tuple[bool, ...] | None, like: nn.Module | None = None):
        super().__init__(like)
        self.structure = structure  # None: a tensor; else per entry of the tuple, True where the stream was

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        stream = args[0] if args else kwargs["hidden_states"]
        return self.shaped(torch.zeros_like(stream))

    def shaped(self, value: torch.Tensor) -> Any:
        return value if self.structure is None else tuple(value if is_stream else None for is_stream in self.structure)


class StreamOutput(ZeroOutput):
    """A removed decoder layer: its input stream, in the structure the layer returned (Falcon's layers return
    ``(hidden_states, attention_weights)``)."""

    zeros = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.shaped(args[0] if args else kwargs["hidden_states"])


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The path and the list of `model`'s decoder layers: the one ModuleList of ``num_hidden_layers`` modules of one
    class. Raises :class:`ZooError` when there is none or more than one."""
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(count, int) or count < 1:
        raise ZooError(f"{type(model).__name__} has no config.num_hidden_layers: not a transformers causal LM whose "
                       f"decoder layers could be found")
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.ModuleList)
             and len(module) == count and len({type(layer) for layer in module}) == 1]
    if len(found) != 1:
        names = ", ".join(name for name, _ in found) or "none"
        raise ZooError(f"{type(model).__name__}: {len(found)} lists of {count} layers of one class ({names}); "
                       f"exactly one is its decoder layers")
    return found[0]


def _tokens(model: nn.Module, batch: int, length: int, seed: int) -> torch.Tensor:
    vocab = model.config.vocab_size
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens.to(next(model.parameters()).device), use_cache=False).logits


def _zeroed(module: nn.Module) -> nn.Module:
    """A copy of `module` with every parameter zero: its branch contributing nothing, as a proof compares against."""
    zeroed = copy.deepcopy(module)
    with torch.no_grad():
        for param in zeroed.parameters():
            param.zero_()
    return zeroed


def _twin(model: nn.Module, tokens: torch.Tensor, seed: int) -> tuple[nn.Module, float]:
    """A float64 copy of `model` in eval mode (float32 where its code does not run in float64: then the two networks
    must be equal exactly, a zero branch adding exactly nothing), its zero or tiny parameters drawn afresh as
    discovery draws them, and the tolerance of its proofs. Raises :class:`ZooError` when the model does not run on
    random tokens at all."""
    for dtype, tolerance in ((torch.float64, TOLERANCE), (torch.float32, 0.0)):
        twin = copy.deepcopy(model).to(dtype).eval()
        _genericise(twin, torch.Generator().manual_seed(seed))
        try:
            _logits(twin, tokens)
        except Exception as exc:  # noqa: BLE001 - code that fixes its own dtype: float32, exactly
            failure = exc
            continue
        return twin, tolerance
    raise ZooError(f"{type(model).__name__} does not run on random tokens {tuple(tokens.shape)} "
                   f"({type(failure).__name__}: {str(failure)[:160]})")


def _structures(model: nn.Module, names: list[str], tokens: torch.Tensor) -> dict[str, tuple[bool, ...] | None | str]:
    """For each named module, what :class:`ZeroOutput` must return in its place (seen in one forward), or why no
    zeros can stand for its output (a string)."""
    seen: dict[str, Any] = {}

    def hook(name: str) -> Any:
        def note(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            stream = args[0] if args else kwargs.get("hidden_states")
            shape = stream.shape if torch.is_tensor(stream) else None
            if torch.is_tensor(output):
                seen[name] = None if output.shape == shape else "its output is not shaped like its input"
            elif isinstance(output, tuple) and all(o is None or torch.is_tensor(o) for o in output) and sum(
                    torch.is_tensor(o) and o.shape == shape for o in output) == 1 and torch.is_tensor(output[0]):
                seen[name] = tuple(torch.is_tensor(o) and o.shape == shape for o in output)
            else:
                seen[name] = "its output is not one tensor shaped like its input (with Nones beside it)"
        return note

    handles = [model.get_submodule(n).register_forward_hook(hook(n), with_kwargs=True) for n in names]
    try:
        _logits(model, tokens)
    finally:
        for handle in handles:
            handle.remove()
    return {n: seen.get(n, "it is not called in a forward") for n in names}


def sublayers(layer: nn.Module) -> list[str]:
    """The children of a decoder layer that may be sub-layers: those holding a weight matrix (not norms)."""
    return [name for name, child in layer.named_children() if any(p.dim() >= 2 for p in child.parameters())]


def prove_layers(model: nn.Module, length: int = 16, seed: int = 0) -> list[LayerProof]:
    """Each decoder layer's proof (module docstring) on a float64 copy of `model` (:func:`_twin`), with parameters
    that were zero drawn afresh (so that no branch vanishes by its initialisation) and `seed`'s random tokens."""
    tokens = _tokens(model, 2, length, seed)
    twin, tolerance = _twin(model, tokens, seed)
    path, layers = decoder_layers(twin)
    returns = _structures(twin, [f"{path}.{i}" for i in range(len(layers))], tokens)
    proofs = []
    for index, layer in enumerate(list(layers)):
        name = f"{path}.{index}"
        try:
            layers[index] = _zeroed(layer)
            reference = _logits(twin, tokens)
            structure = returns[name]
            layers[index] = PassThrough(layer) if isinstance(structure, str) else StreamOutput(structure)
            removed = _logits(twin, tokens)
        except Exception as exc:  # noqa: BLE001 - a layer whose model does not take its removal
            proofs.append(LayerProof(index, name, False, None, f"the network with it removed does not run "
                                     f"({type(exc).__name__}: {str(exc)[:120]})"))
            continue
        finally:
            layers[index] = layer
        scale = float(reference.abs().max()) or 1.0
        error = float((removed - reference).abs().max()) / scale
        removable = bool(torch.isfinite(removed).all()) and error <= tolerance
        reason = "" if removable else (f"its removal is not the layer contributing nothing (they differ by "
                                       f"{error:.2g} of the logits' scale in {str(reference.dtype)[6:]}: a "
                                       f"post-norm or non-residual layer, or one that returns more than its stream)")
        proofs.append(LayerProof(index, name, removable, error, reason,
                                 returns=None if isinstance(structure, str) else structure))
    names = [f"{path}.{i}.{child}" for i, layer in enumerate(layers) for child in sublayers(layer)]
    structures = _structures(twin, names, tokens)
    for name in names:
        index = int(name[len(path) + 1:].split(".")[0])
        proofs.append(_prove_sublayer(twin, name, index, structures[name], tokens, tolerance))
    return proofs


def _prove_sublayer(twin: nn.Module, name: str, index: int, structure: Any, tokens: torch.Tensor,
                    tolerance: float) -> LayerProof:
    """A sub-layer's proof: the network with it returning zeros equals the network with its parameters zeroed."""
    if isinstance(structure, str):
        return LayerProof(index, name, False, None, structure, "sublayer")
    module = twin.get_submodule(name)
    try:
        twin.set_submodule(name, _zeroed(module))
        reference = _logits(twin, tokens)
        twin.set_submodule(name, ZeroOutput(structure))
        removed = _logits(twin, tokens)
    finally:
        twin.set_submodule(name, module)
    error = float((removed - reference).abs().max()) / (float(reference.abs().max()) or 1.0)
    removable = bool(torch.isfinite(removed).all()) and error <= tolerance
    reason = "" if removable else (f"its removal is not its branch contributing nothing (they differ by {error:.2g} "
                                   f"of the logits' scale in {str(reference.dtype)[6:]})")
    return LayerProof(index, name, removable, error, reason, "sublayer", structure)


def remove_sublayers(model: nn.Module, names: Iterable[str], proofs: Sequence[LayerProof] | None = None
                     ) -> nn.Module:
    """A copy of `model` whose sub-layers `names` return zeros and compute nothing (each proven removable; raises
    :class:`PlanError` otherwise). No stock config says this: :func:`save_stock` refuses the result."""
    proofs = {p.name: p for p in (proofs if proofs is not None else prove_layers(model)) if p.kind == "sublayer"}
    names = list(dict.fromkeys(names))
    bad = [n for n in names if n not in proofs or not proofs[n].removable]
    if bad:
        why = proofs[bad[0]].reason if bad[0] in proofs else "it is not a sub-layer of a decoder layer"
        allowed = [n for n, p in proofs.items() if p.removable]
        raise PlanError(f"sub-layer {bad[0]} cannot be removed: {why}; removable sub-layers: {allowed[:8]}"
                        f"{' ...' if len(allowed) > 8 else ''}")
    pruned = copy.deepcopy(model)
    tokens = _tokens(model, 1, 8, seed=0)
    structures = _structures(pruned.eval(), names, tokens)
    for name in names:
        pruned.set_submodule(name, ZeroOutput(structures[name]))
    return pruned


def remove_layers(model: nn.Module, remove: Iterable[int], proofs: Sequence[LayerProof] | None = None
                  ) -> nn.Module:
    """A copy of `model` without the decoder layers `remove` (indices), as a stock config says it (module
    docstring). Each must be proven removable (`proofs`, default: :func:`prove_layers`); raises :class:`PlanError`
    naming the ones that are not, and what may be removed."""
    path, layers = decoder_layers(model)
    drop = sorted(set(remove))
    bad = [i for i in drop if not isinstance(i, int) or not 0 <= i < len(layers)]
    if bad:
        raise PlanError(f"layer indices {bad} are not layers of {type(model).__name__} (0 to {len(layers) - 1})")
    if len(drop) == len(layers):
        raise PlanError(f"removing all {len(layers)} decoder layers leaves no network; keep at least one")
    proofs = [p for p in (proofs if proofs is not None else prove_layers(model)) if p.kind == "layer"]
    refused = [p for p in proofs if p.index in drop and not p.removable]
    if refused:
        allowed = [p.index for p in proofs if p.removable]
        raise PlanError(f"layer {refused[0].index} ({refused[0].name}) cannot be removed: {refused[0].reason}; "
                        f"removable layers: {allowed or 'none'}")
    pruned = cut_layers(copy.deepcopy(model), drop)
    check_removal(model, pruned, drop)
    return pruned


def cut_layers(model: nn.Module, drop: Sequence[int], path: str | None = None) -> nn.Module:
    """`model` itself without the decoder layers `drop` (of the list at `path`, default :func:`decoder_layers`'s), as
    a stock config says it: the list shortened, every ``layer_idx`` renumbered (the KV cache's slots), the config's
    per-layer lists cut (nothing is checked here)."""
    path = decoder_layers(model)[0] if path is None else path
    layers = model.get_submodule(path)
    kept = [layer for i, layer in enumerate(layers) if i not in drop]
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new_index
    model.set_submodule(path, nn.ModuleList(kept))
    _renumber_config(model.config, len(layers), list(drop))
    return model


def check_removal(model: nn.Module, pruned: nn.Module, drop: Sequence[int], length: int = 16) -> None:
    """Raise :class:`ZooError` unless `pruned` computes `model` with the layers `drop` contributing nothing (every
    parameter zeroed), within :data:`SAVE_TOLERANCE` of the logits' scale on random tokens: the removal as its config
    now says it (per-layer lists, cache slots) is the one proven."""
    zeroed = copy.deepcopy(model).eval()
    _, layers = decoder_layers(zeroed)
    for index in drop:
        layers[index] = _zeroed(layers[index])
    tokens = _tokens(model, 2, length, seed=2)
    ours, theirs = _logits(pruned.eval(), tokens).float(), _logits(zeroed, tokens).float()
    error = float((ours - theirs).abs().max()) / (float(theirs.abs().max()) or 1.0)
    if error > SAVE_TOLERANCE:
        raise ZooError(f"without layers {list(drop)} the model differs from those layers zeroed by {error:.2g} of the "
                       f"logits' scale (allowed {SAVE_TOLERANCE}): its config or cache slots do not say the removal")


def _renumber_config(config: Any, count: int, drop: list[int]) -> None:
    """Cut every per-layer list of `config` to the kept layers and renumber its layer-index lists."""
    keep = [i for i in range(count) if i not in drop]
    new_index = {old: new for new, old in enumerate(keep)}
    for key, value in config.to_dict().items():
        if key in INDEX_LISTS and isinstance(value, list):
            setattr(config, key, [new_index[i] for i in value if i in new_index])
        elif isinstance(value, list) and len(value) == count and key not in ("architectures",):
            setattr(config, key, [value[i] for i in keep])
    config.num_hidden_layers = len(keep)


def save_stock(model: nn.Module, folder: str | Path, tokenizer: Any = None, length: int = 16) -> tuple[Path, float]:
    """Write `model` (pruned by :func:`remove_layers`) as a folder ``AutoModelForCausalLM.from_pretrained`` loads
    with no custom code, with `tokenizer`'s files; kept only if the reloaded model's logits equal `model`'s within
    :data:`SAVE_TOLERANCE` of their scale (raises :class:`ZooError` otherwise, leaving nothing at `folder`). Returns
    the folder and that difference."""
    from transformers import AutoModelForCausalLM

    if any(isinstance(m, ZeroOutput) for m in model.modules()):
        raise ZooError("a model with removed sub-layers has no stock config (every layer of a stock model has its "
                       "attention and MLP); save whole-layer removals only, or save it as a checkpoint")
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        reloaded = AutoModelForCausalLM.from_pretrained(staging, trust_remote_code=False).eval()
        tokens = _tokens(model, 2, length, seed=1)
        ours, theirs = _logits(model.eval(), tokens).float(), _logits(reloaded, tokens).float()
        scale = float(ours.abs().max()) or 1.0
        error = float((ours - theirs).abs().max()) / scale if ours.shape == theirs.shape else float("inf")
        if error > SAVE_TOLERANCE:
            raise ZooError(f"the saved folder's logits differ from the pruned model's by {error:.2g} of their scale "
                           f"(allowed {SAVE_TOLERANCE}): its config does not say this model; nothing was written")
        if folder.exists():
            shutil.rmtree(folder)
        staging.replace(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder, error


def load(name_or_folder: str | Path, trust_remote_code: bool = False, dtype: torch.dtype = torch.float32
         ) -> nn.Module:
    """A causal LM from a local folder or a hub id (through the HF cache; ``HF_HUB_OFFLINE=1`` is respected), in
    eval mode. Refused, with what is allowed (:class:`ZooError`): a folder without ``config.json``, a config that is
    not a causal LM, one that needs custom code unless `trust_remote_code`, a hub id that cannot be fetched."""
    from transformers import AutoModelForCausalLM

    source = str(name_or_folder)
    load_config(source, trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=trust_remote_code)
    return model.eval()


def load_config(name_or_folder: str | Path, trust_remote_code: bool = False, **overrides: Any) -> Any:
    """The config of a causal LM folder or hub id (`overrides` set on it), refused as :func:`load` says."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    source = str(name_or_folder)
    folder = Path(source).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise ZooError(f"{folder} has no config.json: not a transformers model folder (save one with "
                       f"model.save_pretrained(folder), or give a hub id)")
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **overrides)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise ZooError(f"{source} needs its own code from the hub (its config's auto_map); run it only if you "
                           f"trust it, {TRUST}") from exc
        raise ZooError(f"{source}: {str(exc)[:300]}") from exc
    except OSError as exc:
        offline = " (HF_HUB_OFFLINE=1: only the local cache is read)" if _offline() else ""
        raise ZooError(f"{source} is neither a model folder nor a hub id that can be fetched{offline}: "
                       f"{str(exc)[:200]}") from exc
    if getattr(config, "auto_map", None) and not trust_remote_code:
        raise ZooError(f"{source} needs its own code (auto_map {sorted(config.auto_map)}); run it only if you trust "
                       f"it, {TRUST}")
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not getattr(config, "auto_map", None):
        raise ZooError(f"{source} is a {config.model_type!r} model, not a causal language model "
                       f"(AutoModelForCausalLM builds: {', '.join(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)[:12])}, "
                       f"...)")
    return config


def check_text_inputs(model: nn.Module, tokenizer: Any = None, context: int | None = None) -> None:
    """Refuse (:class:`ZooError`, with what is allowed) a tokenizer with more tokens than the model's embedding has
    rows, and a context longer than the model's positions (where its config has a limit)."""
    config = model.config
    vocab = config.vocab_size
    if tokenizer is not None and len(tokenizer) > vocab:
        raise ZooError(f"the tokenizer has {len(tokenizer)} tokens but the model embeds {vocab}: ids from {vocab} up "
                       f"would index no row; use the tokenizer the model was trained with")
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if context is not None and isinstance(limit, int) and context > limit:
        raise ZooError(f"a context of {context} tokens is longer than the model's {limit} positions; use at most "
                       f"{limit}")


def _offline() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


__all__ = ["LayerProof", "StreamOutput", "ZeroOutput", "check_removal", "check_text_inputs", "cut_layers",
           "decoder_layers", "load", "load_config",
           "prove_layers", "remove_layers", "remove_sublayers", "save_stock", "sublayers"]
