"""The plan loss on TResNet and BiT (7-12 s each on 2 cores) and MobileNetV2's plain loss, beside the unit tier's
other cases in tests/unit/test_plan_loss.py: equal to the applied plan's loss, with shared prefixes replayed
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


def test_plan_loss_on_mobilenetv2_at_its_plain_loss():
    check(zoo.get_family("mobilenetv2"), tempered=False)

