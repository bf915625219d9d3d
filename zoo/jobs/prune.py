"""A whole depth-pruning run from a composed config: what ``prune.py`` calls.

baseline (checkpoint, or trained once and cached) -> latency table on the device -> importance of every
segment variant (cached) -> exact DP search within the latency budget -> plan -> linearised network with
fading activations -> fine-tune (optional distillation from the baseline) -> merge -> measure baseline and
pruned side by side -> ``results.json``, pruned checkpoint, W&B.

Hydra and W&B are imported only inside the functions that use them.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from torch import nn

from .. import surgery
from ..checkpoint import save_checkpoint
from ..errors import ZooError
from ..files import write_json
from ..importance import (
    SCORES,
    angular_distance,
    batches_digest,
    cached_scores,
    calibration_loss,
    score_variants,
    unit_io,
    weights_digest,
)
from ..search import MODEL_SEARCHES, SEARCHES, BudgetError, Choice, search
from ..training.config import TrainConfig
from ..training.engine import Callback
from .prune_results import assemble_results, format_summary, log_to_wandb

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------- config


@dataclass
class PruneSettings:
    """``prune.*``: the budget, the device the latency is measured on, importance and search."""

    target_speedup: float | None = 1.5
    target_latency_ms: float | None = None
    device: str = "auto"
    batch_size: int = 32
    dtype: str = "float32"
    channels_last: bool = False
    threads: int | None = None
    merge: bool = True
    importance: str = "loss"
    calib_batches: int = 4
    search: str = "dp"
    bins: int = 1000
    seed: int = 0
    calibrate_plans: int = 0
    cache_dir: str | None = None
    workload: str = "forward"
    plan: str | None = None
    force: bool = False
    export: str | None = None
    export_rtol: float = 1e-4
    runtime: str = "eager"
    runtime_report: list[str] = field(default_factory=list)
    max_memory_mb: float | None = None
    lut: dict[str, Any] = field(default_factory=dict)
    measure: dict[str, Any] = field(default_factory=dict)


@dataclass
class FinetuneSettings:
    """``finetune.*``: epochs after surgery, learning rate, distillation, progressive linearisation."""

    epochs: int = 4
    lr: float | None = None
    distill_weight: float = 0.3
    distill_temperature: float = 2.0
    linearise_fraction: float = 0.5


@dataclass
class PruneConfig(TrainConfig):
    """The root schema of ``conf/prune.yaml``: the training schema plus ``checkpoint``, ``prune`` and ``finetune``."""

    checkpoint: str | None = None
    prune: PruneSettings = field(default_factory=PruneSettings)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)


def register_configs(config_dir: str | Path | None = None) -> None:
    """Store ``prune_schema`` (:class:`PruneConfig`) and the training schemas in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from ..training.config import register_configs as register_train

    register_train(config_dir)
    ConfigStore.instance().store(name="prune_schema", node=PruneConfig)


def _is_recurrent(entry: Any) -> bool:
    """Whether a registered model has a recurrent state (its class says so; built on the meta device)."""
    with torch.device("meta"):
        return bool(getattr(entry.builder(), "recurrent", False))


PRUNE_RANGES = (  # (key, lowest, highest, lowest excluded?): see zoo.training.config.RANGES
    ("prune.target_speedup", 1.0, None, True), ("prune.target_latency_ms", 0.0, None, True),
    ("prune.max_memory_mb", 0.0, None, True), ("prune.batch_size", 1, None, False),
    ("prune.calib_batches", 1, None, False), ("prune.bins", 10, None, False), ("prune.threads", 1, None, False),
    ("prune.calibrate_plans", 0, None, False), ("prune.export_rtol", 0.0, None, False),
    ("finetune.epochs", 0, None, False), ("finetune.lr", 0.0, None, True),
    ("finetune.distill_weight", 0.0, 1.0, False), ("finetune.distill_temperature", 0.0, None, True),
    ("finetune.linearise_fraction", 0.0, 1.0, False),
)


def export_pruned(cfg: Any, pruned: nn.Module, data: Any, output_dir: Path) -> dict[str, Any]:
    """``prune.export``: the pruned model as ``pruned.onnx`` or ``pruned.pt2`` at batch 1 and the data's input size
    (for ``prune.workload=decode``, a RetNet's decode step), checked against PyTorch (zoo.export) within
    ``prune.export_rtol``. An export that fails or misses the tolerance is recorded (``passed: false`` and the
    error) and reported, after the run's own results are safe."""
    from ..errors import ExportError
    from ..exporting import export

    suffix = {"onnx": "onnx", "torch_export": "pt2"}[cfg.prune.export]
    path = output_dir / f"pruned.{suffix}"
    form = "recurrent" if cfg.prune.workload == "decode" else "parallel"
    try:
        report = export(copy.deepcopy(pruned).cpu().float(), path, format=cfg.prune.export,
                        input_size=data.input_size, form=form, rtol=cfg.prune.export_rtol).as_dict()
    except ExportError as error:
        _log.error("prune.export=%s failed: %s", cfg.prune.export, error)
        return {"path": str(path), "format": cfg.prune.export, "form": form, "passed": False, "error": str(error)}
    _log.info("exported %s (%s; max difference %.1e relative)", report["path"], report["checked_with"],
              report["max_rel_diff"])
    return report


