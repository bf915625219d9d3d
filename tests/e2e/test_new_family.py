"""A model family is one file. The in-tree plain ResNet (zoo/models/plainresnet.py) is checked here the way
docs/architecture.md ("Adding a model family") walks through it, and every registry-driven test and benchmark picks
it up with no list edited; a family from outside the tree (tests/plugin_family.py) reaches train.py and prune.py
through ``DEPTHZOO_MODULES``."""

from __future__ import annotations

import json

import zoo

# ------------------------------------------------------------------------------------------ the command lines
COMMON = ["data.image_size=16", "data.batch_size=32", "trainer.max_epochs=1", "trainer.limit_train_batches=4",
          "trainer.progress=false", "optim.warmup_epochs=0", "logger=none"]


def test_train_py_and_prune_py_take_a_family_from_outside_the_tree(tmp_path, monkeypatch):
    from ..helpers import QUICK_TIMING, run_entry

    monkeypatch.setenv("DEPTHZOO_MODULES", "tests.plugin_family")
    train = run_entry("train", "model=plugin_resnet6", *COMMON, base=tmp_path, run_dir=tmp_path / "train")
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert json.loads((tmp_path / "train" / "results.json").read_text())["model"] == "plugin_resnet6"
    prune = run_entry("prune", "model=plugin_resnet6", *COMMON, "prune.batch_size=2", "prune.calib_batches=1",
                      "finetune.epochs=1", "prune.target_speedup=1.25", *QUICK_TIMING, base=tmp_path,
                      run_dir=tmp_path / "prune")
    assert prune.returncode == 0, prune.stdout[-3000:] + prune.stderr[-3000:]
    results = json.loads((tmp_path / "prune" / "results.json").read_text())
    assert results["model"] == "plugin_resnet6" and results["plan"]["remove"]
    pruned = zoo.load(tmp_path / "prune" / "pruned.safetensors")
    assert pruned.zoo_plan["remove"] == results["plan"]["remove"]
