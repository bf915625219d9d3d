"""A whole training run from a composed config: what ``train.py`` calls (and pruning can reuse piecewise).

The run directory is claimed first (:mod:`zoo.jobs.runs`): ``trainer.resume=null`` needs a directory without another
run, ``trainer.resume=auto`` continues a run of the same config, an explicit state file must come from a run of the
same config, and ``trainer.force=true`` discards what the directory held. ``results.json`` is written last.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from ..latency.device import resolve_device
from ..training import distributed as dist_utils
from ..training import state as ckpt
from ..training.data import DataBundle, build_loaders
from ..training.engine import FitResult, fit
from ..training.resources import seed_everything, set_threads
from ..training.settings import DataConfig, LoggerConfig, OptimConfig, TrainerConfig
from .model_spec import build_model, data_model_cfg, to_container
from .train_config import canonical_model_name, typed, validate

_log = logging.getLogger(__name__)


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


def write_results(path: Path, cfg: Any, data: DataBundle, model: nn.Module, result: FitResult,
                  config: dict[str, Any], threads: dict[str, Any]) -> dict[str, Any]:
    """``results.json`` (sealed, with the config's fingerprint): model, data, final val metrics, best monitored
    value, epochs, time, checkpoints, params."""
    from ..files import write_sealed_json
    from .runs import fingerprint

    results = {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "task": data.task,
        "metrics": {k: v for k, v in result.metrics.items() if k.startswith("val/")},
        "monitor": result.monitor,
        "best": {"value": result.best_value, "epoch": result.best_epoch}, "converged": result.converged,
        "epochs": result.epochs,
        "steps": result.steps,
        "train_time_s": round(result.train_time_s, 3),
        "memory": result.memory,
        "checkpoint": str(result.best_checkpoint or result.last_checkpoint) if result.last_checkpoint else None,
        "last_checkpoint": str(result.last_checkpoint) if result.last_checkpoint else None,
        "params": sum(p.numel() for p in model.parameters()),
        "data_info": {k: v for k, v in data.info.items() if isinstance(v, (int, float, str))},
        "threads": threads,
        "fingerprint": fingerprint(config),
    }
    write_sealed_json(path, results)
    return results


def check_resume_config(resume_path: Path | None, config: dict[str, Any]) -> None:
    """An explicit state file to resume from must come from a run of the same config (its fingerprint)."""
    from ..errors import RunConflictError
    from .runs import describe_differences, determining, fingerprint, same_run_config

    if resume_path is None:
        return
    recorded = ckpt.load_state(resume_path).get("config") or {}
    if fingerprint(recorded) != fingerprint(config) and not same_run_config(recorded, config):
        raise RunConflictError(
            f"trainer.resume={resume_path} was written by a run of another config "
            f"({describe_differences(determining(recorded), determining(config))}). Resume only with that run's "
            f"config, or start a new run from its weights with model.pretrained={resume_path.parent}/best.safetensors.")


def adopt_earlier_run(output_dir: Path, config: dict[str, Any]) -> None:
    """A run directory written before run records existed (no ``run.json``) whose training state was saved with
    this config is recorded as this run's, so that ``trainer.resume`` can continue it; anything else is left alone
    (the claim then refuses it)."""
    from .runs import RUN_FILE, same_run_config, write_record

    state = ckpt.checkpoint_dir(output_dir) / f"last{ckpt.STATE_SUFFIX}"
    if (output_dir / RUN_FILE).exists() or not state.is_file():
        return
    try:
        recorded = ckpt.load_state(state).get("config") or {}
    except ckpt.CheckpointError:
        return
    if recorded and same_run_config(recorded, config):
        _log.info("%s was written before run records existed; its saved config matches: continuing it", output_dir)
        write_record(output_dir, "train", config)


def check_request(cfg: Any) -> None:
    """Everything about a composed train config that can be refused before any work (raises ZooError): the model's
    canonical name, then keys, choices, ranges and model/data consistency."""
    canonical_model_name(cfg)
    validate(cfg)


def run(cfg: Any) -> dict[str, Any]:
    """Validate, claim the run directory, build data/model/logger, train, write ``results.json`` (last)."""
    from ..training.logger import create_logger
    from .cli import hydra_context, new_dir_hint, run_files
    from .runs import claimed_by_main, with_inputs

    dist = dist_utils.setup()
    check_request(cfg)
    config = with_inputs(to_container(cfg))
    output_dir = Path(cfg.paths.output_dir)
    explicit = cfg.trainer.resume not in (None, "", "auto")
    resume_path = ckpt.resolve_resume(cfg.trainer.resume, output_dir) if explicit else None
    check_resume_target(resume_path, cfg.model.name)
    check_resume_config(resume_path, config)
    if dist.is_main and cfg.trainer.resume not in (None, ""):
        adopt_earlier_run(output_dir, config)
    with claimed_by_main(output_dir, "train", config, new_only=cfg.trainer.resume in (None, ""),
                         force=cfg.trainer.force, force_hint="trainer.force=true", dir_hint=new_dir_hint()), \
            run_files(output_dir, cfg, enabled=dist.is_main):
        if not explicit:
            resume_path = ckpt.resolve_resume(cfg.trainer.resume, output_dir)
        check_resume_target(resume_path, cfg.model.name)
        return train(cfg, config, output_dir, resume_path, create_logger, hydra_context().get("group"))


def train(cfg: Any, config: dict[str, Any], output_dir: Path, resume_path: Path | None, create_logger: Any,
          group: str | None) -> dict[str, Any]:
    """The training itself, in a claimed directory: W&B is finished before ``results.json`` is written."""
    from .cli import jobs_sharing_cores

    dist = dist_utils.info()
    threads = set_threads(cfg.trainer.get("threads"), *jobs_sharing_cores())
    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    device = resolve_device(cfg.trainer.device, dist.local_rank, warn_fallback=False)
    data = build_loaders(typed(cfg.data, DataConfig), seed=cfg.trainer.seed, model_cfg=data_model_cfg(cfg.model),
                         rank=dist.rank, world=dist.world, pin_memory=device.type == "cuda")
    model = build_model(cfg.model, data)
    logger = create_logger(typed(cfg.logger, LoggerConfig), config=config, is_main=dist.is_main, group=group)
    try:
        result = fit(model, data, typed(cfg.optim, OptimConfig), typed(cfg.trainer, TrainerConfig), logger,
                     output_dir=output_dir, config=config, resume_from=resume_path)
        logger.summary({"results/" + k: v for k, v in result.metrics.items() if k.startswith("val/")})
    except BaseException:
        logger.finish(exit_code=1)
        dist_utils.cleanup()
        raise
    logger.finish(exit_code=0)
    results = write_results(output_dir / "results.json", cfg, data, model, result, config, threads) if dist.is_main \
        else {"metrics": result.metrics, "monitor": result.monitor}
    dist_utils.barrier()
    dist_utils.cleanup()
    return results
