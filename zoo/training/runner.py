"""A whole training run from a composed config: what ``train.py`` calls (and pruning can reuse piecewise)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from torch import nn

from . import checkpointing as ckpt
from . import distributed as dist_utils
from .config import validate
from .data import BYTE_VOCAB, DataBundle, build_loaders
from .engine import FitResult, fit, resolve_device, seed_everything
from .errors import ConfigError

_log = logging.getLogger(__name__)


def to_container(cfg: Any) -> dict:
    """A plain, resolved dict of a DictConfig (or a dict as is)."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def hydra_context() -> dict[str, Any]:
    """The W&B group (the sweep directory in a multirun) and a job number, when running under Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
    except (ImportError, ValueError):
        return {}
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return {"group": str(hydra_cfg.sweep.dir), "job_num": hydra_cfg.job.num}
    return {}


def model_kwargs(model_cfg: Any, data: DataBundle) -> dict[str, Any]:
    """``create_model`` arguments: num_classes (classification) or vocab_size (LM) checked against the data.

    ``model.num_classes: null`` takes the data set's class count; a different explicit value is an error.
    For language models ``model.overrides.vocab_size`` defaults to the data's vocabulary (256 bytes).
    """
    overrides = dict(model_cfg.overrides or {})
    if data.task == "lm":
        vocab = overrides.setdefault("vocab_size", BYTE_VOCAB)
        if vocab < data.num_classes:
            raise ConfigError(f"model.overrides.vocab_size={vocab} is smaller than the data's vocabulary "
                              f"({data.num_classes} byte values); remove the override or set it to {data.num_classes}.")
        return {"overrides": overrides, "num_classes": None}
    classes = model_cfg.num_classes
    if classes is not None and classes != data.num_classes:
        raise ConfigError(f"model.num_classes={classes} but the data set has {data.num_classes} classes; set "
                          f"model.num_classes={data.num_classes} or leave it null to take the data's count.")
    return {"overrides": overrides, "num_classes": data.num_classes}


def build_model(model_cfg: Any, data: DataBundle) -> nn.Module:
    """The configured zoo model, sized for `data` (see :func:`model_kwargs`)."""
    import zoo

    kwargs = model_kwargs(model_cfg, data)
    pretrained = model_cfg.pretrained if model_cfg.pretrained not in (None, "") else False
    return zoo.create_model(model_cfg.name, pretrained=pretrained, num_classes=kwargs["num_classes"],
                            **kwargs["overrides"])


def check_resume_target(resume_path: Path | None, model_name: str) -> None:
    """Fail before any work if the state to resume from belongs to another model."""
    if resume_path is None:
        return
    recorded = ckpt.model_name_from_checkpoint(resume_path)
    if recorded != model_name:
        raise ckpt.CheckpointError(
            f"Cannot resume model={model_name} from {resume_path}: that checkpoint was written for model={recorded}. "
            f"Resume with model={recorded}, or start a new run (trainer.resume=null)."
        )


def write_results(path: Path, cfg: Any, data: DataBundle, model: nn.Module, result: FitResult) -> dict[str, Any]:
    """``results.json``: model, data, final val metrics, best monitored value, epochs, time, checkpoint, params."""
    results = {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "task": data.task,
        "metrics": {k: v for k, v in result.metrics.items() if k.startswith("val/")},
        "monitor": result.monitor,
        "best": {"value": result.best_value, "epoch": result.best_epoch},
        "epochs": result.epochs,
        "steps": result.steps,
        "train_time_s": round(result.train_time_s, 3),
        "checkpoint": str(result.best_checkpoint or result.last_checkpoint) if result.last_checkpoint else None,
        "last_checkpoint": str(result.last_checkpoint) if result.last_checkpoint else None,
        "params": sum(p.numel() for p in model.parameters()),
        "data_info": {k: v for k, v in data.info.items() if isinstance(v, (int, float, str))},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    return results


def run(cfg: Any) -> dict[str, Any]:
    """Validate, build data/model/logger, train, write ``results.json``; returns the results dict."""
    from .logger import create_logger

    dist = dist_utils.setup()
    validate(cfg)
    output_dir = Path(cfg.paths.output_dir)
    resume_path = ckpt.resolve_resume(cfg.trainer.resume, output_dir)
    check_resume_target(resume_path, cfg.model.name)
    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    device = resolve_device(cfg.trainer.device)
    import zoo

    data = build_loaders(cfg.data, seed=cfg.trainer.seed, model_cfg=zoo.get_entry(cfg.model.name).default_cfg,
                         rank=dist.rank, world=dist.world, pin_memory=device.type == "cuda")
    model = build_model(cfg.model, data)
    config = to_container(cfg)
    context = hydra_context()
    logger_cfg = cfg.logger
    logger = create_logger(logger_cfg, config=config, is_main=dist.is_main, group=context.get("group"))
    exit_code = 1
    try:
        result = fit(model, data, cfg.optim, cfg.trainer, logger, output_dir=output_dir, config=config,
                     resume_from=resume_path)
        results = write_results(output_dir / "results.json", cfg, data, model, result) if dist.is_main \
            else {"metrics": result.metrics, "monitor": result.monitor}
        logger.summary({"results/" + k: v for k, v in results["metrics"].items()})
        exit_code = 0
        return results
    finally:
        logger.finish(exit_code=exit_code)
        if exit_code == 0:
            dist_utils.barrier()
        dist_utils.cleanup()
