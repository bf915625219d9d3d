"""train.py and the training library: config composition, tiny real training runs, W&B offline files read
back, checkpoints/resume, faults (NaN, signals, kill -9 during a save), DDP on 2 CPU processes, benchmark."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import zoo
from zoo.jobs.cli import register_resolvers
from zoo.jobs.train_config import register_configs, validate
from zoo.training import (
    Callback,
    CheckpointError,
    ConfigError,
    DataError,
    NonFiniteLossError,
    TrainingInterrupted,
    build_loaders,
    evaluate,
    fit,
    model_name_from_checkpoint,
    seed_everything,
)
from zoo.training import state as ckpt
from zoo.training.data import read_text_files, stdlib_corpus, unigram_entropy

from ..makers import CONF, compose, fresh_trainer, tiny_cfg
from ..wandb_reader import find_run_files, read_run


# ----------------------------------------------------------------------------------------- composition
def _options(group: str) -> list[str]:
    """The group's options for train.yaml (experiments that configure ``prune:`` belong to prune.yaml)."""
    import yaml

    if group == "model":  # every registered model is an option; no YAML needed
        return zoo.list_models()
    paths = sorted((CONF / group).glob("*.yaml"))
    return [p.stem for p in paths if group != "experiment" or "prune" not in (yaml.safe_load(p.read_text()) or {})]


REQUIRED = {"imagefolder": ["data.root={tmp}"], "text": ["data.files=[{tmp}/a.txt]"]}


@pytest.mark.parametrize("group", ["data", "optim", "trainer", "logger", "paths", "experiment"])  # (model: every
def test_every_group_option_composes(group, tmp_path):  # registered model, 8 s on 2 cores: tests/e2e/test_train.py
    assert _options(group), f"conf/{group} is empty"
    for option in _options(group):
        for folder in ("train", "val"):
            (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / "a.txt").write_text("some text")
        overrides = [f"{group}={option}", *(o.format(tmp=tmp_path) for o in REQUIRED.get(option, []))]
        model = zoo.get_entry(option) if group == "model" else None
        if model is not None and model.task == "language_model":
            overrides.append("data=bytes")
        if group == "data" and option in ("bytes", "text"):
            overrides.append("model=retnet_tiny")
        cfg = compose(overrides, tmp_path)
        if group == "model":
            assert cfg.model.name == option
        if group == "data":
            assert cfg.data.name == option
        if cfg.trainer.device == "cuda" and not torch.cuda.is_available():  # trainer=gpu: refused before any work
            with pytest.raises(ConfigError, match="no CUDA device is available"):
                validate(cfg)
        else:
            validate(cfg)


def test_hydra_group_and_resolvers_compose(tmp_path):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs(CONF)
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="train", return_hydra_config=True)
    assert "/train/runs/" in cfg.hydra.run.dir and cfg.hydra.job.chdir is False


@pytest.mark.parametrize("override, message", [
    ("trainer.max_epoch=3", "max_epoch"),
    ("trainer.max_epochs=three", "max_epochs"),
    ("data.batchsize=3", "batchsize"),
])
def test_typos_and_bad_types_fail_at_composition(override, message, tmp_path):
    with pytest.raises(Exception, match=message):
        compose([override], tmp_path)


@pytest.mark.parametrize("overrides, message", [
    (["trainer.precision=fp64"], "trainer.precision"),
    (["logger.mode=sometimes"], "logger.mode"),
    (["data=bytes"], "image classifier"),
    (["optim.lr=0"], "optim.lr"),
])
def test_validate_rejects_bad_values(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides, tmp_path))


# ------------------------------------------------------------------------------------------------ data
def test_digits_and_synthetic_loaders(tmp_path):
    cfg = compose(["data.image_size=24"], tmp_path)
    data = build_loaders(cfg.data, seed=0)
    assert (data.task, data.num_classes, data.input_size) == ("classification", 10, (3, 24, 24))
    assert data.info["train_size"] == 1437 and data.info["val_size"] == 360
    synthetic = build_loaders(compose(["data=synthetic", "data.num_classes=7"], tmp_path).data, seed=0)
    assert synthetic.num_classes == 7
    first = [idx for _, idx in data.sampler]
    data.sampler.set_epoch(1)
    assert first != [idx for _, idx in data.sampler], "each epoch has its own (seeded) order"
    data.sampler.set_epoch(0, start=5)
    assert [idx for _, idx in data.sampler] == first[5:]


