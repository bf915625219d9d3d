"""Config schemas of the Hydra entry points (dataclasses) and the checks no type system can do.

The schemas are registered in Hydra's ConfigStore by :func:`register_configs` (Hydra is imported only
there), so a misspelt key or a wrongly typed value fails at composition time, before any work starts.
:func:`validate` then checks choices and cross-group consistency (model vs data) with a clear message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError
from ..files import check_writable
from ..training.settings import DataConfig, LoggerConfig, OptimConfig, TrainerConfig
from ..training.tasks import IMAGE_DATASETS, TEXT_DATASETS, task_of

T = TypeVar("T")

PRECISIONS = ("fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
LOGGER_MODES = ("online", "offline", "disabled")
MONITOR_MODES = ("max", "min")


@dataclass
class ModelConfig:
    """`name`: a registered zoo model, or with ``source: timm`` (``model=timm``) any timm model by its timm name, its
    depth units discovered from its graph (``timm/<name>`` is the same); `tag`: a pretrained tag (timm's, e.g.
    ``ra_in1k``: its weights with ``pretrained: true`` and its eval config always); `num_classes: null` takes the data
    set's class count."""

    name: str = "mobilenetv2_050"
    source: str = "zoo"
    tag: str | None = None
    pretrained: Any = False
    num_classes: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


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


def typed(group: Any, schema: type[T]) -> T:
    """A composed config group (``cfg.data``, ``cfg.optim``, ``cfg.trainer``) as its typed value, the form in which
    the training library takes it: the config is read here, once."""
    from omegaconf import OmegaConf

    value = OmegaConf.to_object(group) if OmegaConf.is_config(group) else group
    return value if isinstance(value, schema) else schema(**value)


def register_configs(config_dir: str | Path | None = None) -> None:
    """Store the root schema ``train_schema`` in Hydra's ConfigStore (group files are checked against it).

    Every registered model (plugins included: :func:`zoo.models.registry.load_plugins`) becomes a ``model=<name>``
    option,
    so a model needs no config file; a ``<config_dir>/model/<name>.yaml``, where present, is used instead (for
    models that need non-default settings). Idempotent.
    """
    from hydra.core.config_store import ConfigStore

    import zoo
    from zoo.models.registry import load_plugins

    load_plugins()
    with_files = {p.stem for p in Path(config_dir, "model").glob("*.yaml")} if config_dir else set()

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name in zoo.list_models():
        if name not in with_files:
            store.store(group="model", name=name, node=ModelConfig(name=name))
    # model=timm: any timm model; its model.name (???: required) is timm's name of it
    store.store(group="model", name="timm", node=ModelConfig(name="???", source="timm"))
    # model=hf: any transformers causal LM; its model.name (???: required) a folder, a hub id or a packaged config
    store.store(group="model", name="hf", node=ModelConfig(name="???", source="hf"))


MODEL_SOURCES = ("zoo", "timm", "hf")


def canonical_model_name(cfg: Any) -> None:
    """``model=timm model.name=convnext_atto`` names the registry's ``timm/convnext_atto`` (``model=hf
    model.name=<folder>``: ``hf/<its absolute path>``): set once, at the run's start, so every later reader (checks,
    caches, fingerprints, checkpoints) sees one name."""
    from omegaconf import open_dict

    source = cfg.model.get("source", "zoo")
    _choice(source, MODEL_SOURCES, "model.source")
    if source == "timm" and not str(cfg.model.name).startswith("timm/"):
        with open_dict(cfg):
            cfg.model.name = f"timm/{cfg.model.name}"
    if source == "hf":  # a folder by its absolute path: the same model whatever directory the run starts in
        given = str(cfg.model.name).removeprefix("hf/")
        folder = Path(given).expanduser()
        with open_dict(cfg):
            cfg.model.name = f"hf/{folder.resolve() if folder.is_dir() else given}"


SCHEDULERS = ("cosine", "tanh", "step", "multistep", "plateau", "poly", "wsd", "none", "constant")


def check_optimizer(opt: str, sched: str) -> None:
    """``optim.opt`` must name a timm optimizer (an optional ``lookahead_`` style prefix allowed) and ``optim.sched``
    a timm scheduler, so a typo fails before any work."""
    import difflib

    from timm.optim import list_optimizers

    known = list_optimizers()
    name = str(opt).lower().split("_")[-1]
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(f"optim.opt={opt!r} is not a timm optimizer.{hint} "
                          f"Common choices: adamw, sgd, lamb, lion, adam (`timm.optim.list_optimizers()` lists all).")
    _choice(sched, SCHEDULERS, "optim.sched")


