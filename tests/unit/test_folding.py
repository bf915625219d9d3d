"""A removed sub-layer leaves nothing behind (zoo.pruning.folding): its zeros, the rolls, pads and scales carrying
them and the addition of them are dropped from the block's code; a block whose code does not trace, or traces
differently in training, or whose fold would change its output, keeps its zeros."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from zoo.models.depth import ZeroLike, zero_branch
from zoo.pruning import folding
from zoo.pruning.folding import fold_zeros


class Scale(nn.Module):
    """timm's LayerScale by name: zeros in, zeros out."""

    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


Scale.__name__ = "LayerScale"


class Windowed(nn.Module):
    """A shifted-window block in miniature: roll, pad and reshape around the mixer, a scale, then the residual; an
    MLP sub-layer after it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.mix, self.ls = nn.LayerNorm(8), nn.Linear(8, 8), Scale()
        self.norm2, self.mlp = nn.LayerNorm(8), nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.roll(self.norm1(x), shifts=1, dims=1)
        y = nn.functional.pad(y.transpose(1, 2), (0, 2)).transpose(1, 2)
        y = self.mix(y)[:, :-2].reshape(x.shape)
        x = x + self.ls(torch.roll(y, shifts=-1, dims=1))
        return x + self.mlp(self.norm2(x))


class Biased(Windowed):
    """The zeros pass through a LayerNorm with a bias (not zero after it): the addition must stay."""

    def __init__(self) -> None:
        super().__init__()
        nn.init.constant_(self.norm2.bias, 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm2(self.mix(self.norm1(x)))


class DependsOnData(Windowed):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(x.sum()) > 0:
            return x + self.mix(self.norm1(x))
        return x - self.mix(self.norm1(x))


class DependsOnMode(Windowed):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 0.5 if self.training else 1.0
        return x + scale * self.mix(self.norm1(x))


def removed(block: nn.Module, branch: list[str]) -> nn.Module:
    block = copy.deepcopy(block).eval()
    zero_branch(block, branch)
    return block


def calls(module: nn.Module, x: torch.Tensor) -> list[str]:
    graph = torch.export.export(module.eval(), (x,), strict=False).graph
    return [str(n.target) for n in graph.nodes if n.op == "call_function"]


def test_a_removed_windowed_branch_leaves_no_op_behind():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    block = removed(Windowed(), ["norm1", "mix", "ls"])
    folded = fold_zeros(block, (x,))
    assert folded is not block and not any(isinstance(m, ZeroLike) for m in folded.modules())
    with torch.no_grad():
        torch.testing.assert_close(folded(x), block(x), rtol=0, atol=0)
    before, after = calls(block, x), calls(folded, x)
    assert any("zeros" in op or "roll" in op for op in before)
    assert not any("zeros" in op or "roll" in op or "pad" in op for op in after) and sum("add" in o for o in after) == 1
    assert set(folded.state_dict()) == {k for k in Windowed().state_dict() if k.startswith(("norm2", "mlp"))}


@pytest.mark.parametrize("kind", [Biased, DependsOnData, DependsOnMode], ids=lambda k: k.__name__)
def test_what_cannot_be_folded_keeps_its_zeros_and_its_output(kind):
    """Zeros that a biased norm turns into a constant keep their addition; a forward that does not trace, or traces
    another code in training, is kept whole."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    block = removed(kind(), ["norm1", "mix"])
    folded = fold_zeros(block, (x,))
    with torch.no_grad():
        torch.testing.assert_close(folded(x), block(x), rtol=0, atol=0)
    if kind is Biased:
        assert any("add" in op for op in calls(folded, x))
    else:
        assert folded is block


def test_a_fold_that_would_change_the_output_is_refused(monkeypatch):
    """The check on the block's input is what decides: told (wrongly) that the biased norm's output is zero, the
    fold would drop a non-zero term, so the block is kept as it was."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    block = removed(Biased(), ["norm1", "mix"])
    marks = folding._zero_nodes

    def wrong(traced):
        return marks(traced) | {n for n in traced.graph.nodes if n.op == "call_module" and n.target == "norm2"}

    monkeypatch.setattr(folding, "_zero_nodes", wrong)
    assert fold_zeros(block, (x,)) is block
