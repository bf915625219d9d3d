"""Importance of each segment variant, measured one variant at a time on a calibration split.

Scores (``damage``: how much a variant hurts when applied alone; the search minimises its sum):

* ``loss``: increase of the calibration loss;
* ``tempered`` (default): increase of the calibration loss at its best temperature (:class:`LossTally`), blind to
  the scale of a classifier's logits, which a removal often changes and fine-tuning restores in a few steps (a
  language model's loss is its metric, so it is scored plainly);
* ``similarity``: label-free, ``1 - cosine similarity`` of the network's outputs before and after;
* ``finetune``: as published (Kim et al., LayerMerge), the calibration loss after a few fine-tuning steps
  with the variant applied; expensive, off by default;
* ``block_influence``: ShortGPT's Block Influence (Men et al., 2024), one shot: each unit's ``1 - cosine`` of its
  input and output (over the feature dimension, averaged over positions and the calibration batches); a variant's
  damage is the sum over the units it removes.

:func:`unit_io` and :func:`angular_distance` give the unit inputs and outputs behind these rules and the angular
distance of Gromov et al. (2024) between a run's input and output (``prune.search=angular``).

Results are cached per (weights, score, calibration batches, segments) as sealed JSON, written atomically.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from filelock import FileLock
from torch import nn

from ..errors import CorruptFileError, ZooError
from ..files import json_digest, read_sealed_json, write_sealed_json
from .capture import Replay, clone_tree
from .surgery import Segment, apply_plan

_log = logging.getLogger(__name__)
Batch = tuple[torch.Tensor, torch.Tensor]
SCORES = ("loss", "tempered", "similarity", "finetune", "block_influence")
LOSS_SCORES = ("loss", "tempered")  # scores that are a calibration loss (``tempered``: at its best temperature)
TEMPERATURES = tuple(2.0 ** (i / 4) for i in range(-16, 33))  # 1/16 .. 256 in steps of 2^(1/4)


def task_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for classification ``[B, C]`` or language modelling ``[B, T, V]`` logits."""
    if logits.ndim == 3:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    return F.cross_entropy(logits.float(), targets)


class LossTally:
    """The mean task loss over batches (each weighted by its number of samples); with `tempered`, for a classifier,
    the least over :data:`TEMPERATURES` of the mean loss of ``logits / T``: temperature scaling (Guo et al., 2017),
    one scalar per network fitted on these batches. Top-1 does not see the logits' scale, so a removal that scales
    them (an activation linearised in a MobileNetV2 block) scores by the ranking it keeps, which a short fine-tune,
    rescaling first, recovers. A language model's logits ``[B, T, V]`` are scored plainly: its metric is the loss,
    scale included."""

    def __init__(self, tempered: bool = False):
        self.temperatures = TEMPERATURES if tempered else (1.0,)
        self.totals = [0.0] * len(self.temperatures)
        self.count = 0

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Count one batch's loss at every temperature."""
        if len(self.temperatures) == 1 or logits.ndim == 3:
            losses = [task_loss(logits, targets).item()] * len(self.temperatures)
        else:
            losses = [task_loss(logits.float() / temperature, targets).item() for temperature in self.temperatures]
        for i, loss in enumerate(losses):
            self.totals[i] += loss * len(targets)
        self.count += len(targets)

    def value(self) -> float:
        """The mean loss so far, at the best temperature."""
        return min(self.totals) / max(self.count, 1)


@torch.no_grad()
def calibration_loss(model: nn.Module, batches: Sequence[Batch], tempered: bool = False) -> float:
    """Mean task loss of `model` (eval mode) over the calibration batches (`tempered`: see :class:`LossTally`)."""
    model.eval()
    tally = LossTally(tempered)
    for inputs, targets in batches:
        tally.add(model(inputs), targets)
    return tally.value()


@torch.no_grad()
def _outputs(model: nn.Module, batches: Sequence[Batch]) -> list[torch.Tensor]:
    model.eval()
    return [model(inputs).float().flatten(1) for inputs, _ in batches]


def _similarity_damage(reference: list[torch.Tensor], model: nn.Module, batches: Sequence[Batch]) -> float:
    outs = _outputs(model, batches)
    sims = [F.cosine_similarity(a, b, dim=1).mean().item() for a, b in zip(reference, outs)]
    return 1.0 - sum(sims) / len(sims)