def test_bytes_corpus_is_embedded_and_deterministic(tmp_path):
    corpus = stdlib_corpus()
    assert corpus == stdlib_corpus() and len(corpus) > 100_000
    tokens = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)
    assert 2.0 < unigram_entropy(tokens) < torch.log(torch.tensor(256.0)).item()
    data = build_loaders(compose(["data=bytes", "model=retnet_tiny", "data.seq_len=32"], tmp_path).data, seed=0)
    inputs, targets = next(iter(data.train))
    assert data.task == "language_model" and data.num_classes == 256 and inputs.shape == (32, 32)
    assert torch.equal(inputs[:, 1:], targets[:, :-1]) and inputs.dtype == torch.long
    assert data.info["unigram_entropy"] > 0


def test_text_files_and_missing_files(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 400)
    (tmp_path / "b.txt").write_text("more text here\n" * 400)
    assert read_text_files([str(tmp_path / "*.txt")]).count(b"hello") == 400
    cfg = compose(["data=text", "model=retnet_tiny", f"data.files=[{tmp_path}/*.txt]", "data.seq_len=16"], tmp_path)
    assert build_loaders(cfg.data, seed=0).task == "language_model"
    with pytest.raises(DataError, match="matches no file"):
        read_text_files([str(tmp_path / "missing.txt")])


def test_imagefolder_from_tiny_pngs(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for label, color in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
            folder = tmp_path / "images" / split / label
            folder.mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (20, 18), tuple(c + 5 * i for c in color)).save(folder / f"{i}.png")
    cfg = compose(["data=imagefolder", f"data.root={tmp_path / 'images'}", "data.image_size=16", "data.batch_size=4",
                   "data.num_workers=0", "model=mobilenetv2_035", "trainer.max_epochs=1", "trainer.progress=false",
                   "logger=none"], tmp_path)
    data = build_loaders(cfg.data, seed=0, model_cfg=zoo.get_entry("mobilenetv2_035").default_cfg)
    assert data.num_classes == 2 and data.input_size == (3, 16, 16)
    model = zoo.create_model("mobilenetv2_035", num_classes=2)
    result = fit(model, data, cfg.optim, cfg.trainer)
    assert result.steps == 2 and "val/acc1" in result.metrics


def test_missing_data_roots_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="data.download=true"):
        build_loaders(compose(["data=cifar10", f"data.root={tmp_path / 'none'}"], tmp_path).data)
    with pytest.raises(DataError, match="train/ and val/"):
        build_loaders(compose(["data=imagefolder", f"data.root={tmp_path}"], tmp_path).data)


# ---------------------------------------------------------------------------------------------- engine
def test_evaluate_distillation_and_callback_progress(tmp_path):
    cfg = tiny_cfg(tmp_path, "trainer.max_epochs=2")

    class Recorder(Callback):
        def __init__(self):
            self.progress, self.epochs = [], []

        def on_step_end(self, trainer):
            self.progress.append(trainer.progress)

        def on_epoch_end(self, trainer, metrics):
            self.epochs.append(metrics["trainer/epoch"])

    recorder = Recorder()
    seed_everything(0)
    data = build_loaders(cfg.data, seed=0)
    teacher = zoo.create_model("mobilenetv2_035", num_classes=10)
    student = zoo.create_model("mobilenetv2_035", num_classes=10)
    result = fit(student, data, cfg.optim, cfg.trainer, teacher=teacher, distill_weight=0.5, callbacks=[recorder])
    assert recorder.progress == sorted(recorder.progress) and recorder.progress[-1] == pytest.approx(1.0)
    assert recorder.epochs == [1, 2] and result.steps == 8 and result.last_checkpoint is None
    metrics = evaluate(student, data.val, "classification")
    assert set(metrics) == {"loss", "acc1", "acc5"} and 0 <= metrics["acc1"] <= 100
    assert metrics["acc1"] == pytest.approx(result.metrics["val/acc1"])
    assert all(p.requires_grad for p in teacher.parameters()), "the teacher is the caller's: fit must not freeze it"