def validate_prune(cfg: Any) -> None:
    """Checks before any long work: budget, choices, ranges, device, the files it names (raises ZooError)."""
    from ..latency.device import resolve_device, resolve_dtype
    from ..registry import get_entry
    from ..training.config import check_ranges, check_writable

    p = cfg.prune
    if p.target_latency_ms is None and p.target_speedup is None:
        raise ZooError("Give a budget: prune.target_speedup (e.g. 1.5) or prune.target_latency_ms.")
    check_ranges(cfg, PRUNE_RANGES)
    if p.importance not in SCORES:
        raise ZooError(f"prune.importance={p.importance!r}; allowed: {', '.join(SCORES)}.")
    if p.search not in SEARCHES:
        raise ZooError(f"prune.search={p.search!r}; allowed: {', '.join(SEARCHES)}.")
    if p.workload not in ("forward", "decode"):
        raise ZooError(f"prune.workload={p.workload!r}; allowed: forward (the whole forward pass) or decode "
                       "(one recurrent decode step of a language model such as RetNet).")
    if p.workload == "decode" and not _is_recurrent(get_entry(cfg.model.name)):
        raise ZooError(f"prune.workload=decode needs a recurrent language model; model={cfg.model.name} has no "
                       "recurrent state. Use prune.workload=forward.")
    if p.export is not None:
        from ..exporting import FORMATS, _require

        if p.export not in FORMATS:
            raise ZooError(f"prune.export={p.export!r}; allowed: null, {', '.join(FORMATS)}.")
        if p.export == "onnx":
            _require("onnx", "onnxscript", "onnxruntime")
    if p.plan:
        read_plan_file(p.plan)
    if cfg.checkpoint:
        check_baseline_source(cfg)
    if p.cache_dir:
        check_writable(p.cache_dir, "prune.cache_dir")
    lut_settings(p)
    measure_settings(p)
    check_runtimes(p, resolve_device(p.device), resolve_dtype(p.dtype, resolve_device(p.device)))


def check_runtimes(p: Any, device: torch.device, dtype: torch.dtype) -> None:
    """``prune.runtime`` and every ``prune.runtime_report`` runtime known and usable here (else ZooError with the
    install command), before any work; ``prune.lut.runtime`` is not a second way to say it."""
    from ..latency.runtime import check_runtime

    if "runtime" in (p.lut or {}):
        raise ZooError("Set the runtime with prune.runtime (it applies to the table and to every measurement), not "
                       "prune.lut.runtime.")
    for key, runtime in [("prune.runtime", p.runtime), *(("prune.runtime_report", r) for r in p.runtime_report)]:
        try:
            check_runtime(runtime, device, dtype)
        except ZooError as exc:
            raise ZooError(f"{key}={runtime}: {exc}") from None


def check_baseline_source(cfg: Any) -> None:
    """``checkpoint=`` names weights: a depthzoo checkpoint of this model, a timm-format file, a hub id or true (the
    tag's weights). Checked before any work; a hub id is resolved when the baseline is built."""
    from ..checkpoint import read_checkpoint_meta
    from ..pretrained import WEIGHT_SUFFIXES, check_source, is_local
    from ..tags import resolve_tag
    from ..training import state as ckpt
    from .train import weights_arg

    source = weights_arg(cfg.checkpoint)
    if source is True:
        resolve_tag(cfg.model.name, cfg.model.tag)  # an architecture without published weights fails here
    if source is True or source is False:
        return
    if str(source).endswith(ckpt.STATE_SUFFIX):
        raise ZooError(f"checkpoint={source} is a training state, not weights. Give the run's weights file (e.g. "
                       f"checkpoints/best.safetensors), a timm-format file, a hub id, true (the model's pretrained "
                       f"tag) or leave checkpoint=null to train the baseline.")
    check_source(source)
    if is_local(source) and not str(source).endswith(WEIGHT_SUFFIXES) and not Path(source).is_dir():
        raise ZooError(f"checkpoint={source} is not a weight file; allowed are {', '.join(WEIGHT_SUFFIXES)} files, "
                       f"a model folder (config.json + safetensors), a hub id such as timm/mobilenetv2_100.ra_in1k, "
                       f"or true (the model's pretrained tag).")
    if is_local(source) and Path(source).suffix == ".safetensors":
        try:
            meta = read_checkpoint_meta(source)
        except Exception as exc:  # noqa: BLE001 - any decode failure means the same
            raise ZooError(f"checkpoint={source} cannot be read as safetensors ({exc}).") from None
        name = (meta or {}).get("model")
        if name is not None and name != cfg.model.name:
            raise ZooError(f"checkpoint={source} holds model {name!r}, but model={cfg.model.name}. Use "
                           f"model={name} or a checkpoint of {cfg.model.name}.")