def _finetuned_loss(model: nn.Module, train_batches: Sequence[Batch], batches: Sequence[Batch],
                    steps: int, lr: float) -> float:
    """Calibration loss after `steps` SGD steps on `train_batches` (the variant linearised, unmerged)."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        inputs, targets = train_batches[step % len(train_batches)]
        loss = task_loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return calibration_loss(model, batches)


def _first_tensor(value: Any) -> torch.Tensor:
    return value if torch.is_tensor(value) else value[0]  # a RetNet retention sub-layer returns (x, state)


@torch.no_grad()
def unit_io(model: nn.Module, names: Sequence[str], batches: Sequence[Batch]
            ) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Input and output of each named module (a unit) on every calibration batch, from one forward per batch."""
    model.eval()
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {name: [] for name in names}
    handles = [model.get_submodule(name).register_forward_hook(
        lambda mod, args, out, name=name: seen[name].append((_first_tensor(args).detach().float(),
                                                             _first_tensor(out).detach().float())))
        for name in names]
    try:
        for inputs, _ in batches:
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def feature_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of a and b over the feature dimension at every position: channels of [B, C, H, W]
    activations, the last dimension of [B, T, D] (or [B, D]) hidden states."""
    return F.cosine_similarity(a, b, dim=1 if a.dim() == 4 else -1)


def block_influence(model: nn.Module, names: Sequence[str], batches: Sequence[Batch]) -> dict[str, float]:
    """ShortGPT's Block Influence of each unit: 1 - mean cosine of its input and output (positions, batches)."""
    seen = unit_io(model, names, batches)
    return {name: 1.0 - torch.cat([feature_cosine(a, b).flatten() for a, b in pairs]).mean().item()
            for name, pairs in seen.items()}


def angular_distance(first_inputs: Sequence[torch.Tensor], last_outputs: Sequence[torch.Tensor]) -> float:
    """Gromov et al.'s angular distance, arccos(cosine) / pi averaged over positions and batches, between a run's
    input (of its first unit) and its output (of its last unit)."""
    cosines = torch.cat([feature_cosine(a, b).flatten() for a, b in zip(first_inputs, last_outputs)])
    return (torch.arccos(cosines.clamp(-1.0, 1.0)) / math.pi).mean().item()


