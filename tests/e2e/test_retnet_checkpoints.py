"""Published RetNet checkpoints load into the zoo RetNet with the same logits as their own implementation:
flash-linear-attention's format (config.json + safetensors, as fla-hub/retnet-1.3B-100B) and torchscale's
RetNetDecoder state dict; text tokenised with a real tokenizer (transformers.AutoTokenizer, local files)."""

from __future__ import annotations

import json

import fla.models as fla_models  # noqa: E402 - a test dependency ([dev]): the reference implementation
import pytest
import torch

import zoo

from ..makers import fla_config, make_tokenizer, randomise, save_fla_folder

# ------------------------------------------------------------------------------ a real tokenizer, prune.py


TINY_LM_PRUNE = ["model=retnet_tiny", "data=bytes", "data.seq_len=32", "data.batch_size=4", "data.train_samples=16",
                 "data.val_samples=8", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
                 "trainer.progress=false", "optim.warmup_epochs=0", "prune.batch_size=1", "prune.calib_batches=1",
                 "finetune.epochs=1", "prune.target_speedup=1.2", "logger=none"]


def test_prune_py_from_an_fla_checkpoint_with_its_tokenizer(tmp_path):
    from zoo.training.data import stdlib_corpus

    from ..helpers import QUICK_TIMING, run_prune

    tokenizer = make_tokenizer(tmp_path / "tok", stdlib_corpus().decode()[:200_000], 300)
    folder = save_fla_folder(randomise(fla_models.RetNetForCausalLM(fla_config())), tmp_path / "retnet-fla")
    proc = run_prune(*TINY_LM_PRUNE, *QUICK_TIMING, f"checkpoint={folder}", f"data.tokenizer={tokenizer}",
                     base=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert not (tmp_path / "outputs" / "baselines").exists()  # evaluated, not trained
    assert results["baseline"]["source"] == str(folder) and results["baseline"]["metrics"]["val/loss"] > 0
    pruned = zoo.load(results["checkpoint"])
    kept = [m for b in pruned.blocks for m in (b.retention, b.ffn) if hasattr(m, "norm")]  # a plan removes any
    assert pruned.vocab_size == 300 and kept and all(m.norm is not None for m in kept)  # fla's pre-norms kept
    assert any(b.retention.rope == "neox" for b in pruned.blocks if hasattr(b.retention, "rope"))

    small = make_tokenizer(tmp_path / "tok-big", stdlib_corpus().decode()[:200_000], 400)
    proc = run_prune(*TINY_LM_PRUNE, *QUICK_TIMING, f"checkpoint={folder}", f"data.tokenizer={small}", base=tmp_path,
                     run_dir=tmp_path / "run-bad", timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "has 400 tokens, more than the vocabulary of retnet_tiny" in proc.stdout + proc.stderr


def test_prune_py_writes_the_fla_folder_with_its_card(tmp_path):
    """prune.export=hf with a whole-layer plan: hf/ holds config.json, the weights and the model card; on a CPU the
    folder cannot be run in fla (Triton), which results.json says instead of claiming a check."""
    from huggingface_hub import ModelCard

    from ..helpers import QUICK_TIMING, run_prune

    plan = tmp_path / "layers.json"
    plan.write_text(json.dumps({"remove": ["blocks.1.retention", "blocks.1.ffn"]}))
    proc = run_prune(*TINY_LM_PRUNE, *QUICK_TIMING, "+model.overrides.rope=neox",
                     "+model.overrides.head_norm_affine=true", f"prune.plan={plan}", "prune.export=hf", base=tmp_path,
                     timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    export, folder = results["export"], tmp_path / "run" / "hf"
    assert export["format"] == "hf" and export["path"] == str(folder)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 1
    if not torch.cuda.is_available():
        assert export["passed"] is None and export["checked_with"].startswith("not checked")
    card = ModelCard.load(folder / "README.md")
    assert card.data.pipeline_tag == "text-generation" and "AutoModelForCausalLM" in card.text
    assert "`blocks.1.retention`" in card.text and (tmp_path / "run" / "README.md").is_file()


def test_text_data_with_a_tokenizer(tmp_path):
    from omegaconf import OmegaConf

    from zoo.training import build_loaders
    from zoo.training.data import stdlib_corpus

    text = stdlib_corpus().decode()
    folder = make_tokenizer(tmp_path / "tok", text[:200_000], 300)
    cfg = OmegaConf.create({"name": "bytes", "tokenizer": str(folder), "seq_len": 32, "batch_size": 4,
                            "eval_batch_size": 4, "train_samples": 8, "val_samples": 4, "val_fraction": 0.1,
                            "num_workers": 0})
    data = build_loaders(cfg)
    assert data.num_classes == 300 and data.info["bytes_per_token"] > 1.2  # BPE merges bytes into tokens
    inputs, targets = next(iter(data.train))
    assert inputs.shape == (4, 32) and int(inputs.max()) < 300 and torch.equal(inputs[:, 1:], targets[:, :-1])
    with pytest.raises(zoo.ZooError, match="data.tokenizer='/nonexistent/tok' cannot be loaded"):
        build_loaders(OmegaConf.merge(cfg, {"tokenizer": "/nonexistent/tok"}))