def _settings(kind: type, values: Any, key: str) -> Any:
    """A settings dataclass from a ``prune.lut``/``prune.measure`` mapping; an unknown key is a clear error."""
    from dataclasses import fields

    allowed = [f.name for f in fields(kind)]
    unknown = sorted(set(values or {}) - set(allowed))
    if unknown:
        raise ZooError(f"{key} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}.")
    return kind(**dict(values or {}))


def lut_settings(p: Any) -> Any:
    """The latency table's settings from ``prune.lut`` (defaults where unset)."""
    from ..latency import TableSettings

    return _settings(TableSettings, p.lut, "prune.lut")


def measure_settings(p: Any) -> Any:
    """The final side-by-side timing's settings from ``prune.measure``."""
    from ..latency import CalibrationSettings

    return _settings(CalibrationSettings, p.measure, "prune.measure")


# ----------------------------------------------------------------------------------------------- phases


@contextmanager
def phase(timings: dict[str, float], name: str) -> Iterator[None]:
    """Time a phase of the run into `timings` (seconds) and log it."""
    start = time.perf_counter()
    _log.info("%s ...", name)
    yield
    timings[name] = round(time.perf_counter() - start, 3)
    _log.info("%s done in %.1f s", name, timings[name])


def baseline_config(config: dict) -> dict:
    """The part of a prune config that determines its baseline training: model, data, optim, trainer, and the
    contents of the files they name."""
    from .runs import with_inputs

    return with_inputs({k: config[k] for k in ("model", "data", "optim", "trainer")})


def baseline_dir(cfg: Any, config: dict) -> Path:
    """Where the baseline of this (model, data, optim, trainer) is trained once and shared by all jobs."""
    from .runs import fingerprint

    digest = fingerprint(baseline_config(config))[:12]
    return Path(cfg.paths.log_dir) / "baselines" / f"{cfg.model.name}-{cfg.data.name}-{digest}"


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


def train_baseline(cfg: Any, data: Any, config: dict, directory: Path) -> Path:
    """Train (or resume the interrupted training of) the baseline in `directory`; mark it complete. Returns best."""
    from omegaconf import OmegaConf

    from ..errors import RunConflictError
    from ..files import file_digest, write_sealed_json
    from ..training import fit, seed_everything
    from ..training import state as ckpt
    from .runs import OUTPUTS, check_reuse, clear_outputs, fingerprint, write_record
    from .train import build_model

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
    trainer_cfg = OmegaConf.merge(cfg.trainer, {"save_checkpoints": True})  # the cache is its checkpoints
    result = fit(model, data, cfg.optim, trainer_cfg, None, output_dir=directory, config=config, resume_from=resume,
                 resume_hint=hint)
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
    from .train import build_model, weights_arg

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
    with FileLock(str(directory / ".lock")):
        own = baseline_config(config)
        best = finished_baseline(directory, own) or train_baseline(cfg, data, config, directory)
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


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """A plan from a JSON file, checked for its form (not yet against a model); raises PlanError."""
    from ..errors import PlanError
    from ..surgery import _validate_plan

    example = '{"remove": ["blocks.2.1"], "merge": true}'
    try:
        plan = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"Cannot read plan file {path} ({exc.strerror}). A plan file is JSON such as "
                        f"{example}.") from None
    except ValueError as exc:
        raise PlanError(f"Plan file {path} is not JSON ({exc}). A plan file is JSON such as {example}.") from None
    _validate_plan(plan)
    return plan


def read_plan(path: str | Path, baseline: nn.Module) -> dict[str, Any]:
    """A plan from a JSON file, checked against the model before any long work (raises PlanError)."""
    plan = read_plan_file(path)
    surgery.apply_plan(baseline, plan, inplace=False)
    return {"remove": list(plan.get("remove", [])), "merge": bool(plan.get("merge", True))}


