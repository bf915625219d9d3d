"""Config schemas of the Hydra entry points (dataclasses) and the checks no type system can do.

The schemas are registered in Hydra's ConfigStore by :func:`register_configs` (Hydra is imported only
there), so a misspelt key or a wrongly typed value fails at composition time, before any work starts.
:func:`validate` then checks choices and cross-group consistency (model vs data) with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

IMAGE_DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
TEXT_DATASETS = ("bytes", "text")
PRECISIONS = ("fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
LOGGER_MODES = ("online", "offline", "disabled")
MONITOR_MODES = ("max", "min")


@dataclass
class ModelConfig:
    """`name`: a registered zoo model; `num_classes: null` takes the data set's class count."""

    name: str = "mobilenetv2_050"
    pretrained: Any = False
    num_classes: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """One schema for every data set; each ``conf/data/*.yaml`` sets the fields its data set uses."""

    name: str = "digits"
    root: str | None = None
    download: bool = False
    image_size: int | None = None
    batch_size: int = 64
    eval_batch_size: int | None = None
    num_workers: int = 0
    val_fraction: float = 0.2
    hflip: float = 0.5
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    shift: int = 0
    num_classes: int = 10
    num_samples: int = 512
    seq_len: int = 128
    train_samples: int | None = None
    val_samples: int | None = None
    files: list[str] = field(default_factory=list)


@dataclass
class OptimConfig:
    """timm optimizer and scheduler factory arguments (``create_optimizer_v2``/``create_scheduler_v2``)."""

    opt: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.05
    momentum: float = 0.9
    sched: str = "cosine"
    warmup_epochs: int = 1
    warmup_lr: float = 1e-5
    min_lr: float = 1e-5
    clip_grad: float | None = None
    clip_mode: str = "norm"


@dataclass
class TrainerConfig:
    """Loop, precision, regularisation, checkpointing and resume settings."""

    max_epochs: int = 12
    limit_train_batches: int | None = None
    limit_val_batches: int | None = None
    device: str = "auto"
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    accum_steps: int = 1
    seed: int = 42
    deterministic: bool = True
    label_smoothing: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    ema: bool = False
    ema_decay: float = 0.999
    eval_every: int = 1
    log_every: int = 10
    progress: bool = True
    monitor: str | None = None
    monitor_mode: str | None = None
    save_checkpoints: bool = True
    resume: str | None = None


@dataclass
class LoggerConfig:
    """W&B settings; ``name: none`` logs nothing (console only)."""

    name: str = "wandb"
    mode: str = "offline"
    project: str = "depthzoo"
    entity: str | None = None
    group: str | None = None
    run_name: str | None = None
    tags: list[str] = field(default_factory=list)
    save_dir: str | None = None
    log_checkpoints: bool = False
    init_timeout: float = 30.0


@dataclass
class PathsConfig:
    root_dir: str = "."
    data_dir: str = "data"
    log_dir: str = "outputs"
    output_dir: str = "outputs"


@dataclass
class TrainConfig:
    """The root schema of ``conf/train.yaml``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "train"
    tags: list[str] = field(default_factory=list)


def register_configs(config_dir: str | Path | None = None) -> None:
    """Store the root schema ``train_schema`` in Hydra's ConfigStore (group files are checked against it).

    Also registers every zoo model that has no ``<config_dir>/model/<name>.yaml`` as a ``model=<name>``
    option, so new registry entries are trainable without a config file. Idempotent.
    """
    from hydra.core.config_store import ConfigStore

    import zoo

    with_files = {p.stem for p in Path(config_dir, "model").glob("*.yaml")} if config_dir else set()

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name in zoo.list_models():
        if name not in with_files:
            store.store(group="model", name=name, node=ModelConfig(name=name))


def _choice(value: Any, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}.")


def task_of(data_name: str) -> str:
    """``"lm"`` for text data sets, ``"classification"`` for image data sets."""
    return "lm" if data_name in TEXT_DATASETS else "classification"


def validate(cfg: Any) -> None:
    """Check choices, ranges and model/data consistency of a composed config (raises ConfigError)."""
    import zoo

    _choice(cfg.data.name, IMAGE_DATASETS + TEXT_DATASETS, "data.name")
    _choice(cfg.trainer.precision, PRECISIONS, "trainer.precision")
    _choice(cfg.trainer.device, DEVICES, "trainer.device")
    _choice(cfg.logger.name, ("wandb", "none"), "logger.name")
    _choice(cfg.logger.mode, LOGGER_MODES, "logger.mode")
    if cfg.trainer.monitor_mode is not None:
        _choice(cfg.trainer.monitor_mode, MONITOR_MODES, "trainer.monitor_mode")
    for key, value in (("trainer.max_epochs", cfg.trainer.max_epochs), ("data.batch_size", cfg.data.batch_size),
                       ("trainer.accum_steps", cfg.trainer.accum_steps), ("trainer.log_every", cfg.trainer.log_every)):
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1.")
    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr={cfg.optim.lr} must be positive.")
    if not 0.0 < cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={cfg.data.val_fraction} must be between 0 and 1.")
    if cfg.trainer.mixup_alpha > 0 or cfg.trainer.cutmix_alpha > 0:
        if cfg.data.batch_size % 2:
            raise ConfigError("Mixup/CutMix needs an even data.batch_size (timm mixes a batch with its flip).")
    entry = zoo.get_entry(cfg.model.name)
    model_is_lm = len(entry.default_cfg.get("input_size", (3, 0, 0))) == 1
    data_is_lm = task_of(cfg.data.name) == "lm"
    if model_is_lm != data_is_lm:
        kind = "a language model" if model_is_lm else "an image classifier"
        fits = ", ".join(TEXT_DATASETS if model_is_lm else IMAGE_DATASETS)
        raise ConfigError(f"model={cfg.model.name} is {kind} but data={cfg.data.name} does not fit it; "
                          f"use one of data={fits}.")
