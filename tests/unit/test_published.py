"""Published weights: timm's tags and eval configs, every weight source in one key, evaluation equal to timm's
pipeline, and prune.py starting from given weights without training a baseline."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

import zoo
from zoo.weights.tags import EVAL_KEYS, UnknownTagError, pretrained_cfg, resolve_tag

from ..helpers import ROOT, models_with, put_in_hf_cache
from ..makers import make_image_folder, timm_pipeline_predictions, varied_timm_model

CNN_ARCHS = models_with("timm")  # timm publishes their weights under timm's tags


# ------------------------------------------------------------------------------------------------------ tags
@pytest.mark.parametrize("arch", CNN_ARCHS)
def test_every_timm_tag_is_known_with_its_eval_config(arch):
    published = [t for t in timm.list_pretrained(f"{arch}.*")
                 if timm.models.get_pretrained_cfg(t).hf_hub_id]
    assert sorted(f"{arch}.{t}" for t in zoo.weights.tags.tag_cfgs(arch)) == sorted(published)
    for full in published:
        ours = pretrained_cfg(*full.split("."))
        theirs = timm.models.get_pretrained_cfg(full).to_dict()
        for key in EVAL_KEYS:
            if theirs.get(key) is not None:
                assert ours[key] == theirs[key], (full, key)
    if published:
        default = zoo.model_info(arch)["pretrained_tag"]
        assert default == f"{arch}.{timm.models.get_pretrained_cfg(arch).tag}"  # timm's default tag


def test_tagged_model_takes_the_tags_classes_and_input_size():
    model = zoo.create_model("tresnet_m.miil_in1k_448")
    assert model.default_cfg["input_size"] == (3, 448, 448) and model.zoo_tag == "miil_in1k_448"
    assert model.default_cfg == pretrained_cfg("tresnet_m", "miil_in1k_448")
    assert zoo.create_model("tresnet_m.miil_in21k").num_classes == 11221
    with pytest.raises(UnknownTagError, match=r"known tags: tresnet_m\.miil_in21k_ft_in1k, tresnet_m\.miil_in21k"):
        zoo.create_model("tresnet_m.miil_in22k", pretrained=True)
    with pytest.raises(UnknownTagError, match="no published pretrained weights"):
        resolve_tag("mobilenetv2_035", None)


# ----------------------------------------------------------------------------------------- weight sources
def test_every_source_gives_timms_outputs(tmp_path, offline_hub):
    reference = varied_timm_model("mobilenetv2_050", 1000)
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    files = {"safetensors": tmp_path / "w.safetensors", "pth": tmp_path / "w.pth", "bin": tmp_path / "w.bin"}
    save_file(state, str(files["safetensors"]))
    torch.save(state, files["pth"])
    torch.save({"state_dict": state}, files["bin"])
    put_in_hf_cache(offline_hub, "timm/mobilenetv2_050.lamb_in1k", files["safetensors"])
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        expected = reference(x)
        sources = [*files.values(), "timm/mobilenetv2_050.lamb_in1k", "hf-hub:timm/mobilenetv2_050.lamb_in1k", True]
        for source in sources:
            model = zoo.create_model("mobilenetv2_050.lamb_in1k", pretrained=source).eval()
            torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5, msg=str(source))
        plain = zoo.create_model("mobilenetv2_050", pretrained=True).eval()  # the default tag
        torch.testing.assert_close(plain(x), expected, rtol=1e-5, atol=1e-5)
        assert plain.zoo_tag == "lamb_in1k"
        saved = zoo.save_checkpoint(plain, tmp_path / "ours.safetensors")
        back = zoo.load(saved).eval()  # a project checkpoint keeps the tag and its eval config
        assert back.zoo_tag == "lamb_in1k" and back.default_cfg["interpolation"] == "bicubic"
        torch.testing.assert_close(back(x), expected, rtol=1e-5, atol=1e-5)


def test_wrong_architecture_names_the_closest_model(tmp_path):
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in zoo.create_model("mobilenetv2_035").state_dict().items()}, str(weights))
    with pytest.raises(zoo.WeightsError, match="fit mobilenetv2_035 best"):
        zoo.create_model("mobilenetv2_050", pretrained=weights)


# ----------------------------------------------------------------------------------- evaluation equals timm's
def test_imagefolder_evaluation_equals_timms_pipeline(tmp_path):
    from omegaconf import OmegaConf

    from zoo.training import build_loaders, evaluate

    root = make_image_folder(tmp_path / "images")
    reference = varied_timm_model("mobilenetv2_050", 3)
    weights = tmp_path / "w.pth"
    torch.save(reference.state_dict(), weights)
    timm_logits, labels = timm_pipeline_predictions(reference, root / "val")
    data_cfg = OmegaConf.create({"name": "imagefolder", "root": str(root), "image_size": None, "batch_size": 4,
                                 "eval_batch_size": 4, "num_workers": 0, "hflip": 0.5, "scale": [0.08, 1.0]})
    data = build_loaders(data_cfg, model_cfg=pretrained_cfg("mobilenetv2_050", "lamb_in1k"))
    assert data.input_size == (3, 224, 224)
    model = zoo.create_model("mobilenetv2_050.lamb_in1k", pretrained=weights, num_classes=3).eval()
    with torch.no_grad():
        ours = torch.cat([model(images) for images, _ in data.val])
    ours_labels = torch.cat([t for _, t in data.val])
    assert torch.equal(ours_labels, labels)
    torch.testing.assert_close(ours, timm_logits, rtol=1e-4, atol=1e-4)
    timm_top1 = 100.0 * int((timm_logits.argmax(1) == labels).sum()) / len(labels)
    metrics = evaluate(model, data.val, task="classification")
    assert metrics["acc1"] == pytest.approx(timm_top1, abs=1e-9)
    assert 0 < len(set(timm_logits.argmax(1).tolist()))


@pytest.mark.parametrize("full", ["resnetv2_50x1_bit.goog_in21k_ft_in1k", "tresnet_m.miil_in1k_448",
                                  "mobilenetv2_140.ra_in1k"])
def test_eval_transform_is_timms_for_the_tag(full, tmp_path):
    from omegaconf import OmegaConf
    from timm.data import create_transform, resolve_data_config

    from zoo.training.data import _transforms

    cfg = OmegaConf.create({"image_size": None, "hflip": 0.5, "scale": [0.08, 1.0]})
    _, ours = _transforms(cfg, pretrained_cfg(*full.split(".")))
    theirs = create_transform(**resolve_data_config({}, pretrained_cfg=timm.models.get_pretrained_cfg(full).to_dict(),
                                                    use_test_size=True), is_training=False)
    assert repr(ours) == repr(theirs)


# ------------------------------------------------------------------------------------ prune.py from weights


# ---------------------------------------------------------------------------------- the published protocol
IMAGENET_EXPERIMENTS = {"imagenet_mobilenetv2_100": ("mobilenetv2_100", "ra_in1k", [1.41, 1.63, 1.95, 2.49]),
                        "imagenet_mobilenetv2_140": ("mobilenetv2_140", "ra_in1k", [1.61, 1.99, 2.72]),
                        "imagenet_tresnet_m": ("tresnet_m", "miil_in1k", [1.5, 2.0]),
                        "imagenet_bit_50x1": ("resnetv2_50x1_bit", "goog_distilled_in1k", [1.5, 2.0])}


@pytest.mark.parametrize("experiment", list(IMAGENET_EXPERIMENTS))
def test_imagenet_experiments_compose_to_the_published_setup(experiment, tmp_path):
    from hydra import compose, initialize_config_dir

    from zoo.jobs.model_spec import weights_arg
    from zoo.jobs.prune_config import register_configs
    from zoo.jobs.prune_request import read_request

    register_configs(ROOT / "conf")
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    overrides = [f"experiment={experiment}", f"data.root={tmp_path}", "paths.output_dir=unused"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        sweep = compose(config_name="prune", overrides=overrides, return_hydra_config=True).hydra.sweeper.params
        cfg = compose(config_name="prune", overrides=overrides)
    name, tag, targets = IMAGENET_EXPERIMENTS[experiment]
    assert (cfg.model.name, cfg.model.tag, weights_arg(cfg.checkpoint)) == (name, tag, True)
    assert cfg.data.name == "imagefolder" and cfg.data.image_size is None  # the tag's eval config
    assert cfg.prune.batch_size == 128 and cfg.prune.device == "cuda" and cfg.finetune.distill_weight == 0.3
    assert [float(t) for t in str(sweep["prune.target_speedup"]).split(",")] == targets
    assert cfg.prune.target_speedup == targets[0]
    resolve_tag(name, tag)  # a tag timm publishes
    if not torch.cuda.is_available():
        with pytest.raises(zoo.ZooError, match="CUDA"):
            read_request(cfg)


# ------------------------------------------------------------------------ review findings, kept fixed
def test_the_eval_config_follows_the_weights_tag(tmp_path, offline_hub):
    from omegaconf import OmegaConf

    from zoo.jobs.model_spec import data_model_cfg

    tagged = zoo.create_model("resnetv2_50x1_bit.goog_in21k_ft_in1k", num_classes=10)
    ckpt = zoo.save_checkpoint(tagged, tmp_path / "bit.safetensors")
    untagged = OmegaConf.create({"name": "resnetv2_50x1_bit", "tag": None, "pretrained": False})
    assert data_model_cfg(untagged, str(ckpt))["input_size"] == (3, 448, 448)  # a checkpoint carries its tag
    assert data_model_cfg(untagged, True)["tag"] == "goog_distilled_in1k"  # true: timm's default tag
    assert data_model_cfg(untagged, "hf-hub:timm/resnetv2_50x1_bit.goog_in21k/")["num_classes"] == 21843
    assert zoo.create_model("resnetv2_50x1_bit", pretrained=ckpt).default_cfg["interpolation"] == "bilinear"
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in zoo.create_model("mobilenetv2_050").state_dict().items()}, str(weights))
    put_in_hf_cache(offline_hub, "timm/mobilenetv2_050.lamb_in1k", weights)
    for source in ("timm/mobilenetv2_050.lamb_in1k", "hf-hub:timm/mobilenetv2_050.lamb_in1k/", "true"):
        assert zoo.create_model("mobilenetv2_050", pretrained=source).zoo_tag == "lamb_in1k", source


def test_a_folder_of_several_checkpoints_is_ambiguous(tmp_path):
    model = zoo.create_model("mobilenetv2_035", num_classes=10)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    zoo.save_checkpoint(model, folder / "best.safetensors")
    zoo.save_checkpoint(model, folder / "last.safetensors")
    with pytest.raises(zoo.WeightsError, match="several weight files .*best.safetensors, last.safetensors"):
        zoo.create_model("mobilenetv2_035", pretrained=folder)
    (folder / "last.safetensors").unlink()  # one file: used, with its metadata (the 10-class head)
    assert zoo.create_model("mobilenetv2_035", pretrained=folder).num_classes == 10
    shards = tmp_path / "shards"
    shards.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    keys = sorted(state)
    save_file({k: state[k] for k in keys[:50]}, str(shards / "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in keys[50:]}, str(shards / "model-00002-of-00002.safetensors"))
    loaded = zoo.create_model("mobilenetv2_035", pretrained=shards, num_classes=10)
    assert all(torch.equal(loaded.state_dict()[k], state[k]) for k in keys)


def test_missing_local_paths_are_not_hub_ids():
    with pytest.raises(zoo.WeightsError, match="Weight file or folder /nonexistent/dir does not exist"):
        zoo.weights.pretrained.check_source("/nonexistent/dir")
    assert zoo.weights.pretrained.is_local("./weights/x") and zoo.weights.pretrained.is_local("~/x")
    assert not zoo.weights.pretrained.is_local("timm/mobilenetv2_050.lamb_in1k")


def test_the_mismatch_hint_never_names_the_model_in_use(tmp_path):
    state = {k: v.contiguous() for k, v in zoo.create_model("mobilenetv2_050").state_dict().items()}
    state["extra.weight"] = state.pop("conv_stem.weight")
    weights = tmp_path / "w.safetensors"
    save_file(state, str(weights))
    with pytest.raises(zoo.WeightsError) as err:
        zoo.create_model("mobilenetv2_050", pretrained=weights)
    assert "fit mobilenetv2_050 best" not in str(err.value) and "No other registered model" in str(err.value)


def test_caches_see_what_the_config_does_not(tmp_path):
    """The baseline-evaluation key sees the validation split's contents; the weights digest sees model options."""
    from omegaconf import OmegaConf

    from zoo.jobs.baseline import split_digest
    from zoo.pruning.importance import weights_digest
    from zoo.training import build_loaders

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    cfg = OmegaConf.create({"name": "text", "files": [str(corpus)], "tokenizer": "bytes", "seq_len": 16,
                            "batch_size": 4, "eval_batch_size": 4, "train_samples": 4, "val_samples": 4,
                            "val_fraction": 0.2, "num_workers": 0})
    before = split_digest(build_loaders(cfg).val.dataset)
    corpus.write_text("a different text of the same length, or near enough\n" * 170)
    assert before is not None and split_digest(build_loaders(cfg).val.dataset) != before
    root = make_image_folder(tmp_path / "images", classes=2, train=2, val=2)
    image_cfg = OmegaConf.create({"name": "imagefolder", "root": str(root), "image_size": 16, "batch_size": 2,
                                  "eval_batch_size": 2, "num_workers": 0, "hflip": 0.5, "scale": [0.08, 1.0]})
    before = split_digest(build_loaders(image_cfg).val.dataset)
    Image.new("RGB", (64, 64), (255, 0, 0)).save(next((root / "val").rglob("*.png")))
    assert split_digest(build_loaders(image_cfg).val.dataset) != before
    torch.manual_seed(0)
    a = zoo.create_model("retnet_tiny")
    b = zoo.create_model("retnet_tiny", rope="neox")
    b.load_state_dict(a.state_dict())
    assert weights_digest(a) != weights_digest(b)