def calibration_batches(data: Any, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first `count` batches of the (epoch-0 ordered) training split: the importance calibration set."""
    batches = []
    for inputs, targets in data.train:
        batches.append((inputs, targets))
        if len(batches) == count:
            break
    return batches


def variant_memory(table: Any, index: int, variant: frozenset[str]) -> int:
    """Peak activation memory (bytes) of one segment variant as the table measured it (0 when removed)."""
    key = table.keys[index][variant]
    return 0 if key is None else int(table.records[key].get("peak_mem_bytes") or 0)


def build_options(table: Any, damages: list[dict[frozenset[str], float]], max_memory_mb: float | None = None
                  ) -> list[list[Choice]]:
    """Search options: per segment, every variant with its predicted latency and its damage.

    A memory budget is exact here: a network's peak activation memory is the largest of its parts', so it is
    met by dropping every variant (and refusing a fixed part) whose own peak exceeds it.
    """
    limit = None if max_memory_mb is None else max_memory_mb * 2**20
    if limit is not None and int(table.records[table.fixed_key].get("peak_mem_bytes") or 0) > limit:
        fixed_mb = table.records[table.fixed_key]["peak_mem_bytes"] / 2**20
        raise BudgetError(f"prune.max_memory_mb={max_memory_mb} cannot be met: the parts that are never removed "
                          f"(stem, head) alone peak at {fixed_mb:.1f} MB at this batch size.")
    options = []
    for i, (costs, seg_damage) in enumerate(zip(table.segment_costs(), damages)):
        seg = [Choice(variant, latency, max(0.0, seg_damage[variant])) for variant, latency in costs
               if limit is None or variant_memory(table, i, variant) <= limit]
        if not seg:
            least = min(variant_memory(table, i, v) for v, _ in costs) / 2**20
            raise BudgetError(f"prune.max_memory_mb={max_memory_mb} cannot be met: segment {table.segments[i].name} "
                              f"needs at least {least:.1f} MB in every variant it has.")
        options.append(seg)
    return options


def budget_for(cfg: Any, table: Any) -> tuple[float, float]:
    """(target end-to-end latency, budget left for the prunable segments) in ms."""
    baseline = table.predict({"remove": []})
    target = cfg.prune.target_latency_ms or baseline / cfg.prune.target_speedup
    return target, target - table.fixed_cost()


def model_search_inputs(cfg: Any, baseline: nn.Module, table: Any, data: Any, options: list[list[Choice]]
                        ) -> dict[str, Any]:
    """What ``prune.search=sleb|angular`` score with: each segment's whole-removal variant, and the calibration loss
    of the baseline without a set of units (sleb) or the angular distance between a run's input and output
    (angular), on the importance calibration batches."""
    whole = [next((i for i, c in enumerate(seg) if c.removed == frozenset({segment.name})), None)
             for seg, segment in zip(options, table.segments)]
    batches = calibration_batches(data, cfg.prune.calib_batches)
    if cfg.prune.search == "sleb":
        def loss_of(removed: frozenset[str]) -> float:
            return calibration_loss(surgery.apply_plan(baseline, {"remove": sorted(removed), "merge": cfg.prune.merge},
                                                       inplace=False), batches)

        return {"whole": whole, "loss_of": loss_of}
    seen = unit_io(baseline, [segment.name for segment in table.segments], batches)

    def distance_of(first: int, last: int) -> float:
        inputs = [a for a, _ in seen[table.segments[first].name]]
        outputs = [b for _, b in seen[table.segments[last].name]]
        if any(a.shape != b.shape for a, b in zip(inputs, outputs)):
            return math.inf  # a run that changes the shape cannot be bypassed
        return angular_distance(inputs, outputs)

    return {"whole": whole, "distance_of": distance_of}


def choose_plan(cfg: Any, table: Any, options: list[list[Choice]], model_inputs: dict[str, Any] | None = None
                ) -> tuple[dict[str, Any], Any]:
    """Run the configured search; an unreachable budget names the best achievable speed-up."""
    target, budget = budget_for(cfg, table)
    try:
        kwargs = {"dp": {"bins": cfg.prune.bins}, "random": {"seed": cfg.prune.seed}}.get(cfg.prune.search,
                                                                                          model_inputs or {})
        result = search(cfg.prune.search, options, budget, **kwargs)
    except BudgetError:
        if cfg.prune.search in MODEL_SEARCHES:  # whole segments only: its own message says what cannot be met
            raise
        fastest = table.fixed_cost() + sum(min(c.latency for c in seg) for seg in options)
        baseline = table.predict({"remove": []})
        best = baseline / fastest
        if fastest <= target:  # reachable in real numbers; the DP's rounding to bins is what failed
            raise BudgetError(f"No plan fits the target of {target:.3f} ms once latencies are rounded to "
                              f"prune.bins={cfg.prune.bins} steps; raise prune.bins, e.g. to {cfg.prune.bins * 4}."
                              ) from None
        instead = (f"ask for prune.target_latency_ms above {fastest:.3f}" if cfg.prune.target_latency_ms
                   else f"ask for prune.target_speedup below {best:.2f}")
        asked = (f"prune.target_latency_ms={cfg.prune.target_latency_ms}" if cfg.prune.target_latency_ms
                 else f"prune.target_speedup={cfg.prune.target_speedup}")
        raise BudgetError(
            f"{asked} cannot be reached: removing and merging every removable unit gives at most {best:.2f}x "
            f"({baseline:.3f} -> {fastest:.3f} ms predicted); {instead}."
        ) from None
    plan = {"remove": result.removed(options), "merge": cfg.prune.merge}
    return plan, result


class Linearise(Callback):
    """Fine-tuning callback: fade removed activations to identity over the first part of training."""

    def __init__(self, model: nn.Module, fraction: float):
        self.model, self.fraction = model, fraction

    def _update(self, trainer: Any) -> None:
        alpha = 1.0 if self.fraction <= 0 else min(1.0, trainer.progress / self.fraction)
        surgery.set_linearisation(self.model, alpha)

    def on_train_start(self, trainer: Any) -> None:
        self._update(trainer)

    def on_step_end(self, trainer: Any) -> None:
        self._update(trainer)

    def on_epoch_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        self._update(trainer)


def finetune(cfg: Any, baseline: nn.Module, plan: dict[str, Any], data: Any, logger: Any, output_dir: Path,
             config: dict) -> tuple[nn.Module, dict[str, float]]:
    """Apply the plan as a linearised network, fine-tune it (distilling from `baseline`), then merge.

    Seeded anew (``trainer.seed``), so the result does not depend on what ran before it in this process (a baseline
    trained now or read from the cache); an interrupted fine-tuning resumes from ``finetune/checkpoints``.
    """
    from omegaconf import OmegaConf

    from ..training import distributed as dist_utils
    from ..training import evaluate, fit, seed_everything

    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    fading = cfg.finetune.linearise_fraction > 0 and cfg.finetune.epochs > 0
    model = surgery.apply_plan(baseline, {**plan, "merge": False}, inplace=False, blend=fading)
    memory: dict[str, float] = {}
    if cfg.finetune.epochs > 0:
        optim_cfg = OmegaConf.merge(cfg.optim, {"lr": cfg.finetune.lr or cfg.optim.lr * 0.3,
                                                "warmup_epochs": 0})
        trainer_cfg = OmegaConf.merge(cfg.trainer, {"max_epochs": cfg.finetune.epochs, "resume": None})
        callback = Linearise(model, cfg.finetune.linearise_fraction)
        resume = dist_utils.broadcast_object(resumable(output_dir / "finetune") if dist_utils.info().is_main
                                             else None)
        done = fit(model, data, optim_cfg, trainer_cfg, logger, teacher=baseline,
                   distill_weight=cfg.finetune.distill_weight,
                   distill_temperature=cfg.finetune.distill_temperature, callbacks=[callback],
                   output_dir=output_dir / "finetune", config=config, resume_from=resume,
                   resume_hint=" Run the same command again: fine-tuning resumes where it stopped, with the same plan.")
        memory = done.memory
    model = surgery.finalize_merges(model) if cfg.prune.merge else model
    model.finetune_memory = memory  # peak training memory of the fine-tuning, for results.json
    device = next(baseline.parameters()).device
    metrics = evaluate(model.to(device).eval(), data.val, task=data.task)
    return model, metrics


def resumable(directory: Path) -> Path | None:
    """The interrupted fine-tuning's state to resume from, if it is intact; a damaged one is reported and dropped
    (fine-tuning starts over, which gives the same result: it is seeded)."""
    import shutil

    from ..errors import CheckpointError
    from ..training import state as ckpt

    path = ckpt.resolve_resume("auto", directory)
    if path is None:
        return None
    try:
        ckpt.load_state(path)
        return path
    except CheckpointError as exc:
        _log.warning("The interrupted fine-tuning cannot be resumed (%s): it starts over.", exc)
        shutil.rmtree(directory)
        return None


class DecodeStep(nn.Module):
    """One recurrent decode step of a language model, with its own (zero) state: the ``decode`` workload."""

    def __init__(self, model: nn.Module, batch_size: int):
        super().__init__()
        self.model = model
        self.state = _state_to(model.init_state(batch_size), next(model.parameters()).device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, mode="recurrent", state=self.state)


def _state_to(state: Any, device: torch.device) -> Any:
    layers = [None if s is None else s.to(device) for s in state.layers]
    return type(state)(layers, state.offset)


def build_lut(cfg: Any, baseline: nn.Module, data: Any, runtime: str | None = None) -> Any:
    """The latency table of `baseline` for the configured device, batch, dtype, layout and workload, in `runtime`
    (default ``prune.runtime``)."""
    from ..latency import build_table
    from ..latency.device import resolve_device

    p = cfg.prune
    kwargs: dict[str, Any] = {"input_size": data.input_size}
    if p.workload == "decode":
        state = _state_to(baseline.init_state(p.batch_size), resolve_device(p.device))
        kwargs = {"input_size": (1,), "workload": "decode", "forward_kwargs": {"mode": "recurrent", "state": state}}
    return build_table(baseline, batch_size=p.batch_size, device=p.device, dtype=p.dtype,
                       channels_last=p.channels_last, threads=p.threads, cache_dir=p.cache_dir, merge=p.merge,
                       settings=lut_settings(p), runtime=runtime or p.runtime, **kwargs)


def measure_side_by_side(table: Any, nets: dict[str, nn.Module], settings: Any = None, unfused: bool = True
                         ) -> dict[str, dict[str, float]]:
    """Latency statistics (ms) of each network, timed in interleaved rounds under the table's conditions (its runtime
    included).

    Each network runs in the form the table measures (its deploy form, :func:`zoo.fuse`, by default) and, with
    `unfused`, as ``<name>_eager`` as it is. `settings`: a :class:`~zoo.latency.CalibrationSettings` (None: its
    defaults).
    """
    from ..latency.calibrate import CalibrationSettings, time_networks
    from ..latency.measure import measured_form, prepare

    device = next(table.model.parameters()).device
    channels_last = table.condition["layout"] == "channels_last"
    forms = {}
    for name, net in nets.items():
        forms[name] = measured_form(net, table.settings)
        if unfused:
            forms[f"{name}_eager"] = net
    prepared = [prepare(copy.deepcopy(net), device, channels_last) for net in forms.values()]
    if table.condition.get("workload") == "decode":
        prepared = [DecodeStep(net, table.example.shape[0]) for net in prepared]
    benches = time_networks(prepared, table.example, {}, table, settings or CalibrationSettings(), list(forms))
    return {name: {k: round(v, 5) for k, v in bench.summary().items()} for name, bench in zip(forms, benches)}


def runtime_row(table: Any, plan: dict[str, Any], measured: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Baseline and pruned latency measured in the table's runtime, beside that table's predictions."""
    estimate = f"{table.settings.estimator}_ms"
    base_ms, pruned_ms = measured["baseline"][estimate], measured["pruned"][estimate]
    base_pred, pruned_pred = table.predict({"remove": []}), table.predict(plan)
    return {"baseline_ms": base_ms, "pruned_ms": pruned_ms, "measured_speedup": base_ms / pruned_ms,
            "predicted_baseline_ms": base_pred, "predicted_pruned_ms": pruned_pred,
            "predicted_speedup": base_pred / pruned_pred, "prediction_error": pruned_pred / pruned_ms - 1.0,
            "speedup_prediction_error": (base_pred / pruned_pred) / (base_ms / pruned_ms) - 1.0,
            "table_build_s": round(table.build_s, 3), "runtime_build_s": round(table.runtime_build_s, 3),
            "runtime_version": table.condition["runtime_version"]}


