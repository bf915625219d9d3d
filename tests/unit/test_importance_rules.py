"""The layer-importance rules of the language-model literature: ShortGPT's Block Influence and the angular distance
of Gromov et al., each checked against a hand-computed example, and Block Influence as a prune.importance score."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import zoo
from zoo.pruning.importance import angular_distance, block_influence, score_variants, unit_io
from zoo.pruning.surgery import segments


class Turn(nn.Module):
    """x -> x R for a fixed 2-D rotation R by `degrees` (an exact cosine between input and output)."""

    def __init__(self, degrees: float):
        super().__init__()
        a = math.radians(degrees)
        self.register_buffer("rotation", torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.rotation


def test_block_influence_and_angular_distance_by_hand():
    """Turning every vector by 0, 90 and 180 degrees: cosines 1, 0, -1, so Block Influence 0, 1, 2 and angular
    distance 0, 1/2, 1; a run of the 90- and 180-degree units turns by 270 degrees: cosine 0, distance 1/2."""
    model = nn.Sequential(Turn(0), Turn(90), Turn(180))
    batches = [(torch.randn(5, 7, 2), None), (torch.randn(3, 7, 2), None)]  # [B, T, D]: per token
    influence = block_influence(model, ["0", "1", "2"], batches)
    assert influence == pytest.approx({"0": 0.0, "1": 1.0, "2": 2.0}, abs=1e-6)
    seen = unit_io(model, ["0", "1", "2"], batches)
    for name, expected in (("0", 0.0), ("1", 0.5), ("2", 1.0)):
        pairs = seen[name]
        assert angular_distance([a for a, _ in pairs], [b for _, b in pairs]) == pytest.approx(expected, abs=1e-3)
    run = angular_distance([a for a, _ in seen["1"]], [b for _, b in seen["2"]])
    assert run == pytest.approx(0.5, abs=1e-3)


def test_block_influence_reads_channels_of_image_activations():
    """On [B, C, H, W] activations the cosine is over channels at each position: a unit negating one position's
    channels and keeping the others has influence 2 x (the share of negated positions)."""

    class NegateCorner(nn.Module):
        def forward(self, x):
            out = x.clone()
            out[:, :, 0, 0] = -out[:, :, 0, 0]
            return out

    model = nn.Sequential(NegateCorner())
    influence = block_influence(model, ["0"], [(torch.randn(2, 3, 4, 4), None)])
    assert influence["0"] == pytest.approx(2 * 1 / 16, abs=1e-6)


def test_block_influence_score_sums_over_the_removed_units():
    torch.manual_seed(0)
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    segs = segments(model)
    batches = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))]
    damages = score_variants(model, segs, batches, score="block_influence")
    units = sorted({name for seg in segs for removed in seg.variants() for name in removed})
    single = block_influence(model, units, batches)
    for seg_damages in damages:
        assert seg_damages[frozenset()] == 0.0
        for removed, damage in seg_damages.items():
            assert damage == pytest.approx(sum(single[u] for u in removed))
    assert any(d > 0 for seg in damages for d in seg.values())


def same_damages(a: list[dict], b: list[dict]) -> bool:
    """Two segment-damage lists (one ``{variant: damage}`` per segment) with the same variants and values within
    pytest.approx's default tolerance, compared key by key (pytest.approx itself refuses nested structures)."""
    return len(a) == len(b) and all(x.keys() == y.keys() and all(x[k] == pytest.approx(y[k]) for k in x)
                                    for x, y in zip(a, b))


def test_finetune_score_trains_on_batches_it_does_not_score_on(tmp_path):
    """prune.importance=finetune: each variant's short fine-tune trains on the training batches that follow the
    calibration batches and is scored on the calibration batches (an in-sample loss would reward overfitting), and
    the cache key names both sets."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from zoo.jobs.plan import calibration_batches, importance_of
    from zoo.pruning.importance import batches_digest
    from zoo.training import build_loaders

    data = build_loaders(OmegaConf.create({"name": "digits", "image_size": 8, "shift": 0, "batch_size": 8,
                                           "num_workers": 0, "val_fraction": 0.2, "train_samples": 64,
                                           "eval_batch_size": None}), seed=0)
    scored, trained = calibration_batches(data, 2), calibration_batches(data, 4)[2:]
    assert len(scored) == len(trained) == 2 and batches_digest(scored) != batches_digest(trained)
    assert torch.equal(torch.cat([b[0] for b in scored + trained]),
                       torch.cat([b[0] for b in calibration_batches(data, 4)]))
    torch.manual_seed(0)
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    table = SimpleNamespace(segments=segments(model)[-1:])
    cfg = OmegaConf.create({"prune": {"calib_batches": 2, "importance": "finetune", "cache_dir": str(tmp_path)},
                            "paths": {"log_dir": str(tmp_path)}})
    damages, cached = importance_of(cfg, {}, model, table, data)
    held_out = score_variants(model, table.segments, scored, "finetune", train_batches=trained)
    in_sample = score_variants(model, table.segments, scored, "finetune", train_batches=scored)
    assert not cached and same_damages(damages, held_out) and not same_damages(damages, in_sample)
    assert importance_of(cfg, {}, model, table, data)[1] is True  # the same two sets: from the cache
