"""The plan loss on TResNet (12 s on 2 cores, so beside the unit tier's other families in
tests/unit/test_plan_loss.py): equal to the applied plan's loss, with shared prefixes replayed, at its tempered loss
(the plain loss is the same replay at one temperature)."""

from __future__ import annotations

import zoo

from ..unit.test_plan_loss import test_plan_loss_equals_the_applied_plan_and_replays_shared_prefixes as check


def test_plan_loss_on_tresnet_equals_the_applied_plan():
    check(zoo.get_family("tresnet"), tempered=True)