def report_runtimes(cfg: Any, table: Any, measured: dict[str, dict[str, float]], baseline: nn.Module,
                    pruned: nn.Module, plan: dict[str, Any], data: Any) -> dict[str, dict[str, Any]]:
    """Per runtime: the chosen plan (chosen in ``prune.runtime``) measured and predicted there. ``prune.runtime`` comes
    first, from the final measurement; each ``prune.runtime_report`` runtime gets its own (cached) table and its own
    side-by-side timing of the baseline and the pruned network, deploy forms."""
    rows = {cfg.prune.runtime: {**runtime_row(table, plan, measured), "chosen_here": True}}
    for runtime in dict.fromkeys(cfg.prune.runtime_report):
        if runtime in rows:
            continue
        _log.info("runtime report: the plan in %s", runtime)
        other = build_lut(cfg, baseline, data, runtime)
        timed = measure_side_by_side(other, {"baseline": baseline, "pruned": pruned.eval()},
                                     measure_settings(cfg.prune), unfused=False)
        rows[runtime] = {**runtime_row(other, plan, timed), "chosen_here": False}
    return rows


def run(cfg: Any) -> dict[str, Any]:
    """Validate, claim the run directory, then prune (:func:`prune_in`); a finished job's results are returned as
    they are (``prune.force=true`` runs it again), an interrupted job of the same config resumes.

    Under torchrun every rank runs this; rank 0 claims the directory and the others follow its verdict."""
    from ..files import read_sealed_json
    from ..training import distributed as dist_utils
    from ..training.config import validate
    from .entry import run_files
    from .runs import fingerprint, with_inputs
    from .train import to_container

    dist = dist_utils.setup()
    validate(cfg, PruneConfig)
    validate_prune(cfg)
    config = with_inputs(to_container(cfg))
    output_dir = Path(cfg.paths.output_dir)
    if not cfg.prune.force and dist.is_main:
        forget_results_without_checkpoint(output_dir, fingerprint(config))
    try:
        with claimed_by_main(cfg, config, output_dir) as state:
            if state == "finished":
                _log.info("%s exists: this job already finished (prune.force=true runs it again)",
                          output_dir / "results.json")
                return read_sealed_json(output_dir / "results.json")
            with run_files(output_dir, cfg, enabled=dist.is_main):
                return prune_in(cfg, config, output_dir, resumed=state == "resume")
    finally:
        dist_utils.cleanup()


