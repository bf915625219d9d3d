"""The prune job's baseline: given weights as they are, or trained once per config and cached; its metrics cached."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from torch import nn

from ..errors import ZooError
from ..pruning.importance import weights_digest
from ..training.engine import Callback
from ..training.resources import WaitedLock, share_cores
from ..training.settings import OptimConfig, TrainerConfig
from .train_config import typed

_log = logging.getLogger(__name__)


def baseline_config(config: dict) -> dict:
    """The part of a prune config that determines its baseline training: model, data, optim, trainer, and the
    contents of the files they name."""
    from .runs import with_inputs

    return with_inputs({k: config[k] for k in ("model", "data", "optim", "trainer")})


def baseline_dir(cfg: Any, config: dict) -> Path:
    """Where the baseline of this (model, data, optim, trainer) is trained once and shared by all jobs."""
    from .runs import fingerprint

    digest = fingerprint(baseline_config(config))[:12]
    name = str(cfg.model.name)
    label = f"hf/{Path(name.removeprefix('hf/')).name}" if name.startswith("hf/") else name  # (hf/<folder path>)
    return Path(cfg.paths.log_dir) / "baselines" / f"{label}-{cfg.data.name}-{digest}"


def finished_baseline(directory: Path, config: dict) -> Path | None:
    """The cached baseline's ``best`` checkpoint if its training completed and every file is intact, else None.

    A damaged, foreign or half-written entry is reported once and discarded (it will be trained again).
    """
    from ..errors import CorruptFileError
    from ..files import file_digest, read_sealed_json
    from .runs import OUTPUTS, clear_outputs, fingerprint

    marker = directory / "trained.json"
    if not marker.exists():
        return None
    try:
        done = read_sealed_json(marker)
        best = directory / done["checkpoint"]
        if done.get("fingerprint") != fingerprint(config):
            raise CorruptFileError(f"{marker} records another config")
        if not best.is_file() or file_digest(best) != done.get("checkpoint_sha256"):
            raise CorruptFileError(f"{best} is missing or does not match its recorded checksum")
        return best
    except (CorruptFileError, KeyError, TypeError) as exc:
        _log.warning("The cached baseline in %s is not usable (%s): it is trained again.", directory, exc)
        clear_outputs(directory, OUTPUTS["baseline"])
        return None


class LendCores(Callback):
    """While the baseline trains, the jobs waiting for it (`lock`'s waiters) lend this job their cores; checked at
    most once a second, given back at the end."""

    def __init__(self, lock: WaitedLock):
        self.lock, self.next_check = lock, 0.0

    def on_train_start(self, trainer: Any) -> None:
        self.on_step_end(trainer)

    def on_step_end(self, trainer: Any) -> None:
        if time.monotonic() >= self.next_check:
            share_cores(self.lock.waiters())
            self.next_check = time.monotonic() + 1.0


def train_baseline(cfg: Any, data: Any, config: dict, directory: Path, lock: WaitedLock | None = None) -> Path:
    """Train (or resume the interrupted training of) the baseline in `directory`; mark it complete. Returns best.
    With `lock`, the jobs waiting on it lend their cores (:class:`LendCores`)."""
    from ..errors import RunConflictError
    from ..files import file_digest, write_sealed_json
    from ..training import fit, seed_everything
    from ..training import state as ckpt
    from .model_spec import build_model
    from .runs import OUTPUTS, check_reuse, clear_outputs, fingerprint, write_record

    own = baseline_config(config)
    try:
        state = check_reuse(directory, "baseline", own)
    except RunConflictError as exc:
        _log.warning("The cached baseline in %s is not usable (%s): it is trained again.", directory, exc)
        clear_outputs(directory, OUTPUTS["baseline"])
        state = "fresh"
    write_record(directory, "baseline", own)
    resume = ckpt.resolve_resume("auto", directory) if state == "resume" else None
    if resume is not None:
        try:
            epoch = ckpt.load_state(resume)["epoch"]
            _log.info("resuming the interrupted baseline training in %s from epoch %d", directory, epoch)
        except ckpt.CheckpointError as exc:
            _log.warning("The interrupted baseline in %s cannot be resumed (%s): it is trained again.", directory, exc)
            clear_outputs(directory, OUTPUTS["baseline"])
            write_record(directory, "baseline", own)
            resume = None
    else:
        _log.info("training the baseline in %s (shared by every job with the same config)", directory)
    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    model = build_model(cfg.model, data)
    hint = " Run the same command again: the baseline's training resumes where it stopped."
    trainer = replace(typed(cfg.trainer, TrainerConfig), save_checkpoints=True)  # the cache is its checkpoints
    try:
        result = fit(model, data, typed(cfg.optim, OptimConfig), trainer, None, output_dir=directory, config=config,
                     resume_from=resume, resume_hint=hint, callbacks=[LendCores(lock)] if lock else [])
    finally:
        share_cores(0)
    best = result.best_checkpoint or result.last_checkpoint
    write_sealed_json(directory / "trained.json", {
        "fingerprint": fingerprint(own), "checkpoint": str(best.relative_to(directory)),
        "checkpoint_sha256": file_digest(best), "epochs": result.epochs, "best_epoch": result.best_epoch,
        "converged": result.converged, "metrics": result.metrics})
    return best


def load_or_train_baseline(cfg: Any, data: Any, config: dict) -> tuple[nn.Module, str]:
    """The baseline model and where its weights came from.

    Given weights are the baseline as they are (never trained): ``checkpoint=...`` (a depthzoo checkpoint, a
    timm-format file, a hub id or true), or ``model.pretrained=...`` whose classifier fits the data. Otherwise the
    baseline is trained once (from ``model.pretrained`` when its classifier had to be re-initialised) and cached.
    """
    from .. import load
    from ..training import distributed as dist_utils
    from .model_spec import build_model, weights_arg

    if cfg.checkpoint:
        model = build_model(cfg.model, data, pretrained=weights_arg(cfg.checkpoint))
        if getattr(model, "pretrained_head_reset", False):
            raise ZooError(f"checkpoint={cfg.checkpoint} has a classifier for another number of classes than the "
                           f"data's {data.num_classes}, so it cannot be the baseline as it is. Fine-tune a baseline "
                           f"from it with model.pretrained={cfg.checkpoint} (and checkpoint=null), or use data with "
                           f"the checkpoint's classes.")
        return model, model.pretrained_source
    if weights_arg(cfg.model.pretrained) is not False:
        model = build_model(cfg.model, data)
        if not getattr(model, "pretrained_head_reset", False):
            _log.info("baseline: the pretrained weights %s as they are (not trained)", model.pretrained_source)
            return model, model.pretrained_source
        _log.info("baseline: the classifier of %s was re-initialised for %d classes, so the baseline is fine-tuned "
                  "from those weights (once, cached)", model.pretrained_source, data.num_classes)
    directory = baseline_dir(cfg, config)
    if dist_utils.info().enabled:
        return load(distributed_baseline(cfg, directory, config)), str(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with WaitedLock(directory / ".lock") as lock:  # the jobs of a study that share it wait here, and lend their cores
        own = baseline_config(config)
        best = finished_baseline(directory, own) or train_baseline(cfg, data, config, directory, lock)
    return load(best), str(best)


def distributed_baseline(cfg: Any, directory: Path, config: dict) -> Path:
    """Under torchrun the baseline is given (``checkpoint=``, ``model.pretrained=``) or already cached: a baseline
    trained inside a prune job would hold the launch's ranks on one file lock. Rank 0 looks, every rank follows."""
    from ..training import distributed as dist_utils

    best = None
    if dist_utils.info().is_main and directory.is_dir():
        with FileLock(str(directory / ".lock")):
            best = finished_baseline(directory, baseline_config(config))
    best = dist_utils.broadcast_object(None if best is None else str(best))
    if best is None:
        raise ZooError("Under torchrun, prune.py starts from given weights: pass checkpoint=<weights> (a depthzoo "
                       "checkpoint, a timm file, a hub id or true) or model.pretrained=<weights whose classifier fits "
                       "the data>, or run the same command once without torchrun to train and cache the baseline "
                       f"(it would be cached in {directory}).")
    return Path(best)


def split_digest(dataset: Any) -> str | None:
    """What a validation split holds, cheaply: its image files' paths, sizes and modification times (image folders),
    or a hash of its tensors (token windows, in-memory images). None when the dataset is of another kind."""
    import hashlib

    digest = hashlib.sha256()
    if hasattr(dataset, "samples"):  # torchvision ImageFolder: files are identified, not read
        for path, label in dataset.samples:
            stat = Path(path).stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{label}".encode())
        return digest.hexdigest()[:20]
    tensors = [getattr(dataset, name) for name in ("tokens", "inputs", "targets") if hasattr(dataset, name)]
    if not tensors or not all(torch.is_tensor(t) for t in tensors):
        return None
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:20]


