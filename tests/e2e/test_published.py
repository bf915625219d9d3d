"""Published weights: timm's tags and eval configs, every weight source in one key, evaluation equal to timm's
pipeline, and prune.py starting from given weights without training a baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import save_file

import zoo

from ..helpers import QUICK_TIMING, ROOT, put_in_hf_cache, run_prune
from ..makers import make_image_folder, timm_pipeline_predictions, varied_timm_model

# ------------------------------------------------------------------------------------ prune.py from weights
IMAGENET_LIKE = ["model=mobilenetv2_050", "model.tag=lamb_in1k", "data=imagefolder", "data.batch_size=4",
                 "data.num_workers=0", "trainer.limit_train_batches=2", "trainer.progress=false",
                 "optim.warmup_epochs=0", "prune.batch_size=1", "prune.calib_batches=1", "finetune.epochs=1",
                 "prune.target_speedup=1.2", "logger=none", *QUICK_TIMING]


def test_prune_py_starts_from_published_weights_without_training(tmp_path):
    root = make_image_folder(tmp_path / "images")
    reference = varied_timm_model("mobilenetv2_050", 3)
    weights = tmp_path / "timm_mobilenetv2_050.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(weights))
    timm_logits, labels = timm_pipeline_predictions(reference, root / "val")
    timm_top1 = 100.0 * int((timm_logits.argmax(1) == labels).sum()) / len(labels)

    proc = run_prune(*IMAGENET_LIKE, f"data.root={root}", f"checkpoint={weights}", base=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert not (tmp_path / "outputs" / "baselines").exists()  # no baseline was trained
    assert results["baseline"]["metrics"]["val/acc1"] == pytest.approx(timm_top1, abs=1e-4)
    assert results["baseline"]["source"] == str(weights) and results["baseline"]["metrics_cached"] is False
    assert results["tag"] == "lamb_in1k" and results["condition"]["input_size"] == [3, 224, 224]
    card = ModelCard.load(tmp_path / "run" / "README.md")
    assert card.data.base_model == "timm/mobilenetv2_050.lamb_in1k"  # the tag's hub id, from model + tag

    # the same weights through the HF cache (checkpoint=true: the tag's hub id): evaluated once, then cached
    hf = tmp_path / "hf"
    put_in_hf_cache(hf, "timm/mobilenetv2_050.lamb_in1k", weights)
    env = {"HF_HOME": str(hf), "HF_HUB_OFFLINE": "1"}
    proc = run_prune(*IMAGENET_LIKE, f"data.root={root}", "checkpoint=true", "prune.target_speedup=1.3",
                     base=tmp_path, run_dir=tmp_path / "run2", timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    second = json.loads((tmp_path / "run2" / "results.json").read_text())
    assert second["baseline"]["metrics_cached"] is True
    assert second["baseline"]["metrics"] == results["baseline"]["metrics"]
    assert second["baseline"]["source"] == "hf-hub:timm/mobilenetv2_050.lamb_in1k"
    assert not (tmp_path / "outputs" / "baselines").exists()


# ---------------------------------------------------------------------------------- the published protocol


def test_train_py_fine_tunes_from_published_weights(tmp_path):
    """train.py model.pretrained=<timm file> model.tag=...: the tag's eval transform, the weights as the start."""
    root = make_image_folder(tmp_path / "images", classes=3, train=4, val=2)
    reference = varied_timm_model("mobilenetv2_050", 3)
    weights = tmp_path / "timm.pth"
    torch.save(reference.state_dict(), weights)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "train.py"), "model=mobilenetv2_050", "model.tag=lamb_in1k",
           f"model.pretrained={weights}", "data=imagefolder", f"data.root={root}", "data.batch_size=4",
           "data.num_workers=0", "trainer.max_epochs=1", "trainer.progress=false", "optim.warmup_epochs=0",
           "optim.lr=1e-9", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", f"paths.log_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    timm_logits, labels = timm_pipeline_predictions(reference, root / "val")
    timm_top1 = 100.0 * int((timm_logits.argmax(1) == labels).sum()) / len(labels)
    # a learning rate of 1e-9 leaves the weights (and BatchNorm's running statistics move only in training mode,
    # which an epoch of 3 batches does): top-1 stays within one image of timm's evaluation of the given weights
    assert abs(results["metrics"]["val/acc1"] - timm_top1) <= 100.0 / len(labels) + 1e-6
    assert zoo.load(results["checkpoint"]).zoo_tag == "lamb_in1k"