@contextmanager
def claimed_by_main(cfg: Any, config: dict, output_dir: Path) -> Iterator[str]:
    """The run directory claimed (by rank 0 under torchrun; every rank gets its state or its refusal)."""
    from contextlib import ExitStack

    from ..training import distributed as dist_utils
    from .entry import in_multirun
    from .runs import claimed

    dir_hint = "a new hydra.sweep.dir" if in_multirun() else "a new hydra.run.dir"
    with ExitStack() as stack:
        state, refused = None, None
        if dist_utils.info().is_main:
            try:
                claim = stack.enter_context(claimed(output_dir, "prune", config, finished="results.json",
                                                    force=cfg.prune.force, force_hint="prune.force=true",
                                                    dir_hint=dir_hint))
                state = claim.state
            except ZooError as exc:
                refused = exc
        state, refusal = dist_utils.broadcast_object((state, None if refused is None else (type(refused),
                                                                                           str(refused))))
        if refused is not None:
            raise refused
        if refusal is not None:
            raise refusal[0](refusal[1])
        yield state


def forget_results_without_checkpoint(output_dir: Path, ours: str) -> None:
    """A finished run of this config whose pruned checkpoint is gone or changed is not finished: its results file is
    dropped (with a warning) so that the run completes again from its saved state."""
    from ..errors import CorruptFileError
    from ..files import file_digest, read_sealed_json

    results, checkpoint = output_dir / "results.json", output_dir / "pruned.safetensors"
    try:
        recorded = read_sealed_json(results)
    except CorruptFileError:
        return  # missing or damaged: the claim deals with it
    if recorded.get("fingerprint") != ours:
        return  # another config's run: the claim refuses it, untouched
    if not checkpoint.is_file() or file_digest(checkpoint) != recorded.get("checkpoint_sha256"):
        _log.warning("%s is missing or changed since this run finished: the run completes again", checkpoint)
        results.unlink()