def evaluate_baseline(cfg: Any, config: dict, baseline: nn.Module, data: Any) -> tuple[dict[str, float], bool]:
    """The baseline's validation metrics, cached by (weights digest, data config, tag): published weights are
    evaluated once per data set. Returns (metrics, whether they came from the cache)."""
    from ..errors import CorruptFileError
    from ..files import json_digest, read_sealed_json, write_sealed_json
    from ..training import distributed as dist_utils
    from ..training import evaluate

    dist = dist_utils.info()
    key = {"weights": weights_digest(baseline), "data": config["data"], "tag": getattr(baseline, "zoo_tag", None),
           "data_files": {k: v for k, v in config.get("inputs", {}).items() if k.startswith("data.")},
           "val_split": split_digest(data.val.dataset), "limit_val_batches": cfg.trainer.limit_val_batches}
    name = json_digest(key, 20)  # a cache key, like the importance cache's (a run fingerprint drops some keys)
    path = Path(cfg.prune.cache_dir or Path(cfg.paths.log_dir) / "cache") / "baseline_eval" / f"{name}.json"
    cached = None
    if dist.is_main:
        try:
            stored = read_sealed_json(path)
            if stored.get("key") == json.loads(json.dumps(key, default=str)):
                _log.info("baseline metrics from the cache (%s)", path)
                cached = stored["metrics"]
            else:
                _log.warning("%s was written for another baseline or data: evaluating again", path)
        except CorruptFileError as exc:
            if path.exists():
                _log.warning("The cached baseline metrics %s are not usable (%s): evaluating again", path, exc)
    cached = dist_utils.broadcast_object(cached)
    if cached is not None:
        return cached, True
    metrics = evaluate(baseline, data.val, task=data.task)  # summed over ranks under torchrun
    if dist.is_main:
        write_sealed_json(path, {"key": key, "metrics": metrics})
    return metrics, False


CHANCE_MARGIN = 5.0  # top-1 points above chance (100 / classes) under which a baseline has not learned


def baseline_health(metrics: dict[str, float], task: str, num_classes: int) -> dict[str, Any]:
    """Whether the baseline learned: a classifier's top-1 more than CHANCE_MARGIN points above chance. A baseline at
    chance makes any pruning result meaningless (every plan keeps chance)."""
    key = next((k for k in ("val/acc1", "acc1") if k in metrics), None)  # evaluate's keys, or results.json's
    if task != "classification" or key is None or num_classes < 2:
        return {"trained": True, "why": "not a classifier: no chance level to compare with"}
    chance = 100.0 / num_classes
    top1 = float(metrics[key])
    trained = top1 > chance + CHANCE_MARGIN
    why = (f"top-1 {top1:.2f} % is {top1 - chance:+.2f} points from chance ({chance:.2f} % for {num_classes} classes)"
           + ("" if trained else f": within {CHANCE_MARGIN:g} points, the baseline did not learn"))
    return {"trained": trained, "top1": round(top1, 4), "chance": round(chance, 4), "why": why}
