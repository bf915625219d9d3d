"""PlanLoss: the calibration loss of whole plans, equal to applying the plan, with the shared prefix replayed."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import zoo
from zoo.pruning import surgery
from zoo.pruning.importance import PlanLoss, calibration_loss

from ..helpers import example_batch, small_model

FAMILIES = zoo.list_families()


# The language-model families here; the CNN families (6-12 s each on 2 cores): tests/e2e/test_plan_loss_tresnet.py.
CASES = [(f, tempered) for f in FAMILIES for tempered in (False, True) if f.task == "language_model"]


@pytest.mark.parametrize("family, tempered", CASES, ids=[f"{f.name}-{'tempered' if t else 'loss'}" for f, t in CASES])
def test_plan_loss_equals_the_applied_plan_and_replays_shared_prefixes(family, tempered):
    torch.manual_seed(0)
    options = {} if family.task == "language_model" else {"num_classes": 10}
    model = small_model(family, **options).eval()
    segs = surgery.segments(model)
    batches = [example_batch(family, 3), example_batch(family, 3)]
    score = PlanLoss(model, segs, batches, tempered=tempered)
    rng = random.Random(0)
    for _ in range(2):
        center = [rng.choice(seg.variants()) for seg in segs]
        for s in reversed(range(len(segs))):  # a plan's neighbours, last segment first, as the searches score them
            for variant in rng.sample(segs[s].variants(), min(2, len(segs[s].variants()))):
                removed = sorted(set().union(*center[:s], variant, *center[s + 1:]))
                expected = calibration_loss(surgery.apply_plan(model, {"remove": removed, "merge": True},
                                                               inplace=False), batches, tempered)
                assert score(removed) == pytest.approx(expected, rel=1e-6, abs=1e-7), removed
    assert score.replayed > score.evaluations // 2  # most neighbours started at their change
    assert score([]) == pytest.approx(calibration_loss(model, batches, tempered), rel=1e-6)
    plain = PlanLoss(model, segs, batches, replay_mb=0)  # nothing kept: every plan a full forward
    plain(sorted(segs[-1].variants()[-1]))
    plain(sorted(segs[0].variants()[-1]))
    assert plain.replayed == 0 and plain.anchor is None


class Scaled(torch.nn.Module):
    """Fixed logits times a factor: a network whose removal only rescales its output."""

    def __init__(self, logits: torch.Tensor, factor: float):
        super().__init__()
        self.logits, self.factor = logits, factor

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.logits[inputs] * self.factor


def test_tempered_loss_is_the_loss_at_the_best_temperature_whatever_the_logit_scale():
    """A classifier's: against the continuous optimum over the temperature (scipy), within the grid's resolution; the
    same for the logits scaled by a grid step's power (the scale a removal changes), where the plain loss grows
    many-fold. A language model's is its plain loss (its metric)."""
    from scipy.optimize import minimize_scalar

    from zoo.pruning.importance import TEMPERATURES, task_loss

    torch.manual_seed(0)
    logits = torch.randn(64, 10) * 3
    targets = torch.where(torch.rand(64) < 0.6, logits.argmax(1), torch.randint(0, 10, (64,)))  # some wrong
    batches = [(torch.arange(32), targets[:32]), (torch.arange(32, 64), targets[32:])]
    best = minimize_scalar(lambda log_t: task_loss(logits / float(np.exp(log_t)), targets).item(),
                           bounds=(-3, 5), method="bounded")
    tempered = calibration_loss(Scaled(logits, 1.0), batches, tempered=True)
    assert best.fun <= tempered <= best.fun * 1.01
    assert TEMPERATURES[0] < float(np.exp(best.x)) < TEMPERATURES[-1]
    plain = calibration_loss(Scaled(logits, 1.0), batches)
    assert plain == pytest.approx(task_loss(logits, targets).item(), rel=1e-6) and tempered < plain
    scaled = Scaled(logits, 2.0 ** 3)  # 12 grid steps: the same minimum, shifted along the grid
    assert calibration_loss(scaled, batches, tempered=True) == pytest.approx(tempered, rel=1e-5)
    assert calibration_loss(scaled, batches) > 3 * plain
    language_model = Scaled(torch.randn(10, 10) * 3, 1.0)  # [B, T] tokens to [B, T, V] logits: scored plainly
    text = [(torch.randint(0, 10, (2, 5)), torch.randint(0, 10, (2, 5)))]
    assert calibration_loss(language_model, text, tempered=True) == pytest.approx(
        calibration_loss(language_model, text), rel=1e-6)


def test_tempered_damages_are_tempered_loss_increases():
    """score_variants('tempered') is each variant's tempered loss less the baseline's; a MobileNetV2 activation
    removal scores at its best temperature too."""
    from zoo.pruning.importance import score_variants

    torch.manual_seed(0)
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    segs = surgery.segments(model)[:3]
    batches = [(torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)))]
    damages = score_variants(model, segs, batches, score="tempered")
    base = calibration_loss(model, batches, tempered=True)
    for seg_damages in damages:
        for removed, damage in seg_damages.items():
            applied = surgery.apply_plan(model, {"remove": sorted(removed), "merge": True}, inplace=False)
            assert damage == pytest.approx(calibration_loss(applied, batches, tempered=True) - base, abs=1e-6)


def test_plan_loss_names_a_unit_outside_every_segment():
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    score = PlanLoss(model, surgery.segments(model), [(torch.randn(2, 3, 16, 16), torch.tensor([0, 1]))])
    with pytest.raises(zoo.errors.ZooError, match="lie in no segment"):
        score(["conv_stem"])


def test_plan_recovery_trains_the_linearised_plan_then_scores_the_calibration_batches():
    """With no steps it is the loss of the linearised, unmerged plan; with steps it trains on the training batches
    only (the calibration batches are untouched), always to the same score, and leaves the model unchanged."""
    from zoo.pruning.importance import PlanRecovery

    torch.manual_seed(0)
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    batches = [(torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)))]
    train = [(torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))) for _ in range(2)]
    plan = ["blocks.2.1", "blocks.3.0.bn1.act"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    linear = calibration_loss(surgery.apply_plan(model, {"remove": plan, "merge": False}, inplace=False), batches)
    assert PlanRecovery(model, batches, train, steps=0)(plan) == pytest.approx(linear, rel=1e-6)
    recovered = PlanRecovery(model, batches, train, steps=10)
    once = recovered(plan)
    assert once != pytest.approx(linear, rel=1e-3)
    assert PlanRecovery(model, batches, train, steps=10)(plan) == once
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with pytest.raises(zoo.errors.ZooError, match="training batches"):
        PlanRecovery(model, batches, [], steps=10)