def resumed_plan(path: Path, baseline: nn.Module) -> dict[str, Any] | None:
    """The plan an interrupted run of the same config chose (``plan.json``), or None if there is none or it is
    damaged (then the search runs again)."""
    from ..errors import PlanError

    if not path.is_file():
        return None
    try:
        plan = read_plan(path, baseline)
    except PlanError as exc:
        _log.warning("%s is not usable (%s): searching again", path, exc)
        return None
    _log.info("resuming with the plan this run chose before it was interrupted (%s)", path)
    return plan


def prune_in(cfg: Any, config: dict, output_dir: Path, resumed: bool) -> dict[str, Any]:
    """The prune run in a claimed directory: baseline -> table -> importance -> plan -> fine-tune -> measure.

    Under torchrun the latency table, importance, search and final measurement run once, on rank 0 (the plan is
    broadcast); evaluation and fine-tuning are data parallel; rank 0 writes the one ``results.json``. W&B is finished
    before ``results.json`` (sealed, with the config's fingerprint) is written, last.
    """
    from ..files import file_digest, write_sealed_json
    from ..training import build_loaders, create_logger, seed_everything
    from ..training import distributed as dist_utils
    from ..training.engine import resolve_device
    from .entry import hydra_context
    from .runs import SEED_KEYS, fingerprint, flatten, study_group
    from .train import data_model_cfg

    dist = dist_utils.info()
    timings: dict[str, float] = {}
    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    weights = cfg.checkpoint if cfg.checkpoint else None
    data = build_loaders(cfg.data, seed=cfg.trainer.seed, model_cfg=data_model_cfg(cfg.model, weights), rank=dist.rank,
                         world=dist.world, pin_memory=resolve_device(cfg.trainer.device).type == "cuda")
    with phase(timings, "baseline"):
        baseline, baseline_path = load_or_train_baseline(cfg, data, config)
        baseline.eval()
        given_plan = read_plan(cfg.prune.plan, baseline) if cfg.prune.plan else None
    logger = create_logger(job_logger_cfg(cfg), config=config, group=hydra_context().get("group"), is_main=dist.is_main)
    try:
        table = calibration = damages = options = result = None
        importance_cached = False
        plan = given_plan
        failure = None
        if dist.is_main:
            try:
                with phase(timings, "latency_table"):
                    table = build_lut(cfg, baseline, data)
                    calibration = table.calibrate(cfg.prune.calibrate_plans) if cfg.prune.calibrate_plans else None
                with phase(timings, "importance"):  # (also with a given plan: it is logged beside the table)
                    damages, importance_cached = importance_of(cfg, config, baseline, table, data)
                with phase(timings, "search"):
                    options = build_options(table, damages, cfg.prune.max_memory_mb)
                    plan_file = output_dir / "plan.json"
                    if plan is None and resumed:  # an interrupted run of this config keeps its plan
                        plan = resumed_plan(plan_file, baseline)
                    if plan is None:
                        model_inputs = (model_search_inputs(cfg, baseline, table, data, options)
                                        if cfg.prune.search in MODEL_SEARCHES else None)
                        plan, result = choose_plan(cfg, table, options, model_inputs)
                        write_json(plan_file, plan)
            except BaseException as exc:  # the other ranks are told, then rank 0 raises it
                failure = exc
        told = None if failure is None else (isinstance(failure, ZooError), f"{type(failure).__name__}: {failure}")
        plan, stopped = dist_utils.broadcast_object((plan, told))  # the other ranks wait here for rank 0's plan
        if failure is not None:
            raise failure
        if stopped is not None:
            raise (ZooError if stopped[0] else RuntimeError)(f"rank 0 stopped before fine-tuning ({stopped[1]})")
        with phase(timings, "finetune"):
            base_metrics, base_cached = evaluate_baseline(cfg, config, baseline, data)
            pruned, pruned_metrics = finetune(cfg, baseline, plan, data, logger, output_dir, config)
        if not dist.is_main:
            logger.finish(exit_code=0)
            dist_utils.barrier()
            return {"plan": plan, "pruned": {"metrics": pruned_metrics}}
        with phase(timings, "measure"):
            measured = measure_side_by_side(table, {"baseline": baseline, "pruned": pruned.eval()},
                                            measure_settings(cfg.prune))
        with phase(timings, "runtime_report"):
            runtimes = report_runtimes(cfg, table, measured, baseline, pruned, plan, data)
        checkpoint = save_checkpoint(pruned, output_dir / "pruned.safetensors", metrics=pruned_metrics,
                                     baseline=str(baseline_path), target_speedup=cfg.prune.target_speedup)
        results = assemble_results(cfg, table, plan, result, baseline, pruned, base_metrics, pruned_metrics,
                                   measured, timings, checkpoint, calibration, importance_cached)
        results["baseline"].update(source=str(baseline_path), metrics_cached=base_cached,
                                   tag=getattr(baseline, "zoo_tag", None))
        results["runtimes"] = runtimes
        results["world_size"] = dist.world
        results["finetune_memory"] = getattr(pruned, "finetune_memory", {})
        results["fingerprint"] = fingerprint(config)
        results["config_group"] = study_group(config)
        results["seeds"] = {key: flatten(config).get(key) for key in SEED_KEYS}
        results["checkpoint_sha256"] = file_digest(checkpoint)
        if cfg.prune.export:
            results["export"] = export_pruned(cfg, pruned, data, output_dir)
        log_to_wandb(logger, table, options, damages, plan, results)
    except BaseException:
        logger.finish(exit_code=1)
        raise
    logger.finish(exit_code=0)
    write_sealed_json(output_dir / "results.json", results)
    dist_utils.barrier()  # the other ranks end once the results are written
    print(format_summary(results))
    return results


