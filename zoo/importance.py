"""Importance of each segment variant, measured one variant at a time on a calibration split.

Scores (``damage``: how much a variant hurts when applied alone; the search minimises its sum):

* ``loss`` (default): increase of the calibration loss;
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

from .errors import CorruptFileError, ZooError
from .files import json_digest, read_sealed_json, write_sealed_json
from .surgery import Segment, apply_plan

_log = logging.getLogger(__name__)
Batch = tuple[torch.Tensor, torch.Tensor]
SCORES = ("loss", "similarity", "finetune", "block_influence")


def task_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for classification ``[B, C]`` or language modelling ``[B, T, V]`` logits."""
    if logits.ndim == 3:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    return F.cross_entropy(logits.float(), targets)


@torch.no_grad()
def calibration_loss(model: nn.Module, batches: Sequence[Batch]) -> float:
    """Mean task loss of `model` (eval mode) over the calibration batches."""
    model.eval()
    total, count = 0.0, 0
    for inputs, targets in batches:
        total += task_loss(model(inputs), targets).item() * len(inputs)
        count += len(inputs)
    return total / max(count, 1)


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
    base_loss = calibration_loss(model, batches)
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
            if score == "loss":
                damages[removed] = calibration_loss(variant, batches) - base_loss
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
