"""The training library's typed inputs: the data set and its loaders, the optimizer and scheduler, the loop, the
logger.

They are also the schemas of the ``data``, ``optim``, ``trainer`` and ``logger`` config groups
(:mod:`zoo.jobs.train_config`), so a key checked at composition is a field here; the jobs turn a composed group
into one of these (:func:`zoo.jobs.train_config.typed`) and nothing below them reads a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    tokenizer: str = "bytes"


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
    patience: int | None = None  # stop once the monitor has not improved for this many epochs (converged)
    limit_train_batches: int | None = None
    limit_val_batches: int | None = None
    device: str = "auto"
    threads: int | None = None  # torch threads of training and calibration; null: the cores / the jobs sharing them
    precision: str = "fp32"
    channels_last: bool = False
    grad_checkpointing: Any = False  # true | false | the share of blocks to checkpoint, in (0, 1]
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
    force: bool = False


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