def importance_of(cfg: Any, config: dict, baseline: nn.Module, table: Any, data: Any
                  ) -> tuple[list[dict[frozenset[str], float]], bool]:
    """Damage of every segment variant (cached per weights, score, data and segments) and whether it was cached."""
    count = cfg.prune.calib_batches
    finetuned = cfg.prune.importance == "finetune"  # scored on batches it did not train on: the next `count` ones
    batches = calibration_batches(data, 2 * count if finetuned else count)
    batches, train_batches = batches[:count], (batches[count:] if finetuned else None)
    key = {"weights": weights_digest(baseline), "score": cfg.prune.importance, "batches": batches_digest(batches),
           "segments": [s.name for s in table.segments]}
    if finetuned:
        if not train_batches:
            raise ZooError(f"prune.importance=finetune needs {2 * cfg.prune.calib_batches} training batches "
                           f"(prune.calib_batches={cfg.prune.calib_batches} to score on, as many to fine-tune on); "
                           f"the training split has fewer: lower prune.calib_batches or data.batch_size.")
        key["train_batches"] = batches_digest(train_batches)
    cache = Path(cfg.prune.cache_dir or Path(cfg.paths.log_dir) / "cache")
    return cached_scores(cache, key, table.segments, lambda: score_variants(
        baseline, table.segments, batches, cfg.prune.importance, train_batches=train_batches))


def job_logger_cfg(cfg: Any) -> Any:
    """The logger config; in a multirun each W&B run is named after its job's overrides (same group)."""
    from omegaconf import OmegaConf

    from .entry import hydra_context

    context = hydra_context()
    if cfg.logger.run_name or "job_num" not in context:
        return cfg.logger
    from hydra.core.hydra_config import HydraConfig

    name = HydraConfig.get().job.override_dirname or f"job{context['job_num']}"
    return OmegaConf.merge(cfg.logger, {"run_name": name})