def check_data_sources(data_cfg: Any) -> None:
    """The files a data set reads exist (image folders, text files) before any work; raises ConfigError."""
    import glob

    if data_cfg.name == "imagefolder":
        if not data_cfg.root:
            raise ConfigError("data.root is not set: data=imagefolder needs data.root=<folder> holding train/ and "
                              "val/, each with one sub-folder of images per class.")
        missing = [str(Path(data_cfg.root) / split) for split in ("train", "val")
                   if not (Path(data_cfg.root) / split).is_dir()]
        if missing:
            raise ConfigError(f"data.root={data_cfg.root} lacks {' and '.join(missing)}: data=imagefolder needs "
                              "train/ and val/ folders, each with one sub-folder of images per class.")
    if data_cfg.name == "text":
        if not data_cfg.files:
            raise ConfigError("data.files is not set: data=text needs data.files='[notes.txt,docs/*.md]' "
                              "(paths or globs).")
        for pattern in data_cfg.files:
            if not glob.glob(str(Path(pattern).expanduser()), recursive=True):
                raise ConfigError(f"data.files entry {pattern!r} matches no file.")


def check_model(model_cfg: Any) -> None:
    """``model.overrides`` must be options of the model (built on the meta device: no memory, no weights) and a
    local ``model.pretrained`` file must exist, before any work."""
    import torch

    from ..models.registry import build_model
    from ..weights.pretrained import check_source
    from ..weights.tags import resolve_tag

    with torch.device("meta"):
        build_model(model_cfg.name, **dict(model_cfg.overrides or {}))
    if model_cfg.tag:
        resolve_tag(model_cfg.name, model_cfg.tag)
    check_source(model_cfg.pretrained)


def _cuda_device(device: str) -> bool:
    """Whether `device` (``trainer.device``) means a CUDA device that exists here."""
    import torch

    return device in ("cuda", "auto") and torch.cuda.is_available()


def _choice(value: Any, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}.")


def schema_keys(schema: type, prefix: str = "") -> tuple[set[str], set[str]]:
    """(dotted keys of a schema dataclass, the keys of its dict-typed fields, under which any key is allowed)."""
    from dataclasses import fields, is_dataclass

    keys, open_keys = set(), set()
    for f in fields(schema):
        key = prefix + f.name
        keys.add(key)
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            sub, sub_open = schema_keys(type(default), key + ".")
            keys |= sub
            open_keys |= sub_open
        elif isinstance(default, dict) or str(f.type).startswith("dict"):
            open_keys.add(key)
    return keys, open_keys


def check_keys(cfg: Any, schema: type) -> None:
    """Refuse keys the schema does not have (``+trainer.foo=1`` composes, then would be ignored) and mandatory
    values left unset (``???``, e.g. ``data.root`` of ``data=imagefolder``). Reads nodes without resolving them."""
    import difflib

    from omegaconf import OmegaConf

    keys, open_keys = schema_keys(schema)
    missing: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        for key in node:
            dotted = f"{prefix}{key}"
            child = node._get_node(key)
            if child._is_missing():
                missing.append(dotted)
            if dotted in open_keys:
                continue
            if dotted not in keys:
                close = difflib.get_close_matches(dotted, sorted(keys), n=1, cutoff=0.75)
                hint = f" Did you mean {close[0]}?" if close else ""
                raise ConfigError(f"{dotted} is not a config key.{hint} (`--cfg job` prints every key.)")
            if OmegaConf.is_dict(child) and not child._is_interpolation():
                walk(child, dotted + ".")

    walk(cfg, "")
    if missing:
        raise ConfigError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; add "
                          f"{' '.join(f'{k}=...' for k in missing)} to the command (data.root: a folder with train/ "
                          f"and val/ class folders for data=imagefolder, text files for data=text's data.files).")


# (dotted key, lowest, highest, bounds excluded?) for every numeric setting with a range; a key whose value is null
# is not checked. One table, so that every bound is stated once and reported the same way.
RANGES = (
    ("trainer.max_epochs", 1, None, False), ("trainer.patience", 1, None, False), ("trainer.threads", 1, None, False),
    ("trainer.accum_steps", 1, None, False),
    ("trainer.log_every", 1, None, False), ("trainer.eval_every", 0, None, False),
    ("trainer.limit_train_batches", 1, None, False), ("trainer.limit_val_batches", 1, None, False),
    ("trainer.label_smoothing", 0.0, 0.999, False), ("trainer.ema_decay", 0.0, 1.0, False),
    ("trainer.mixup_alpha", 0.0, None, False), ("trainer.cutmix_alpha", 0.0, None, False),
    ("data.batch_size", 1, None, False), ("data.eval_batch_size", 1, None, False), ("data.num_workers", 0, None, False),
    ("data.image_size", 1, None, False), ("data.shift", 0, None, False), ("data.seq_len", 1, None, False),
    ("data.num_samples", 1, None, False), ("data.num_classes", 1, None, False), ("data.train_samples", 1, None, False),
    ("data.val_samples", 1, None, False), ("data.val_fraction", 0.0, 1.0, True), ("data.hflip", 0.0, 1.0, False),
    ("optim.lr", 0.0, None, True), ("optim.weight_decay", 0.0, None, False), ("optim.momentum", 0.0, 1.0, False),
    ("optim.warmup_epochs", 0, None, False), ("optim.warmup_lr", 0.0, None, False), ("optim.min_lr", 0.0, None, False),
    ("optim.clip_grad", 0.0, None, True), ("model.num_classes", 1, None, False),
)


