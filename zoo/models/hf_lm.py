"""Any transformers causal LM as a zoo model: ``zoo.create_model("hf/<folder | hub id | packaged config>")``,
``python prune.py model=hf model.name=<folder> data=text``, ``python train.py model=hf model.name=tiny_llama``.

The model is transformers' own (:class:`HFCausalLM` holds it as ``lm``; its logits are the model's). Its depth units
are its decoder layers, each proven removable by :func:`zoo.models.hf_causal.prove_layers` (the network with the
layer replaced by the zoo's removal equals the network with every parameter of that layer zeroed) before it is
offered; a layer that returns more than its stream (Falcon's tuple) or fails its proof is kept, with why. A removed
layer is a :class:`~zoo.models.depth.PassThrough` while the model is pruned, searched and fine-tuned (a forward
without KV cache: the prefill workload); :meth:`HFCausalLM.stock_model` cuts the removed layers out the way a stock
config says it (the list shortened, ``layer_idx`` and per-layer config lists renumbered), and checks it computes the
same logits, for a folder ``AutoModelForCausalLM`` loads with no custom code (``prune.export=hf``).

``pretrained=True`` loads the folder's (or hub id's) weights; ``False`` builds its config with random weights (a
folder holding only ``config.json`` is a config to train, as the packaged ``tiny_llama`` is). Config fields may be
overridden as options: ``create_model("hf/tiny_llama", num_hidden_layers=4)``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import PlanError, ZooError
from . import hf_causal
from .depth import DepthMixin, DepthUnit
from .registry import ModelEntry, register_family, register_resolver

PREFIX = "hf/"
FAMILY = "hf"
PACKAGED = Path(__file__).parent / "hf_configs"  # configs shipped with the zoo: hf/<name> for each folder
CONTEXT = 128  # the default prompt length a model is built, proven and timed at (at most its positions)
EXPORT_TOLERANCE = hf_causal.SAVE_TOLERANCE
STEP_TOLERANCE = 1e-3  # a decode step's logits against the whole sequence's last token (float32, of their scale)


def source_of(name: str) -> str:
    """The folder or hub id of ``hf/<name>``: a local folder, else a packaged config's folder, else a hub id."""
    given = name.removeprefix(PREFIX)
    folder = Path(given).expanduser()
    if folder.is_dir():
        return str(folder.resolve())
    if (PACKAGED / given / "config.json").is_file():
        return str(PACKAGED / given)
    return given


def _positions(config: Any) -> int | None:
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return limit if isinstance(limit, int) else None


