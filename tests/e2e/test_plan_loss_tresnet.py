"""The plan loss on the CNN families (TResNet, BiT, MobileNetV2; 6-12 s each on 2 cores), beside the unit tier's
RetNet cases in tests/unit/test_plan_loss.py: equal to the applied plan's loss, with shared prefixes replayed
(TResNet's plain loss is the same replay at one temperature, not run)."""

from __future__ import annotations

import pytest

import zoo

from ..unit.test_plan_loss import test_plan_loss_equals_the_applied_plan_and_replays_shared_prefixes as check


def test_plan_loss_on_tresnet_equals_the_applied_plan():
    check(zoo.get_family("tresnet"), tempered=True)


@pytest.mark.parametrize("tempered", [False, True], ids=["loss", "tempered"])
def test_plan_loss_on_bit_equals_the_applied_plan(tempered):
    check(zoo.get_family("bit"), tempered=tempered)


@pytest.mark.parametrize("tempered", [False, True], ids=["loss", "tempered"])
def test_plan_loss_on_mobilenetv2_equals_the_applied_plan(tempered):
    check(zoo.get_family("mobilenetv2"), tempered=tempered)