def check_ranges(cfg: Any, ranges: tuple = RANGES) -> None:
    """Every numeric setting within its stated range (raises ConfigError naming the key and the range)."""
    from omegaconf import OmegaConf

    for key, low, high, exclusive in ranges:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        low_op, high_op = (">", "<") if exclusive else (">=", "<=")
        allowed = f"{low_op} {low}" + (f" and {high_op} {high}" if high is not None else "")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value} is not a finite number: it must be {allowed}.")
        outside = (value <= low or (high is not None and value >= high)) if exclusive else \
            (value < low or (high is not None and value > high))
        if outside:
            raise ConfigError(f"{key}={value} is out of range: it must be {allowed}.")


METRICS = {"language_model": ("loss", "ppl", "tokens_per_s"), "classification": ("loss", "acc1", "acc5")}


def check_grad_checkpointing(value: Any) -> None:
    """``trainer.grad_checkpointing``: true, false, or the share of blocks to checkpoint in (0, 1]."""
    if isinstance(value, bool) or (isinstance(value, (int, float)) and 0 <= value <= 1):
        return
    raise ConfigError(f"trainer.grad_checkpointing={value!r} is not allowed; give true, false or the share of blocks "
                      f"to checkpoint in [0, 1], e.g. 0.5 (the first half: the highest-resolution blocks).")


def validate(cfg: Any, schema: type | None = None) -> None:
    """Check keys, choices, ranges and model/data consistency of a composed config (raises ConfigError)."""
    import zoo

    if schema is not None or hasattr(cfg, "_get_node"):
        check_keys(cfg, schema or TrainConfig)
    _choice(cfg.data.name, IMAGE_DATASETS + TEXT_DATASETS, "data.name")
    check_data_sources(cfg.data)
    _choice(cfg.trainer.precision, PRECISIONS, "trainer.precision")
    _choice(cfg.trainer.device, DEVICES, "trainer.device")
    _choice(cfg.logger.name, ("wandb", "none"), "logger.name")
    _choice(cfg.logger.mode, LOGGER_MODES, "logger.mode")
    _choice(cfg.optim.clip_mode, ("norm", "value", "agc"), "optim.clip_mode")
    if cfg.trainer.monitor_mode is not None:
        _choice(cfg.trainer.monitor_mode, MONITOR_MODES, "trainer.monitor_mode")
    check_ranges(cfg)
    check_grad_checkpointing(cfg.trainer.get("grad_checkpointing", False))
    check_optimizer(cfg.optim.opt, cfg.optim.sched)
    if cfg.trainer.device == "cuda" and not _cuda_device("cuda"):  # (auto falls back to the CPU)
        raise ConfigError("trainer.device=cuda but no CUDA device is available here; use trainer.device=cpu or auto.")
    if cfg.trainer.precision == "fp16" and not _cuda_device(cfg.trainer.device):
        raise ConfigError("trainer.precision=fp16 needs a CUDA device; on the CPU use trainer.precision=bf16 or fp32.")
    if cfg.trainer.mixup_alpha > 0 or cfg.trainer.cutmix_alpha > 0:
        if cfg.data.batch_size % 2:
            raise ConfigError("Mixup/CutMix needs an even data.batch_size (timm mixes a batch with its flip).")
    entry = zoo.get_entry(cfg.model.name)
    check_model(cfg.model)
    if entry.task != task_of(cfg.data.name):
        language_model = entry.task == "language_model"
        kind = "a language model" if language_model else "an image classifier"
        fits = ", ".join(TEXT_DATASETS if language_model else IMAGE_DATASETS)
        raise ConfigError(f"model={cfg.model.name} is {kind} but data={cfg.data.name} does not fit it; "
                          f"use one of data={fits}.")
    if cfg.trainer.monitor is not None:
        names = [f"{prefix}/{m}" for prefix in ("val", "val_ema") for m in METRICS[task_of(cfg.data.name)]]
        _choice(cfg.trainer.monitor, tuple(names), "trainer.monitor")
    check_writable(cfg.paths.log_dir, "paths.log_dir")