class KVState:
    """A decode step's starting point: the model's own KV cache (transformers' ``DynamicCache``) holding `context`
    tokens for every decoder layer, filled when it is made (a prefill of `context` tokens by the network it is made
    for, before any step: a hook on the network sees steps only). A latency table's networks share one state, each
    with other layers removed: the slot of a layer this network removed takes the keys and values of a kept layer of
    its kind (full or sliding-window attention) for `context` tokens, so that a network keeping that layer attends
    over what it would (the step's cost; its values are another layer's). Each layer appends to a throwaway copy of
    itself (:func:`_held`): the cache stays at `context` tokens, so one step can be timed again and again (the
    ``decode`` workload), and a layer timed alone on its captured inputs sees the same cache."""

    def __init__(self, lm: nn.Module, batch_size: int, context: int, device: Any = None):
        from transformers import DynamicCache

        self.batch_size, self.context = batch_size, context
        limit = _positions(lm.config)
        if limit is not None and context + 1 > limit:
            raise ZooError(f"a decode step after {context} tokens needs {context + 1} positions and "
                           f"{type(lm).__name__} has {limit}: use data.seq_len={limit - 1} or less")
        try:  # the prefill and one step, here, so that a cache this code cannot hold is refused before any timing
            tokens = torch.randint(0, lm.config.vocab_size, (batch_size, context + 1),
                                   generator=torch.Generator().manual_seed(0))  # random: zeros hide a model that
            # attends both ways (every position would see the same token)
            self.prompt = tokens[:, :-1]  # what the cache holds
            self.cache = self._prefilled(lm, DynamicCache(config=lm.config), self.prompt, device)
            with torch.no_grad():
                stepped = self.step(lm, tokens[:, -1:].to(device or next(lm.parameters()).device)).float()
                whole = lm(input_ids=tokens.to(next(lm.parameters()).device), use_cache=False).logits[:, -1:].float()
        except ZooError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the model's cache does not take, one answer
            raise ZooError(f"{type(lm).__name__}'s KV cache does not take a held decode step ({type(exc).__name__}: "
                           f"{str(exc)[:160]}): use prune.workload=forward") from None
        error = float((stepped - whole).abs().max()) / (float(whole.abs().max()) or 1.0)
        allowed = STEP_TOLERANCE if next(lm.parameters()).dtype == torch.float32 else 0.05  # (half precision)
        if not error <= allowed:
            raise ZooError(f"{type(lm).__name__}'s decode step after {context} cached tokens is not the next token's "
                           f"logits (it differs from the whole sequence's by {error:.2g} of their scale; a model that "
                           f"attends both ways, such as an encoder with a causal LM head, has no decode step): use "
                           f"prune.workload=forward")

    def _prefilled(self, lm: nn.Module, cache: Any, prompt: torch.Tensor, device: Any) -> Any:
        with torch.no_grad():
            lm(input_ids=prompt.to(next(lm.parameters()).device), cache=cache, use_cache=True)
        filled = [layer for layer in cache.layers if getattr(layer, "is_initialized", False)]
        if not filled:
            raise ZooError(f"{type(lm).__name__} keeps no KV cache in a forward with use_cache=True, so it has no "
                           f"decode step to time: use prune.workload=forward")
        for index, layer in enumerate(cache.layers):  # a removed layer's slot, for a network that keeps it
            if not getattr(layer, "is_initialized", False):
                cache.update(*_context_of(filled, layer, prompt.shape[1]), index)
        for layer in cache.layers:  # onto the device the steps run on
            for name in ("keys", "values"):
                if device is not None and torch.is_tensor(getattr(layer, name, None)):
                    setattr(layer, name, getattr(layer, name).to(device))
        cache.layers = [_held(layer) for layer in cache.layers]
        return cache

    def step(self, lm: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        """`lm`'s logits for `tokens` [B, 1] after the cached context."""
        positions = torch.arange(self.context, self.context + tokens.shape[1], device=tokens.device)
        return lm(input_ids=tokens, cache=self.cache, position_ids=positions.expand(tokens.shape[0], -1),
                  use_cache=True).logits


def _context_of(filled: list[Any], slot: Any, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of `context` tokens for an empty cache slot, from a filled layer of the slot's own kind where
    there is one (repeated along the tokens where that layer keeps fewer, as a sliding window does): the slot's own
    update then holds what its kind holds after `context` tokens (all of them, or its window), so the attention masks
    the model sizes from that slot, and a layer that attends over it, see the context they would."""
    same = [layer for layer in filled if type(layer) is type(slot)
            and getattr(layer, "sliding_window", None) == getattr(slot, "sliding_window", None)]
    source = (same or filled)[0]
    tokens = torch.arange(context, device=source.keys.device) % source.keys.shape[-2]
    return source.keys[..., tokens, :].clone(), source.values[..., tokens, :].clone()


def _held(layer: Any) -> Any:
    """A cache layer whose ``update`` appends to a throwaway copy: it returns the context and the new tokens' keys
    and values, as the layer's own update does, and keeps the context as it was (so a layer called again, alone on
    its captured inputs or in the next step, sees the same cache)."""
    twin = copy.copy(layer)
    twin.update = functools.partial(_update_copy, layer)
    return twin


def _update_copy(layer: Any, *args: Any, **kwargs: Any) -> Any:
    return copy.copy(layer).update(*args, **kwargs)


def stream_first(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """A sub-layer called with its stream as ``hidden_states=`` gets it by position instead (the same call), so
    that the zoo's forward hooks, which read a unit's first argument, see it."""
    if args or "hidden_states" not in kwargs:
        return None
    rest = dict(kwargs)
    return (rest.pop("hidden_states"),), rest


class HFCausalLM(DepthMixin, nn.Module):
    """A transformers causal LM (``lm``) with the zoo's depth interface: token ids [B, T] -> logits [B, T, vocab]
    (no KV cache: the prefill of a prompt), its proven decoder layers as the depth units."""

    task = "language_model"
    kv_cache = True  # its decode step's cost depends on the context held in its cache (the workload names it)

    def __init__(self, lm: nn.Module, proofs: Sequence[hf_causal.LayerProof], context: int, sublayers: bool = True):
        super().__init__()
        self.lm = lm
        self.layers_path = "lm." + hf_causal.decoder_layers(lm)[0]
        self.proofs = [p for p in proofs if p.kind == "layer"]
        self.sublayer_proofs = [p for p in proofs if p.kind == "sublayer"] if sublayers else []
        self.default_cfg = {"input_size": (context,)}
        for proof in self.sublayer_proofs:
            if proof.removable:
                lm.get_submodule(proof.name).register_forward_pre_hook(stream_first, with_kwargs=True)

    @property
    def vocab_size(self) -> int:
        return int(self.lm.config.vocab_size)

    def forward(self, input_ids: torch.Tensor, state: KVState | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] of token ids [B, T]: of the prompt (no cache), or after `state`'s context."""
        if state is not None:
            return state.step(self.lm, input_ids)
        return self.lm(input_ids=input_ids, use_cache=False).logits

    def decode_inputs(self, batch_size: int, context: int | None = None, device: Any = None) -> dict[str, Any]:
        """The forward keywords of one decode step after `context` tokens (default the model's) that every call
        starts from (the ``decode`` workload)."""
        return {"state": KVState(self.lm, batch_size, context or self.default_cfg["input_size"][0], device)}

    def example_input(self, batch_size: int = 1, input_size: Sequence[int] | None = None) -> torch.Tensor:
        """Zero token ids [batch, T] on the model's device (T from `input_size` or the default context)."""
        length = (input_size or self.default_cfg["input_size"])[0]
        device = next(self.parameters()).device
        return torch.zeros(batch_size, length, dtype=torch.long, device=device)

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        return [(f"{self.layers_path}.{p.index}", 0, p.index) for p in self.proofs]

    def depth_unit_specs(self) -> list[DepthUnit]:
        """Each decoder layer not removed yet (removable where its proof passed) and, inside it, each proven
        sub-layer (its attention, its MLP) not removed yet: removed as :meth:`removed_module` says, as proven."""
        layers = self.get_submodule(self.layers_path)
        units = []
        for proof in self.proofs:
            if isinstance(layers[proof.index], nn.Identity):
                continue
            units.append(DepthUnit(name=f"lm.{proof.name}", kind="block", stage=0, index=proof.index,
                                   removable=proof.removable))
            units += [DepthUnit(name=f"lm.{sub.name}", kind="sublayer", stage=0, index=proof.index, removable=True,
                                merge=(f"lm.{sub.name}",))
                      for sub in self.sublayer_proofs if sub.index == proof.index and sub.removable
                      and not isinstance(self.get_submodule(f"lm.{sub.name}"), nn.Identity)]
        return units

    def removed_module(self, path: str, old: nn.Module, zeros: bool = False) -> nn.Module:
        """A removed layer (its stream) or sub-layer (zeros), in the structure its proof saw it return, taking the
        stream by position or as ``hidden_states`` (:class:`~zoo.models.hf_causal.StreamOutput`, ``ZeroOutput``)."""
        proof = next((p for p in [*self.proofs, *self.sublayer_proofs] if f"lm.{p.name}" == path), None)
        if proof is None:
            raise PlanError(f"{path} is not a decoder layer or a proven sub-layer of {type(self.lm).__name__}")
        return (hf_causal.ZeroOutput if zeros else hf_causal.StreamOutput)(proof.returns, old)

    def refusals(self) -> dict[str, str]:
        """Why each decoder layer that is not removable is not."""
        return {f"lm.{p.name}": p.reason for p in self.proofs if not p.removable}

    def removed_layers(self) -> list[int]:
        layers = self.get_submodule(self.layers_path)
        return [i for i, layer in enumerate(layers) if isinstance(layer, nn.Identity)]

    def stock_model(self, length: int = 16) -> nn.Module:
        """A copy of ``lm`` without the removed decoder layers, as a stock config says it (``num_hidden_layers``,
        per-layer lists, ``layer_idx`` renumbered), checked to compute this model's logits (:class:`ZooError` if
        not). Every layer removed is refused: nothing would be left."""
        drop = self.removed_layers()
        if len(drop) == len(self.proofs):
            raise PlanError("every decoder layer is removed: no network is left to save")
        stock = hf_causal.cut_layers(copy.deepcopy(self.lm).eval(), drop, self.layers_path.removeprefix("lm."))
        tokens = torch.randint(0, self.vocab_size, (2, length), generator=torch.Generator().manual_seed(3))
        device = next(self.parameters()).device
        mode = self.training
        try:
            with torch.no_grad():
                ours = self.eval()(tokens.to(device)).float()
                theirs = stock(input_ids=tokens.to(device), use_cache=False).logits.float()
        finally:
            self.train(mode)
        error = float((ours - theirs).abs().max()) / (float(ours.abs().max()) or 1.0)
        if error > EXPORT_TOLERANCE:
            raise ZooError(f"without layers {drop} as its config says it, the model differs from the pruned one by "
                           f"{error:.2g} of the logits' scale (allowed {EXPORT_TOLERANCE})")
        return stock

    def save_stock(self, folder: str | Path, tokenizer: Any = None) -> tuple[Path, float]:
        """The stock folder of :meth:`stock_model` (with the tokenizer's files), kept only if it reloads with equal
        logits (:func:`zoo.models.hf_causal.save_stock`); the folder and its logits' difference."""
        return hf_causal.save_stock(self.stock_model(), folder, tokenizer)


def build(source: str, context: int | None = None, trust_remote_code: bool = False, weights: bool = False,
          sublayers: bool = True, **config: Any) -> HFCausalLM:
    """The causal LM at `source` (random weights from its config, or its own with `weights`), `config` fields
    overridden, its decoder layers proven. `sublayers`: offer each layer's attention and MLP as units too (False:
    whole layers only, all a stock config can say). On the meta device (the registry's class lookup) nothing is
    proven."""
    from transformers import AutoModelForCausalLM

    settings = hf_causal.load_config(source, trust_remote_code, **config)
    limit = _positions(settings)
    context = context or (min(CONTEXT, limit) if limit else CONTEXT)
    if weights:
        lm = AutoModelForCausalLM.from_pretrained(source, config=settings, trust_remote_code=trust_remote_code)
    else:
        lm = AutoModelForCausalLM.from_config(settings, trust_remote_code=trust_remote_code)
    lm = lm.float().eval()
    if next(lm.parameters()).is_meta:
        path, layers = hf_causal.decoder_layers(lm)
        return HFCausalLM(lm, [hf_causal.LayerProof(i, f"{path}.{i}", False, None) for i in range(len(layers))],
                          context)
    model = HFCausalLM(lm, hf_causal.prove_layers(lm, length=min(16, context)), context, sublayers)
    if weights:  # where the weights came from, as create_model records it for files it loads itself
        model.pretrained_source, model.pretrained_head_reset = source, False
    if not any(u.removable for u in model.depth_unit_specs()):
        first = next(iter(model.refusals().items()))
        raise ZooError(f"{source} cannot be depth-pruned: none of its decoder layers is removable ({first[0]}: "
                       f"{first[1]})")
    return model


def precheck(source: str, options: dict[str, Any], input_size: Sequence[int] | None = None) -> None:
    """What can be known before any work: the config loads as a causal LM (:func:`hf_causal.load_config`'s
    refusals) and the run's context (`input_size`, tokens) fits the model's positions."""
    own = ("context", "trust_remote_code", "weights")
    settings = hf_causal.load_config(source, bool(options.get("trust_remote_code", False)),
                                     **{k: v for k, v in options.items() if k not in own})
    limit = _positions(settings)
    if input_size and limit and input_size[0] > limit:
        raise ZooError(f"data.seq_len={input_size[0]} is longer than the {limit} positions of {source}; use "
                       f"data.seq_len={limit} or less")


def resolve(name: str) -> ModelEntry | None:
    """The registry entry of ``hf/<folder | hub id | packaged config>`` (None for other names)."""
    if not name.startswith(PREFIX):
        return None
    source = source_of(name)
    settings = hf_causal.load_config(source)
    limit = _positions(settings)
    context = min(CONTEXT, limit) if limit else CONTEXT
    return ModelEntry(name, FAMILY, functools.partial(build, source),
                      {"input_size": (context,), "vocab_size": settings.vocab_size}, "language_model",
                      functools.partial(precheck, source))


def packaged() -> list[str]:
    """The configs shipped with the zoo, as ``hf/<name>``."""
    return sorted(PREFIX + p.parent.name for p in PACKAGED.glob("*/config.json"))


_EAGER = ("a transformers model is timed in eager PyTorch here: use prune.runtime=eager (and serve the stock folder, "
          "prune.export=hf, in the runtime you use)")
HF_DEPLOY = {
    "runtime": {"eager": None, "compile": _EAGER, "onnxruntime": _EAGER, "tensorrt": _EAGER},
    "export": {"onnx": None, "torch_export": None, "hf": None},
    "quantize": {"int8": "prune.quantize=int8 covers image classifiers: use prune.quantize=null"},
    "workload": {"forward": None, "decode": None},
}

register_resolver(resolve)
register_family(FAMILY, task="language_model", reference="hf/tiny_llama", small="hf/tiny_llama",
                test_input_size=(16,), small_options={"num_hidden_layers": 3}, deploy=HF_DEPLOY, dynamic=True)

__all__ = ["HFCausalLM", "KVState", "build", "packaged", "resolve", "source_of"]