def test_bits_per_byte_follow_the_bytes_per_token(tmp_path):
    """val bpb = loss / ln 2 / bytes per token: byte tokens are one byte each; a tokenizer's tokens cover more."""
    import math

    from zoo.training.data import FixedWindows

    data = build_loaders(compose(["data=bytes", "model=retnet_tiny", "data.seq_len=32", "data.val_samples=8"],
                                 tmp_path).data, seed=0)
    model = zoo.create_model("retnet_tiny")
    metrics = evaluate(model, data.val, "language_model")
    assert data.info["bytes_per_token"] == 1.0
    assert metrics["bpb"] == pytest.approx(metrics["loss"] / math.log(2))
    windows = data.val.dataset
    wider = torch.utils.data.DataLoader(FixedWindows(windows.tokens, 32, 8, bytes_per_token=4.0), batch_size=8)
    assert evaluate(model, wider, "language_model")["bpb"] == pytest.approx(metrics["bpb"] / 4.0)


def test_digits_train_samples_is_a_fixed_stratified_subset(tmp_path):
    """data.train_samples makes digits harder: that many training images, every class in proportion, the same on
    every run; the validation split is untouched. Fewer than one image per class is refused."""
    cfg = compose(["data.image_size=8", "data.train_samples=300", "data.shift=0"], tmp_path)
    data = build_loaders(cfg.data, seed=0)
    again = build_loaders(cfg.data, seed=5)
    assert (data.info["train_size"], data.info["val_size"]) == (300, 360)
    labels = data.train.dataset.dataset.targets
    assert torch.equal(labels, again.train.dataset.dataset.targets)
    counts = torch.bincount(labels, minlength=10)
    assert counts.min() >= 28 and counts.max() <= 32, counts
    with pytest.raises(DataError, match="train_samples=5 is fewer than the 10 classes"):
        build_loaders(compose(["data.train_samples=5"], tmp_path).data, seed=0)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_resume_refuses_another_model(tmp_path):
    cfg = tiny_cfg(tmp_path, "trainer.max_epochs=1")
    fresh_trainer(cfg, output_dir=tmp_path).fit()
    other = fresh_trainer(tiny_cfg(tmp_path, "model=mobilenetv2_050"), output_dir=tmp_path / "other")
    with pytest.raises(CheckpointError, match="written for model=mobilenetv2_035"):
        other.fit(resume_from=ckpt.resolve_resume(tmp_path, None))
    assert model_name_from_checkpoint(tmp_path / "checkpoints" / "best.safetensors") == "mobilenetv2_035"


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    class Poison(Callback):
        def on_step_end(self, trainer):
            if trainer.epoch == 1 and trainer.batch_in_epoch == 2:
                with torch.no_grad():
                    trainer.model.classifier.weight.fill_(float("nan"))

    trainer = fresh_trainer(tiny_cfg(tmp_path, "trainer.max_epochs=3"), callbacks=[Poison()], output_dir=tmp_path)
    last = tmp_path / "checkpoints" / "last.safetensors"
    with pytest.raises(NonFiniteLossError, match="last good checkpoint"):
        trainer.fit()
    meta = zoo.read_checkpoint_meta(last)
    assert meta["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in zoo.load(last).state_dict().values() if v.is_floating_point())


def test_sigterm_saves_last_and_stops(tmp_path):
    class Kill(Callback):
        def on_step_end(self, trainer):
            if trainer.step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    def before(signum, frame):  # the process's own handlers, which training must put back
        raise AssertionError("the trainer's handler should have caught this signal")

    previous = {s: signal.signal(s, before) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        trainer = fresh_trainer(tiny_cfg(tmp_path), callbacks=[Kill()], output_dir=tmp_path)
        with pytest.raises(TrainingInterrupted) as info:
            trainer.fit()
        assert signal.getsignal(signal.SIGTERM) is before and signal.getsignal(signal.SIGINT) is before
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert info.value.signum == signal.SIGTERM
    state = ckpt.load_state(tmp_path / "checkpoints" / "last.state.pt")
    assert (state["epoch"], state["batch_in_epoch"], state["step"]) == (0, 3, 3)


# ------------------------------------------------------------------------------------------ W&B logger
def test_wandb_online_without_key_falls_back_to_offline(tmp_path, monkeypatch):
    from zoo.training.logger import WandbLogger

    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="offline"):
        logger = WandbLogger(mode="online", save_dir=tmp_path, config={"a": 1}, init_timeout=15)
    try:
        logger.log({"train/loss": 1.5}, step=1)
        logger.summary({"val/acc1": 50.0})
    finally:
        logger.finish()
    assert time.perf_counter() - start < 60
    run = read_run(find_run_files(tmp_path)[0])
    assert run.history[0]["train/loss"] == 1.5 and run.summary["val/acc1"] == 50.0 and run.config["a"] == 1