class PlanLoss:
    """Calibration loss of whole plans, fast enough for a search to score hundreds of them.

    One working copy of the model; each segment variant's module is built once
    (:func:`zoo.pruning.surgery.build_segment`,
    merged as ``merge`` says) and swapped in where a plan differs from the plan scored before, so scoring a plan is
    a forward pass over the batches, not a copy of the model. ``self(removed units)`` equals
    ``calibration_loss(apply_plan(model, {"remove": removed, "merge": merge}), batches)``; results are memoised.

    A full forward also keeps every segment's output (the *anchor*, while they fit in `replay_mb`); a later plan
    that first differs from the anchor at segment ``f`` replays the outputs of segments ``0 .. f-1`` instead of
    computing them. A search that scores the neighbours of one plan (each with one segment changed) therefore
    scores them from the last segment back: the first is a full forward, every other one starts at its change.
    With `tempered`, each plan's loss is at its best temperature (:class:`LossTally`).
    """

    def __init__(self, model: nn.Module, segments: Sequence[Segment], batches: Sequence[Batch], merge: bool = True,
                 replay_mb: float = 1024.0, tempered: bool = False):
        from .surgery import build_segment

        self.model, self.segments, self.batches, self.merge = model, list(segments), list(batches), merge
        self.tempered = tempered
        self.work = copy.deepcopy(model).eval()
        self.installed = [frozenset()] * len(self.segments)
        self.built: dict[tuple[int, frozenset[str]], nn.Module] = {
            (i, frozenset()): self.work.get_submodule(seg.name) for i, seg in enumerate(self.segments)}
        self._build = build_segment
        self.memo: dict[frozenset[str], float] = {}
        self.evaluations = self.replayed = 0  # forward passes, and those that started at a change
        self.replay_mb = replay_mb
        self.anchor: tuple[list[frozenset[str]], list[list[Any]]] | None = None  # variants, outputs per batch

    def _module(self, index: int, variant: frozenset[str]) -> nn.Module:
        if (index, variant) not in self.built:
            self.built[index, variant] = self._build(self.model, self.segments[index], variant, self.merge).eval()
        return self.built[index, variant]

    def variants(self, removed: frozenset[str]) -> list[frozenset[str]]:
        """The variant of every segment in a set of removed units (raises ZooError for a unit in no segment)."""
        inside = [frozenset(u for u in removed if u == seg.name or u.startswith(seg.name + "."))
                  for seg in self.segments]
        unknown = removed - frozenset().union(*inside)
        if unknown:
            raise ZooError(f"Units {sorted(unknown)} lie in no segment of the model.")
        return [seg.variant_of(units) for seg, units in zip(self.segments, inside)]

    def __call__(self, removed: frozenset[str] | Sequence[str]) -> float:
        removed = frozenset(removed)
        if removed not in self.memo:
            variants = self._install(removed)
            shared = 0
            if self.anchor is not None:
                while shared < len(variants) and variants[shared] == self.anchor[0][shared]:
                    shared += 1
            self.memo[removed] = self._replayed(shared) if shared else self._anchored(variants)
            self.evaluations += 1
            self.replayed += bool(shared)
        return self.memo[removed]

    def _install(self, removed: frozenset[str]) -> list[frozenset[str]]:
        """Swap into the working copy each segment's variant for `removed` where it differs; returns the variants."""
        variants = self.variants(removed)
        for i, (seg, variant) in enumerate(zip(self.segments, variants)):
            if variant != self.installed[i]:
                self.work.set_submodule(seg.name, self._module(i, variant))
                self.installed[i] = variant
        return variants

    @torch.no_grad()
    def _anchored(self, variants: list[frozenset[str]]) -> float:
        """A full forward that keeps every segment's output as the new anchor (dropped above `replay_mb`)."""
        outputs: list[list[Any]] = [[] for _ in self.segments]
        handles = [self.work.get_submodule(seg.name).register_forward_hook(
            lambda mod, args, out, i=i: outputs[i].append(clone_tree(out))) for i, seg in enumerate(self.segments)]
        try:
            loss = calibration_loss(self.work, self.batches, self.tempered)
        finally:
            for handle in handles:
                handle.remove()
        size = sum(t.numel() * t.element_size() for per_batch in outputs for out in per_batch
                   for t in tensors_in(out))
        live = [i for i, seg in enumerate(self.segments)  # a removed segment (nn.Identity) may be skipped by its parent
                if not isinstance(self.work.get_submodule(seg.name), nn.Identity)]
        complete = all(len(outputs[i]) == len(self.batches) for i in live)  # each live segment once per batch
        self.anchor = (variants, outputs) if complete and size <= self.replay_mb * 2**20 else None
        return loss

    @torch.no_grad()
    def _replayed(self, shared: int) -> float:
        """The loss with segments ``0 .. shared-1`` replaying the anchor's outputs (a copy each call)."""
        _, outputs = self.anchor
        replays = {i: Replay(None) for i, seg in enumerate(self.segments[:shared])
                   if not isinstance(self.work.get_submodule(seg.name), nn.Identity)}  # removed ones cost nothing
        for i, replay in replays.items():
            self.work.set_submodule(self.segments[i].name, replay)
        self.work.eval()
        tally = LossTally(self.tempered)
        try:
            for b, (inputs, targets) in enumerate(self.batches):
                for i, replay in replays.items():
                    replay.output = clone_tree(outputs[i][b])
                tally.add(self.work(inputs), targets)
        finally:
            for i in replays:
                self.work.set_submodule(self.segments[i].name, self._module(i, self.installed[i]))
        return tally.value()


