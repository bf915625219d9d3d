"""Discovery's slower checks (a large timm model built and traced, or a prune run on a timm model, 5-20 s each on
2 cores), beside tests/unit/test_discovery.py's fast ones: BiT's blocks as declared, TResNet's block whose
activation after the addition changes its input, the slower half of the timm spread proven unit by unit,
prune.py's refusals of timm models at validation, and a whole prune.py run on a timm model by its name."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.errors import ZooError
from zoo.models.discovery import DiscoveryError

from ..helpers import TINY_PRUNE, prune_in_process
from ..unit.test_discovery import removable_blocks
from ..unit.test_discovery_exact import TIMM_SPREAD_SLOW


@pytest.mark.parametrize(("arch", "options", "size"), TIMM_SPREAD_SLOW, ids=[a for a, _, _ in TIMM_SPREAD_SLOW])
def test_the_slower_timm_spread_is_timms_and_every_unit_it_offers_is_proven(arch, options, size):
    from ..unit.test_discovery_exact import (
        test_a_prunable_timm_model_is_timms_and_every_unit_it_offers_is_proven as check,
    )

    check(arch, options, size)


def test_discovery_finds_bits_declared_removable_blocks():
    """timm's own BiT, traced, has exactly the removable blocks our declaration lists (same names, same order)."""
    declared = zoo.create_model("resnetv2_50x1_bit")
    discovered = zoo.create_model("timm/resnetv2_50x1_bit")
    assert removable_blocks(discovered) == removable_blocks(declared) and removable_blocks(declared)


def test_a_block_whose_activation_after_the_addition_changes_its_input_is_not_removable():
    """TResNet-M: the declared family removes body.layer1.0 with its ReLU (a different network, healed by
    fine-tuning); discovery only offers exact removals, and that block's ReLU after the addition is not the identity
    on its input (the stem ends in a leaky ReLU, so the stream holds negatives). Every other removable block is the
    declaration's."""
    declared = removable_blocks(zoo.create_model("tresnet_m"))
    model = zoo.create_model("timm/tresnet_m")
    assert removable_blocks(model) == [n for n in declared if n != "body.layer1.0"]
    with torch.no_grad():
        stream = model.body[:2](torch.randn(1, 3, 64, 64))  # space-to-depth and the stem: layer1.0's input
    assert float(stream.min()) < 0


def test_a_model_without_a_removable_unit_or_a_trace_is_refused_with_the_reason(tmp_path):
    """prune.py refuses at validation, before any work: a model with no removable residual unit; a model built for
    another input size than the data's (with the option that fixes it); an unknown tag (with timm's); an option
    value that builds a model that does not run (a wrong option, not a tracing failure); a backbone form; an
    unknown timm name (with the closest)."""
    tiny = [o for o in TINY_PRUNE if not o.startswith("model=")]
    cases = [
        (["model.name=mobilenetv1_100"], "has no removable residual unit"),
        (["model.name=deit_tiny_patch16_224"], "+model.overrides.img_size=16"),
        (["model.name=resnet18.no_such_tag"], "Unknown tag 'no_such_tag' for timm's resnet18; timm lists: a1_in1k"),
        (["model.name=resnet18", "+model.overrides.drop_rate=fast"], "an option's value has the wrong type"),
        (["model.name=resnet18", "+model.overrides.features_only=true"], "model.overrides.features_only makes a "
                                                                          "backbone"),
    ]
    for extra, message in cases:
        out = prune_in_process(*tiny, "logger=none", "model=timm", *extra, base=tmp_path)
        assert out.returncode == 2 and message in out.stdout, out.stdout[-1500:]
        assert "Traceback" not in out.stdout and not (tmp_path / "outputs").exists()
    with pytest.raises(ZooError, match="Closest timm names: timm/convnext_atto"):
        zoo.create_model("timm/convnextt_atto")
    with pytest.raises(DiscoveryError, match="no removable residual unit"):
        zoo.create_model("timm/mobilenetv1_100")


def test_prune_py_prunes_a_timm_model_by_its_name(tmp_path):
    """``prune.py model=timm model.name=resnet18``: the baseline trained, its discovered blocks timed and searched, the
    plan applied and fine-tuned, results that say where the units came from, the checkpoint rebuilt by zoo.load."""
    import json

    tiny = [o for o in TINY_PRUNE if not o.startswith("model=")]
    out = prune_in_process(*tiny, "logger=none", "model=timm", "model.name=resnet18", "prune.target_speedup=1.3",
                           "prune.target_corrections=0", "prune.search=dp", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model"] == "timm/resnet18" and results["plan"]["remove"]
    assert set(results["plan"]["remove"]) <= {"layer1.0", "layer1.1", "layer2.1", "layer3.1", "layer4.1"}
    assert "discovered from the graph" in results["depth_units"]
    assert zoo.load(results["checkpoint"]).zoo_plan["remove"] == results["plan"]["remove"]


def test_prune_py_times_each_removal_of_a_block_with_a_nested_residual(tmp_path):
    """FastViT-T8: each block's token mixer has a residual of its own inside the block (``x + s * (mixer(x) -
    norm(x))``, refused: zeroing the mixer leaves ``-s * norm(x)``), beside the block's MLP residual. prune.py times
    every block's segment three ways (intact, its MLP sub-layer removed, the whole block removed), each measured on
    its own, and the plan it measures takes them from what the model offers."""
    import json

    tiny = [o for o in TINY_PRUNE if not o.startswith(("model=", "data.image_size"))]
    out = prune_in_process(*tiny, "logger=none", "model=timm", "model.name=fastvit_t8", "data.image_size=32",
                           "prune.target_speedup=1.2", "prune.target_corrections=0", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    from zoo.models.timm_any import discovered

    _, found = discovered("fastvit_t8", {}, input_size=(3, 32, 32))  # the run's discovery (cached)
    mixers = [u for u in found.units if u.name.endswith("token_mixer.mixer")]
    assert mixers and all(not u.removable and "not its branch contributing nothing" in u.reason for u in mixers)
    table = json.loads((tmp_path / "run" / "latency_table.json").read_text())
    for segment in table["segments"]:
        name = segment["name"]
        assert [v["removed"] for v in segment["variants"]] == [[], [f"{name}.mlp"], [name]], segment
    intact, without_mlp = (sum(s["variants"][i]["ms"] for s in table["segments"]) for i in (0, 1))
    assert 0 < without_mlp < intact  # the MLP's own saving, measured: not nothing, not the whole block's
    offered = {u.name for u in found.removable()}
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["remove"] and set(plan["remove"]) <= offered
