"""The zoo: registry, timm-compatible weights, our checkpoints, depth units, fuse, CLI."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import nn

import zoo

from ..helpers import max_rel_diff, models_with, randomise_norm_stats, small_model

TIMM_FAMILIES = zoo.list_families(capability="timm")  # the families timm has too, by their reference members
CNN_FAMILIES = zoo.list_families(task="classification")
SMALL_INPUT = (2, 3, 64, 64)


def timm_weights(name: str, path: Path, fmt: str = "pth", num_classes: int = 1000) -> nn.Module:
    """A random-weight timm model saved to `path` in timm's format; returns the timm model (eval)."""
    torch.manual_seed(0)
    model = randomise_norm_stats(timm.create_model(name, num_classes=num_classes)).eval()
    if fmt == "pth":
        torch.save(model.state_dict(), path)
    else:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("weights")


def test_list_models_and_info():
    names = zoo.list_models()
    for name in ["tresnet_m", "tresnet_l", "tresnet_xl", "resnetv2_50x1_bit", "resnetv2_152x4_bit",
                 "mobilenetv2_035", "mobilenetv2_140"]:
        assert name in names
    assert zoo.list_models("mobilenetv2_*") == [f"mobilenetv2_{w}" for w in ("035", "050", "075", "100", "140")]
    info = zoo.model_info("mobilenetv2_100")
    timm_params = sum(p.numel() for p in timm.create_model("mobilenetv2_100").parameters())
    assert info["family"] == "mobilenetv2" and info["params"] == timm_params
    assert info["input_size"] == (3, 224, 224) and info["pretrained_tag"] == "mobilenetv2_100.ra_in1k"


@pytest.mark.parametrize("name", models_with("timm"))
def test_every_cnn_builds_and_matches_timm_shapes(name):
    """Every CNN builds on meta with exactly timm's state-dict keys and shapes."""
    with torch.device("meta"):
        ours = zoo.create_model(name)
        theirs = timm.create_model(name)
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    assert all(ours_sd[k].shape == theirs_sd[k].shape for k in ours_sd)
    out = ours(torch.empty(1, 3, 224, 224, device="meta"))
    assert out.shape == (1, 1000)
    for attr in ("forward_features", "forward_head", "reset_classifier", "num_features", "default_cfg"):
        assert hasattr(ours, attr)