class HealedPlanLoss(PlanLoss):
    """:class:`PlanLoss` with each gap of a plan patched as ``prune.heal=linear`` would, by its map fitted once on
    the unpruned network (:class:`zoo.pruning.healing.GapMaps`: a map depends only on its gap's two ends, so every
    plan containing a gap reuses it), so that the whole search scores plans healed and healing can change which
    units go. The maps are fused into the working copy's ops for one forward and taken out again; a plan whose gaps
    none can heal is scored as :class:`PlanLoss` does (replaying where it can). The plan that ships is healed gap by
    gap (each fit seeing the patches before it), which :class:`HealedLoss` judges the search's finalists by."""

    def __init__(self, model: nn.Module, segments: Sequence[Segment], batches: Sequence[Batch], merge: bool = True,
                 tempered: bool = False, ridge: float | None = None):
        from .healing import RIDGE, GapMaps

        super().__init__(model, segments, batches, merge=merge, tempered=tempered)
        self.maps = GapMaps(model, [inputs for inputs, _ in batches], RIDGE if ridge is None else ridge)
        self.healed_plans = 0  # plans scored with at least one patch in

    def __call__(self, removed: frozenset[str] | Sequence[str]) -> float:
        removed = frozenset(removed)
        if removed in self.memo:
            return self.memo[removed]
        patches = self.maps.patches(removed)
        if not patches:
            return super().__call__(removed)
        from .healing import fuse

        self._install(removed)
        fused = [(into, patch_map) for into, patch_map in patches if self._op(into) is not None]
        if not fused:
            return super().__call__(removed)
        kept = [(op, op.weight.detach().clone(), None if op.bias is None else op.bias.detach().clone())
                for op in (self.work.get_submodule(into) for into, _ in fused)]
        try:
            for into, patch_map in fused:
                fuse(self.work, into, patch_map)
            with torch.no_grad():
                loss = calibration_loss(self.work, self.batches, self.tempered)
        finally:
            with torch.no_grad():
                for op, weight, bias in kept:
                    op.weight.copy_(weight)
                    if bias is not None:
                        op.bias.copy_(bias)
        self.memo[removed] = loss if math.isfinite(loss) else math.inf
        self.evaluations += 1
        self.healed_plans += 1
        return self.memo[removed]

    def _op(self, into: str) -> nn.Module | None:
        """The op at `into` in the working copy as its variants stand, when it is still the unpruned one's shape (a
        merged variant may have folded it away)."""
        try:
            op = self.work.get_submodule(into)
        except AttributeError:
            return None
        original = self.model.get_submodule(into)
        return op if type(op) is type(original) and op.weight.shape == original.weight.shape else None


class PlanRecovery:
    """The calibration loss of a whole plan after a short recovery: the plan applied as the fine-tune starts it
    (removed activations linearised, convs not yet merged, BatchNorm trainable), ``steps`` SGD steps on
    `train_batches` (seeded, so the same plan always scores the same), then its loss on `batches` (batches it did
    not train on). One-shot loss misjudges removals that training repairs easily (a linearised block keeps its
    weights; a removed block does not), which this score sees. Memoised per plan."""

    def __init__(self, model: nn.Module, batches: Sequence[Batch], train_batches: Sequence[Batch], steps: int = 20,
                 lr: float = 0.01):
        if not train_batches:
            raise ZooError("PlanRecovery needs training batches besides the calibration batches.")
        self.model, self.batches, self.train_batches = model, list(batches), list(train_batches)
        self.steps, self.lr = steps, lr
        self.memo: dict[frozenset[str], float] = {}

    def __call__(self, removed: frozenset[str] | Sequence[str]) -> float:
        removed = frozenset(removed)
        if removed not in self.memo:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                variant = _variant_model(self.model, removed, merge=False)
                loss = _finetuned_loss(variant, self.train_batches, self.batches, self.steps, self.lr)
                self.memo[removed] = loss if math.isfinite(loss) else math.inf  # a diverged recovery is the worst
        return self.memo[removed]


class HealedLoss:
    """The calibration loss of a whole plan healed as ``prune.heal=linear`` ships it: each run of removed residual units
    patched by a channel map fitted on `fit_batches`' inputs (:mod:`zoo.pruning.healing`; a run it cannot heal
    stays as is), the plan merged, then its loss on `batches` (batches the fit did not see). A search's finalists
    judged by it can differ from those one-shot loss prefers: healing changes which removals are cheap.
    Memoised per plan."""

    def __init__(self, model: nn.Module, batches: Sequence[Batch], fit_batches: Sequence[Batch], merge: bool = True,
                 tempered: bool = False, ridge: float | None = None):
        from .healing import RIDGE

        self.model, self.batches, self.merge, self.tempered = model, list(batches), merge, tempered
        self.calibration = [inputs for inputs, _ in fit_batches]
        self.ridge = RIDGE if ridge is None else ridge
        self.memo: dict[frozenset[str], float] = {}

    def __call__(self, removed: frozenset[str] | Sequence[str]) -> float:
        removed = frozenset(removed)
        if removed not in self.memo:
            healed = apply_plan(self.model, {"remove": sorted(removed), "merge": self.merge}, inplace=False,
                                heal="linear", calibration=self.calibration, ridge=self.ridge, strict=False)
            with torch.no_grad():
                loss = calibration_loss(healed, self.batches, self.tempered)
            self.memo[removed] = loss if math.isfinite(loss) else math.inf
        return self.memo[removed]


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a module's output (a tensor, or tuples, lists and mappings of them)."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def _variant_model(model: nn.Module, removed: frozenset[str], merge: bool) -> nn.Module:
    return apply_plan(model, {"remove": sorted(removed), "merge": merge}, inplace=False)


