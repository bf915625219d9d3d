"""What the tests make, shared by the tiers: tiny Hydra configs of train.py, fla RetNet checkpoints, timm models with
varied weights and image folders, and the inputs of the bad-input catalogue."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

import zoo
from zoo.jobs import runs
from zoo.jobs.cli import register_resolvers
from zoo.jobs.train_config import register_configs
from zoo.training import Trainer, build_loaders, seed_everything

from .helpers import ROOT

# ----------------------------------------------------------------------------------------------- train.py configs

CONF = ROOT / "conf"


TINY_DIGITS = ["data.image_size=16", "data.batch_size=32", "trainer.max_epochs=2", "trainer.limit_train_batches=4",
               "trainer.progress=false", "model=mobilenetv2_035", "optim.warmup_epochs=0"]


def tiny(*changes: str) -> list[str]:
    """TINY_DIGITS with `changes` replacing the entries for the same keys (Hydra refuses duplicates)."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in TINY_DIGITS if o.split("=", 1)[0] not in keys] + list(changes)


def compose(overrides: list[str], output_dir: Path | None = None):
    """A real Hydra composition of conf/train.yaml (paths.output_dir replaced, it needs a Hydra run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs(CONF)
    register_resolvers()
    extra = [f"paths.output_dir={output_dir}"] if output_dir else ["paths.output_dir=unused"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=[*overrides, *extra])


def tiny_cfg(tmp_path: Path, *extra: str):
    return compose(tiny("logger=none", *extra), output_dir=tmp_path)


def fresh_trainer(cfg, callbacks=(), output_dir=None, **kwargs) -> Trainer:
    seed_everything(cfg.trainer.seed)
    data = build_loaders(cfg.data, seed=cfg.trainer.seed)
    model = zoo.create_model(cfg.model.name, num_classes=data.num_classes, **cfg.model.overrides)
    return Trainer(model, data, cfg.optim, cfg.trainer, callbacks=callbacks, output_dir=output_dir, **kwargs)


# ----------------------------------------------------------------------------------------------- fla RetNet

def fla_config(**changes):
    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 2, "vocab_size": 300, "hidden_ratio": 2,
              "expand_k": 1, "expand_v": 2, "norm_eps": 1e-6, "elementwise_affine": True,
              "tie_word_embeddings": False, **changes}
    import fla.models as fla_models  # a test dependency ([dev]): the reference implementation

    return fla_models.RetNetConfig(fuse_norm=False, fuse_swiglu=False, fuse_cross_entropy=False, **config)


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights large enough that the per-head norm's eps is negligible, norm scales away from 1."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand_like(p) + 0.5 if p.dim() == 1 else torch.randn_like(p) * 0.2)
    return model.eval()


def save_fla_folder(model, folder: Path, fused_norm_names: bool = True, fused_mlp: bool = False) -> Path:
    """The layout fla-hub repos have: config.json + model.safetensors, with the published key names
    (``g_norm_swish_gate``: fla's default fused norm) and optionally the older fused gate/up projection."""
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.update(fuse_norm=True)  # as published
    (folder / "config.json").write_text(json.dumps(config, default=str))
    state = {}
    for key, tensor in model.state_dict().items():
        if fused_norm_names:
            key = key.replace("attn.g_norm.weight", "attn.g_norm_swish_gate.weight")
        state[key] = tensor.contiguous()
    if fused_mlp:
        for key in [k for k in state if k.endswith("mlp.gate_proj.weight")]:
            up = state.pop(key.replace("gate_proj", "up_proj"))
            state[key] = torch.cat([state[key], up], dim=0)
    save_file(state, str(folder / "model.safetensors"))
    return folder



def make_tokenizer(folder: Path, text: str, vocab_size: int) -> Path:
    """A byte-level BPE tokenizer trained on `text`, saved as transformers saves one (loads offline by path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(str(folder))
    return folder

# ------------------------------------------------------------------------------------- timm models, images

def varied_timm_model(name: str, num_classes: int, seed: int = 0) -> torch.nn.Module:
    """A timm model with random weights whose predictions differ between images (random BN statistics)."""
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=num_classes)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.1)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.data.uniform_(0.5, 1.5)
    return model.eval()


def make_image_folder(root: Path, classes: int = 3, train: int = 4, val: int = 4, seed: int = 0) -> Path:
    """root/{train,val}/<class>/*: images of different sizes, aspect ratios, modes and formats."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                h, w = int(rng.integers(180, 320)), int(rng.integers(180, 320))
                pixels = (rng.random((h, w, 3)) * 255 * (0.3 + 0.7 * c / classes)).astype(np.uint8)
                image = Image.fromarray(pixels)
                if i % 3 == 1:
                    image = image.convert("L")
                image.save(folder / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def timm_pipeline_predictions(model: torch.nn.Module, val_root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels as timm's validate script computes them: resolve_data_config + create_transform on an
    ImageDataset of the folder."""
    from timm.data import ImageDataset, create_transform, resolve_data_config

    config = resolve_data_config({}, model=model, use_test_size=True)
    dataset = ImageDataset(str(val_root), transform=create_transform(**config, is_training=False))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    logits, labels = [], []
    with torch.no_grad():
        for images, targets in loader:
            logits.append(model(images))
            labels.append(targets)
    return torch.cat(logits), torch.cat(labels)


# ------------------------------------------------------------------------------------------------ bad input

def bad_input_files(base: Path) -> dict[str, Path]:
    """Inputs the bad-input cases point at, made in `base`: another run's directory, checkpoints, weight files, plans,
    image folders."""
    victim = base / "victim"
    runs.write_record(victim, "train", {"model": {"name": "tresnet_m"}, "trainer": {"seed": 7}})
    (victim / "results.json").write_text('{"metrics": {"val/acc1": 91.0}}')
    (victim / "checkpoints").mkdir()
    (victim / "checkpoints" / "best.safetensors").write_bytes(b"weights of another run")
    prune_victim = base / "prune-victim"
    runs.write_record(prune_victim, "prune", {"model": {"name": "tresnet_m"}})
    (prune_victim / "results.json").write_text("{}")
    (prune_victim / "plan.json").write_text('{"remove": []}')
    mbv2 = zoo.create_model("mobilenetv2_035", num_classes=10)
    paths = {"victim": victim, "prune_victim": prune_victim, "base": base,
             "ckpt": zoo.save_checkpoint(mbv2, base / "mbv2_035.safetensors"),
             "other_ckpt": zoo.save_checkpoint(zoo.create_model("mobilenetv2_050", num_classes=10),
                                               base / "mbv2_050.safetensors")}
    timm_file = base / "timm_format.safetensors"
    save_file({k: v.contiguous() for k, v in mbv2.state_dict().items()}, str(timm_file))
    paths["timm_file"] = timm_file
    paths["timm_050"] = base / "timm_mobilenetv2_050.pth"
    torch.save(zoo.create_model("mobilenetv2_050", num_classes=10).state_dict(), paths["timm_050"])
    paths["timm_1000"] = base / "timm_mobilenetv2_035_in1k.pth"
    torch.save(zoo.create_model("mobilenetv2_035").state_dict(), paths["timm_1000"])
    truncated = base / "truncated.safetensors"
    truncated.write_bytes(paths["ckpt"].read_bytes()[:5000])
    paths["truncated"] = truncated
    paths["marker"] = base / "pickle-ran"

    class Payload:  # unpickling it would create the marker file
        def __reduce__(self):
            return (os.system, (f"touch {paths['marker']}",))

    torch.save({"conv_stem.weight": torch.zeros(1), "extra": Payload()}, base / "evil.pth")
    paths["evil"] = base / "evil.pth"
    (base / "bad_plan.json").write_text('{"remove": ["blocks.2.1"')
    (base / "unknown_plan.json").write_text('{"remove": ["body.layer1.0"]}')
    (base / "plan_keys.json").write_text('{"remove": [], "prune": true}')
    for split in ("train", "val"):
        for cls in ("a", "b"):
            folder = base / "images" / split / cls
            folder.mkdir(parents=True)
            from PIL import Image

            Image.new("RGB", (20, 20), color=(10 * len(cls), 50, 90)).save(folder / "ok.png")
    (base / "images" / "val" / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (base / "notes.txt").write_text("real text " * 400)
    from zoo.training import state

    state.save_state({"model_name": "mobilenetv2_035", "step": 1}, base / "last.state.pt")
    return paths