def test_list_pretrained_prints_every_tag(capsys):
    from zoo.__main__ import main

    assert main(["list", "--pretrained"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines()[2:-1]]
    assert rows == zoo.known_tags()
    assert "mobilenetv2_140.ra_in1k" in rows and len(rows) >= 20
    line = next(r for r in out.splitlines() if r.startswith("tresnet_m.miil_in1k_448 "))
    assert "448x448" in line and "bilinear" in line


def test_info_takes_a_tag(capsys):
    from zoo.__main__ import main

    assert main(["info", "tresnet_m.miil_in1k_448"]) == 0
    assert json.loads(capsys.readouterr().out)["eval_cfg"]["input_size"] == [3, 448, 448]



@pytest.mark.parametrize("name", ["timm/vit_tiny_patch16_224", "timm/convnext_atto.d2_in1k", "mobilenetv2_100",
                                  "tresnet_m.miil_in21k_ft_in1k", "timm/mixer_s16_224.untrained"])
def test_the_models_pretrained_cfg_is_timms_whole(name):
    """Untagged, tagged, declared or any timm name: the model's pretrained_cfg is timm's, every key (the fixed input
    size, the test size and crop, the architecture's own name), so timm's data pipeline resolves the same eval config;
    a tag timm lists without weights builds when no weights are asked and is refused with the reason when they are."""
    from timm.data import resolve_data_config

    with torch.device("meta"):  # no weights, no discovery: the config is what is compared
        ours = zoo.create_model(name)
        theirs = timm.create_model(name.removeprefix("timm/"))
    assert dict(ours.pretrained_cfg) == dict(theirs.pretrained_cfg) and ours.default_cfg == ours.pretrained_cfg
    for test_size in (False, True):
        assert resolve_data_config(model=ours, use_test_size=test_size) == resolve_data_config(
            model=theirs, use_test_size=test_size)
    if name.endswith(".untrained"):
        with pytest.raises(UnknownTagError, match="names no published weights"):
            zoo.create_model(name, pretrained=True)