def score_variants(
    model: nn.Module,
    segments: Sequence[Segment],
    batches: Sequence[Batch],
    score: str = "loss",
    train_batches: Sequence[Batch] | None = None,
    finetune_steps: int = 20,
    finetune_lr: float = 0.01,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[frozenset[str], float]]:
    """Damage of every variant of every segment (0 for the unchanged variant), aligned with `segments`."""
    if score not in SCORES:
        raise ZooError(f"Unknown importance score {score!r}; allowed: {', '.join(SCORES)}.")
    if score == "finetune" and not train_batches:
        raise ZooError("The 'finetune' importance score needs training batches.")
    if score == "block_influence":
        units = sorted({name for seg in segments for removed in seg.variants() for name in removed})  # removable
        influence = block_influence(model, units, batches)
        return [{removed: sum(influence[u] for u in removed) for removed in seg.variants()} for seg in segments]
    tempered = score == "tempered"
    base_loss = calibration_loss(model, batches, tempered)
    reference = _outputs(model, batches) if score == "similarity" else None
    total = sum(len(seg.variants()) - 1 for seg in segments)
    done = 0
    result = []
    for seg in segments:
        damages = {frozenset(): 0.0}
        for removed in seg.variants():
            if not removed:
                continue
            variant = _variant_model(model, removed, merge=score != "finetune")
            if score in LOSS_SCORES:
                damages[removed] = calibration_loss(variant, batches, tempered) - base_loss
            elif score == "similarity":
                damages[removed] = _similarity_damage(reference, variant, batches)
            else:
                damages[removed] = _finetuned_loss(variant, train_batches, batches, finetune_steps,
                                                   finetune_lr) - base_loss
            done += 1
            if progress is not None:
                progress(done, total)
        result.append(damages)
    return result


def batches_digest(batches: Sequence[Batch]) -> str:
    """A hash of the calibration batches themselves (inputs and targets): scores depend on exactly these."""
    digest = hashlib.sha1()
    for inputs, targets in batches:
        for tensor in (inputs, targets):
            digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:20]


def weights_digest(model: nn.Module) -> str:
    """A hash of the model's weights, architecture and builder options: the importance cache key's first part."""
    options = {"name": getattr(model, "zoo_name", None), "overrides": getattr(model, "zoo_overrides", {}),
               "plan": getattr(model, "zoo_plan", None)}  # options that change the forward pass but no tensor
    digest = hashlib.sha1(repr(model).encode() + json.dumps(options, sort_keys=True, default=str).encode())
    for key, tensor in model.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:20]


def _decode(stored: dict, key: dict, segments: Sequence[Segment]) -> list[dict[frozenset[str], float]]:
    """Scores from a cache payload, checked against the key and the segments (raises CorruptFileError)."""
    if stored.get("key") != json.loads(json.dumps(key, default=str)):
        raise CorruptFileError("it was written for another key")
    rows = stored.get("scores")
    if not isinstance(rows, list) or len(rows) != len(segments):
        count = len(rows) if isinstance(rows, list) else "no"
        raise CorruptFileError(f"it holds {count} segments, the model has {len(segments)}")
    scores = []
    for seg, row in zip(segments, rows):
        if not isinstance(row, dict):
            raise CorruptFileError(f"segment {seg.name} is not a mapping")
        damages = {frozenset(k.split("|")) if k else frozenset(): v for k, v in row.items()}
        if set(damages) != set(seg.variants()) or not all(
                isinstance(v, (int, float)) and math.isfinite(v) for v in damages.values()):
            raise CorruptFileError(f"segment {seg.name} does not hold one finite score per variant")
        scores.append(damages)
    return scores


def cached_scores(cache_dir: str | Path, key: dict, segments: Sequence[Segment],
                  compute: Callable[[], list[dict[frozenset[str], float]]]
                  ) -> tuple[list[dict[frozenset[str], float]], bool]:
    """Scores from the cache file for `key`, or computed (under a file lock, so concurrent jobs compute once).

    A cache file is used only when it is intact (its checksum), written for `key`, and holds one finite score for
    every variant of every segment; anything else is reported once and recomputed.
    """
    name = json_digest(key, 20)
    path = Path(cache_dir) / f"importance-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            try:
                return _decode(read_sealed_json(path), key, segments), True
            except CorruptFileError as exc:
                _log.warning("Importance cache %s is not usable (%s): the scores are computed again.", path, exc)
        scores = compute()
        payload = {"key": key, "scores": [{"|".join(sorted(k)): v for k, v in seg.items()} for seg in scores]}
        write_sealed_json(path, payload)
    return scores, False