@pytest.mark.parametrize("family", TIMM_FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
def test_timm_weights_give_timm_logits(family, fmt, weights_dir):
    name = family.reference
    path = weights_dir / f"{name}.{fmt}"
    reference = timm_weights(name, path, fmt)
    model = zoo.create_model(name, pretrained=path).eval()
    x = torch.randn(*SMALL_INPUT)
    with torch.no_grad():
        expected, got = reference(x), model(x)
        feats = model.forward_head(model.forward_features(x), pre_logits=True)
    assert max_rel_diff(expected, got) <= 1e-4
    assert feats.shape == (2, model.num_features)


def test_head_reinitialised_when_num_classes_differs(weights_dir, caplog):
    path = weights_dir / "mbv2_head.pth"
    reference = timm_weights("mobilenetv2_050", path)
    with caplog.at_level(logging.WARNING):
        model = zoo.create_model("mobilenetv2_050", pretrained=path, num_classes=7).eval()
    assert "re-initialised" in caplog.text
    assert model.classifier.out_features == 7 and model.num_classes == 7
    x = torch.randn(*SMALL_INPUT)
    with torch.no_grad():
        assert torch.allclose(reference.forward_features(x), model.forward_features(x), atol=1e-5)


def test_unknown_model_lists_closest_names():
    with pytest.raises(zoo.UnknownModelError, match="mobilenetv2_100"):
        zoo.create_model("mobilenet_v2_100")


def test_missing_truncated_and_foreign_weight_files(tmp_path, weights_dir):
    with pytest.raises(zoo.WeightsError, match="does not exist"):
        zoo.create_model("mobilenetv2_035", pretrained=tmp_path / "nope.safetensors")
    good = weights_dir / "mbv2_035.safetensors"
    timm_weights("mobilenetv2_035", good, "safetensors")
    for suffix in (".safetensors", ".pth"):
        source = good if suffix == ".safetensors" else tmp_path / "full.pth"
        if suffix == ".pth":
            torch.save(timm.create_model("mobilenetv2_035").state_dict(), source)
        truncated = tmp_path / f"truncated{suffix}"
        truncated.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
        with pytest.raises(zoo.WeightsError, match=f"truncated{suffix}"):
            zoo.create_model("mobilenetv2_035", pretrained=truncated)
    with pytest.raises(zoo.WeightsError, match=r"do not fit.*(missing|unexpected|shape)") as err:
        zoo.create_model("mobilenetv2_100", pretrained=good)
    assert "mbv2_035.safetensors" in str(err.value) and "conv_stem.weight: file" in str(err.value)


def test_pickles_load_with_weights_only(tmp_path):
    """A pickle holding arbitrary objects is refused, not executed: its payload would create a file."""
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pth"
    torch.save({"conv_stem.weight": torch.zeros(1), "payload": Payload()}, path)
    with pytest.raises(zoo.WeightsError, match=r"evil.pth is refused for safety") as err:
        zoo.create_model("mobilenetv2_035", pretrained=path)
    assert not marker.exists()
    assert "will likely succeed" not in str(err.value)


def test_offline_hub_error_names_the_hub_id(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(zoo.WeightsError, match=r"timm/mobilenetv2_100\.ra_in1k.*HF_HUB_OFFLINE=1.*local file"):
        zoo.create_model("mobilenetv2_100", pretrained=True)
    with pytest.raises(zoo.WeightsError, match="no published pretrained weights"):
        zoo.create_model("mobilenetv2_035", pretrained=True)


@pytest.mark.parametrize("family", CNN_FAMILIES, ids=lambda f: f.name)
def test_depth_units_are_consistent(family):
    model = small_model(family, num_classes=10).eval()
    units = zoo.depth_units(model, input_size=(3, 64, 64))
    assert [u.name for u in units] == [u.name for u in model.depth_unit_specs()]
    blocks = [u for u in units if u.kind == "block"]
    assert blocks and all(u.in_shape == u.out_shape and u.stride == 1 for u in blocks if u.removable)
    assert any(not u.removable for u in blocks)  # downsampling blocks stay
    acts = [u for u in units if u.kind == "act"]  # none in BiT: GroupNorm cannot be folded (test_surgery)
    assert all(u.mergeable and len(u.merge) == 4 for u in acts)
    removable = [u.name for u in blocks if u.removable]
    pruned = zoo.remove_units(model, removable)
    with torch.no_grad():
        assert pruned(torch.randn(*SMALL_INPUT)).shape == (2, 10)
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
    assert len(zoo.depth_units(pruned, input_size=(3, 64, 64))) == len(units) - len(removable) - sum(
        1 for u in acts if any(u.name.startswith(b + ".") for b in removable))
    with pytest.raises(zoo.PlanError, match="cannot be removed"):
        zoo.remove_units(model, [next(u.name for u in blocks if not u.removable)])
    with pytest.raises(zoo.PlanError, match="not depth units"):
        zoo.remove_units(model, ["blocks.99"])


@pytest.mark.parametrize("family", CNN_FAMILIES, ids=lambda f: f.name)
def test_fuse_keeps_outputs_with_fewer_modules(family):
    model = randomise_norm_stats(small_model(family)).eval()
    fused = zoo.fuse(model)
    x = torch.randn(*SMALL_INPUT)
    with torch.no_grad():
        assert max_rel_diff(model(x), fused(x)) <= 1e-4
    count = lambda m, kind: sum(isinstance(x, kind) for x in m.modules())  # noqa: E731
    if count(model, timm.layers.StdConv2d):  # BiT: weight standardisation folded into plain convolutions
        assert count(fused, timm.layers.StdConv2d) == 0
    else:
        assert count(fused, nn.BatchNorm2d) == 0 < count(model, nn.BatchNorm2d)


def test_project_checkpoint_roundtrip_keeps_head_overrides_and_plan(tmp_path):
    model = randomise_norm_stats(zoo.create_model("mobilenetv2_050", num_classes=5, drop_rate=0.1)).eval()
    blocks = [u.name for u in zoo.depth_units(model, (3, 64, 64)) if u.kind == "block" and u.removable]
    acts = [u.name for u in zoo.depth_units(model, (3, 64, 64)) if u.kind == "act"][:3]
    pruned = zoo.apply_plan(model, {"remove": blocks[:2] + acts}, inplace=False).eval()
    path = zoo.save_checkpoint(pruned, tmp_path / "ckpt" / "best.safetensors", epoch=3, metrics={"val/acc1": 50.0})
    assert not list(path.parent.glob("*.tmp"))
    meta = zoo.read_checkpoint_meta(path)
    assert meta["model"] == "mobilenetv2_050" and meta["epoch"] == 3 and meta["plan"]["remove"] == blocks[:2] + acts
    loaded = zoo.load(path).eval()
    also = zoo.create_model("mobilenetv2_050", pretrained=path).eval()
    assert loaded.num_classes == 5 and loaded.drop_rate == 0.1
    x = torch.randn(*SMALL_INPUT)
    with torch.no_grad():
        assert torch.equal(pruned(x), loaded(x)) and torch.equal(pruned(x), also(x))
    with pytest.raises(zoo.WeightsError, match="written for model 'mobilenetv2_050'"):
        zoo.create_model("mobilenetv2_100", pretrained=path)
    relabelled = zoo.create_model("mobilenetv2_050", pretrained=path, num_classes=3)
    assert relabelled.num_classes == 3


def test_usage_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """The Python example of docs/usage.md, copied out of the page and run offline in a fresh folder."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exec(compile(code, "docs/usage.md", "exec"), {"__name__": "__main__"})
    assert "depth units;" in capsys.readouterr().out and (tmp_path / "pruned.safetensors").is_file()

