"""A whole depth-pruning run from a composed config: what ``prune.py`` calls.

baseline (checkpoint, or trained once and cached) -> latency table on the device -> importance of every
segment variant (cached) -> exact DP search within the latency budget -> plan -> linearised network with
fading activations -> fine-tune (optional distillation from the baseline) -> merge -> measure baseline and
pruned side by side -> ``results.json``, pruned checkpoint, W&B.

Hydra and W&B are imported only inside the functions that use them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ZooError
from ..files import write_json
from ..latency.accuracy import correct
from ..pruning import surgery
from ..training.logger import PrefixedLogger
from ..weights.checkpoint import save_checkpoint
from .baseline import baseline_health, evaluate_baseline, load_or_train_baseline
from .final_timing import (
    build_job_table,
    export_pruned,
    heal_latency,
    measure_side_by_side,
    report_runtimes,
    report_workloads,
)
from .finetune import finetune, qat_finetune
from .plan import (
    Target,
    against_ceiling,
    build_options,
    ceiling_speedup,
    checked_plan,
    choose_plan,
    corrected_plan,
    importance_of,
    latency_only_options,
    model_search_inputs,
    resumed_plan,
    target_check,
)
from .prune_request import PruneRequest, read_request
from .prune_results import assemble_results, format_summary, log_lineage, log_to_wandb, metric_view, table_record
from .quantized import int8_quality

_log = logging.getLogger(__name__)


@contextmanager
def phase(timings: dict[str, float], name: str) -> Iterator[None]:
    """Time a phase of the run into `timings` (seconds) and log it."""
    start = time.perf_counter()
    _log.info("%s ...", name)
    yield
    timings[name] = round(time.perf_counter() - start, 3)
    _log.info("%s done in %.1f s", name, timings[name])


def run(cfg: Any) -> dict[str, Any]:
    """Validate, claim the run directory, then prune (:func:`prune_in`); a finished job's results are returned as
    they are (``prune.force=true`` runs it again), an interrupted job of the same config resumes.

    Under torchrun every rank runs this; rank 0 claims the directory and the others follow its verdict."""
    from ..files import read_sealed_json
    from ..training import distributed as dist_utils
    from .cli import new_dir_hint, run_files
    from .model_spec import to_container
    from .runs import claimed_by_main, fingerprint, with_inputs

    dist = dist_utils.setup()
    request = read_request(cfg)
    config = with_inputs(to_container(cfg))
    output_dir = Path(cfg.paths.output_dir)
    if not request.prune.force and dist.is_main:
        forget_results_without_checkpoint(output_dir, fingerprint(config))
    try:
        with claimed_by_main(output_dir, "prune", config, finished="results.json", force=request.prune.force,
                             force_hint="prune.force=true", dir_hint=new_dir_hint()) as state:
            if state == "finished":
                _log.info("%s exists: this job already finished (prune.force=true runs it again)",
                          output_dir / "results.json")
                return read_sealed_json(output_dir / "results.json")
            with run_files(output_dir, cfg, enabled=dist.is_main):
                return prune_in(cfg, request, config, output_dir, resumed=state == "resume")
    finally:
        dist_utils.cleanup()


def baseline_ready(cfg: Any, config: dict) -> bool:
    """Whether the baseline needs no training: weights were given (``checkpoint=``), or this config's baseline is
    cached and intact."""
    from .baseline import baseline_config, baseline_dir, finished_baseline

    if cfg.checkpoint:
        return True
    directory = baseline_dir(cfg, config)
    return directory.is_dir() and finished_baseline(directory, baseline_config(config)) is not None


def check_ceiling_before_training(cfg: Any, request: PruneRequest, data: Any, target: Target) -> None:
    """Refuse a target beyond the network's reach before its baseline trains: the latency table of the untrained
    architecture (a latency does not depend on the weights, and the table is cached by architecture, so the job
    reuses it) and its fastest plan, as :func:`~zoo.jobs.plan.choose_plan` would judge them."""
    from .model_spec import build_model

    architecture = build_model(cfg.model, data, pretrained=False).eval()
    table = build_job_table(cfg, architecture, data)
    against_ceiling(cfg, target, table, latency_only_options(table, request.prune.max_memory_mb,
                                                             request.prune.export == "hf"))


def check_plan_before_training(cfg: Any, request: PruneRequest, data: Any, plan: bool) -> None:
    """On the untrained architecture, its zero-initialised parameters drawn afresh (a zero layer scale or last
    BatchNorm would hide which op reaches a block's output; trained weights have none): refuse a given
    ``prune.plan`` that does not apply or, with ``prune.heal=linear``, cannot be healed (`plan`), and, with
    ``prune.heal_ridge=0``, calibration too small for the map of a gap the search may choose."""
    import torch

    from ..models.discovery import _genericise
    from ..pruning.healing import HealError, check_healable, rows_problem
    from .model_spec import build_model

    architecture = build_model(cfg.model, data, pretrained=False).eval()
    _genericise(architecture, torch.Generator().manual_seed(0))
    if plan:
        checked_plan(request.plan, architecture, request.prune.heal)
        inside = [u.name for u in architecture.depth_unit_specs() if u.kind in surgery.INSIDE
                  and u.name in request.plan.get("remove", [])]
        if inside and request.prune.export == "hf":
            raise ZooError(f"prune.export=hf writes a folder whose stock config has every layer's sub-layers and "
                           f"activations; the plan removes {', '.join(inside[:4])}: remove whole layers, or export "
                           f"with prune.export=onnx (or none; pruned.safetensors is written either way)")
    if request.prune.heal == "linear" and request.prune.heal_ridge == 0:
        batch = next(iter(data.train))[0]  # a calibration batch is a training batch
        if request.plan is not None:  # a given plan: its own gaps
            pruned = surgery.apply_plan(architecture, request.plan, inplace=False)
            check_healable(architecture, pruned, list(request.plan.get("remove", [])),
                           [batch] * request.prune.calib_batches, ridge=0.0)
            return
        problem = rows_problem(architecture, batch, request.prune.calib_batches)
        if problem:
            raise HealError(f"prune.heal_ridge=0 with prune.calib_batches={request.prune.calib_batches} batches of "
                            f"data.batch_size={cfg.data.batch_size}: {problem}")


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


def prune_in(cfg: Any, request: PruneRequest, config: dict, output_dir: Path, resumed: bool) -> dict[str, Any]:
    """The prune run of `request` (`cfg`, read: :func:`~zoo.jobs.prune_request.read_request`) in a claimed directory:
    ceiling -> baseline -> table -> importance -> plan -> fine-tune -> measure.

    Under torchrun the latency table, importance, search and final measurement run once, on rank 0 (the plan is
    broadcast); evaluation and fine-tuning are data parallel; rank 0 writes the one ``results.json``. W&B is finished
    before ``results.json`` (sealed, with the config's fingerprint) is written, last.
    """
    from ..files import file_digest, write_sealed_json
    from ..latency.device import resolve_device
    from ..training import build_loaders, create_logger, seed_everything
    from ..training import distributed as dist_utils
    from ..training.resources import set_threads
    from ..training.settings import DataConfig
    from .cli import hydra_context, jobs_sharing_cores
    from .runs import SEED_KEYS, fingerprint, flatten, study_group
    from .train_config import typed

    dist = dist_utils.info()
    timings: dict[str, float] = {}
    p = request.prune
    target = Target.of(p)
    threads = set_threads(cfg.trainer.get("threads"), *jobs_sharing_cores())
    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    device = resolve_device(cfg.trainer.device, dist.local_rank, warn_fallback=False)
    data = build_loaders(typed(cfg.data, DataConfig), seed=cfg.trainer.seed,
                         model_cfg=request.data_model_cfg, rank=dist.rank, world=dist.world,
                         pin_memory=device.type == "cuda")
    if dist.is_main and not dist.enabled and request.plan is None and not baseline_ready(cfg, config):
        with phase(timings, "ceiling"):  # before the baseline trains: a target beyond reach is refused first
            check_ceiling_before_training(cfg, request, data, target)
    given = request.plan is not None and not baseline_ready(cfg, config)  # (else checked as the baseline loads)
    if dist.is_main and not dist.enabled and (given or (p.heal == "linear" and p.heal_ridge == 0)):  # torchrun: later
        with phase(timings, "plan_check"):  # what a plan or its healing cannot do, before the baseline trains
            check_plan_before_training(cfg, request, data, given)
    with phase(timings, "baseline"):
        baseline, baseline_path = load_or_train_baseline(cfg, data, config)
        baseline.eval()
        if hasattr(baseline, "zoo_depth_note"):
            _log.info("%s: %s", cfg.model.name, baseline.zoo_depth_note)
        given_plan = checked_plan(request.plan, baseline, request.prune.heal) if request.plan else None
        base_metrics, base_cached = evaluate_baseline(cfg, config, baseline, data)  # cached: once per weights+data
        health = baseline_health(base_metrics, data.task, data.num_classes)
        if not health["trained"]:
            if p.require_trained_baseline:
                raise ZooError(f"The baseline did not learn ({health['why']}); prune.require_trained_baseline=true "
                               f"refuses it: train it longer (trainer.max_epochs) or give trained weights.")
            _log.warning("THE BASELINE DID NOT LEARN: %s. Pruning it proceeds, but its accuracy numbers mean "
                         "nothing (prune.require_trained_baseline=true refuses such a baseline).", health["why"])
    logger = create_logger(job_logger_cfg(cfg), config=config, group=hydra_context().get("group"), is_main=dist.is_main)
    try:
        table = correction = damages = options = result = corrections = None
        importance_cached = False
        plan = given_plan
        failure = None
        if dist.is_main:
            try:
                with phase(timings, "latency_table"):
                    table = build_job_table(cfg, baseline, data)
                    correction = correct(table, p.correction_plans) if p.correction_plans else None
                with phase(timings, "importance"):  # (also with a given plan: it is logged beside the table)
                    damages, importance_cached = importance_of(cfg, config, baseline, table, data)
                plan_file = output_dir / "plan.json"
                if plan is None and resumed:  # an interrupted run of this config keeps its plan (checked before)
                    plan = resumed_plan(plan_file, baseline)
                if plan is None:
                    with phase(timings, "search"):
                        options = build_options(table, damages, p.max_memory_mb, p.export == "hf")
                        model_inputs = model_search_inputs(cfg, baseline, table, data, options)
                        plan, result = choose_plan(cfg, target, table, options, model_inputs)
                    with phase(timings, "target_check"):
                        kept, tried = corrected_plan(cfg, target, table, options, model_inputs, baseline, plan,
                                                     result)
                        plan, result, corrections = kept.plan, kept.result, [c.record() for c in tried]
                    write_json(plan_file, plan)
                else:
                    options = build_options(table, damages, p.max_memory_mb, p.export == "hf")
            except BaseException as exc:  # the other ranks are told, then rank 0 raises it
                failure = exc
        told = None if failure is None else (isinstance(failure, ZooError), f"{type(failure).__name__}: {failure}")
        plan, stopped = dist_utils.broadcast_object((plan, told))  # the other ranks wait here for rank 0's plan
        if failure is not None:
            raise failure
        if stopped is not None:
            raise (ZooError if stopped[0] else RuntimeError)(f"rank 0 stopped before fine-tuning ({stopped[1]})")
        with phase(timings, "finetune"):
            pruned, pruned_metrics = finetune(cfg, baseline, plan, data, logger, output_dir, config)
        if p.heal == "linear" and p.heal_compare:  # the same plan fine-tuned unhealed, same seed: beside it
            with phase(timings, "finetune_unhealed"):
                _, unhealed_metrics = finetune(cfg, baseline, plan, data, PrefixedLogger(logger, "unhealed"),
                                               output_dir, config, heal=False, subdir="finetune_unhealed")
            pruned.heal_report["finetuned"] = {"healed": metric_view(pruned_metrics),
                                               "unhealed": metric_view(unhealed_metrics)}
        if request.finetune.qat:  # every rank trains (DDP); the INT8 model is made from it below
            with phase(timings, "qat"):
                qat_model, qat_metrics = qat_finetune(cfg, baseline, pruned, data, logger, output_dir, config)
        if not dist.is_main:
            logger.finish(exit_code=0)
            dist_utils.barrier()
            return {"plan": plan, "pruned": {"metrics": pruned_metrics}}
        with phase(timings, "measure"):
            nets = {"baseline": baseline, "pruned": pruned.eval()}
            healed = getattr(pruned, "heal_report", None)
            if healed is not None:  # the same plan unhealed, timed in the same rounds
                nets["unhealed"] = surgery.apply_plan(baseline, plan, inplace=False).eval()
            measured = measure_side_by_side(table, nets, request.measure)
            if healed is not None:
                healed["latency"] = heal_latency(table, measured["pruned"], measured.pop("unhealed"))
                measured.pop("unhealed_eager")
        with phase(timings, "runtime_report"):
            runtimes = report_runtimes(cfg, request, table, measured, baseline, pruned, plan, data)
        if request.entry.task == "language_model":  # an LM is served in both: its plan measured in each
            with phase(timings, "workload_report"):
                workloads = report_workloads(cfg, request, table, measured, baseline, pruned, plan, data)
        checkpoint = save_checkpoint(pruned, output_dir / "pruned.safetensors", metrics=pruned_metrics,
                                     baseline=str(baseline_path), target_speedup=p.target_speedup)
        results = assemble_results(cfg, table, plan, result, baseline, pruned, base_metrics, pruned_metrics,
                                   measured, timings, checkpoint, correction, importance_cached)
        results["baseline"].update(source=str(baseline_path), metrics_cached=base_cached,
                                   tag=getattr(baseline, "zoo_tag", None), health=health)
        results["runtimes"] = runtimes
        if request.entry.task == "language_model":
            results["workloads"] = workloads
        results["target_check"] = target_check(target, results, corrections)
        results["world_size"] = dist.world
        results["threads"] = threads
        results["ceiling_speedup"] = round(ceiling_speedup(table, options), 3)
        results["depth_units"] = getattr(baseline, "zoo_depth_note", "declared by the model's family")
        results["finetune_memory"] = getattr(pruned, "finetune_memory", {})
        results["finetune_lora"] = getattr(pruned, "lora_report", None)
        if getattr(pruned, "heal_report", None) is not None:
            results["heal"] = pruned.heal_report
        results["fingerprint"] = fingerprint(config)
        results["config_group"] = study_group(config)
        results["seeds"] = {key: flatten(config).get(key) for key in SEED_KEYS}
        results["checkpoint_sha256"] = file_digest(checkpoint)
        if p.quantize == "int8":
            with phase(timings, "int8"):
                shipped = qat_model if request.finetune.qat else pruned
                results["int8"] = int8_quality(cfg, {"baseline": baseline, "pruned": shipped}, data, output_dir)
                if request.finetune.qat:
                    results["int8"]["qat"] = {"epochs": request.finetune.qat_epochs,
                                              "simulated_metrics": metric_view(qat_metrics),
                                              "note": "the pruned INT8 model is quantised from the QAT network; the "
                                                      "baseline's INT8 model by post-training quantisation"}
        if p.export:
            results["export"] = export_pruned(cfg, pruned, data, output_dir)
        files = {"baseline": baseline_file(baseline_path, baseline, output_dir), "checkpoint": checkpoint,
                 "plan": write_json(output_dir / "plan.json", plan),
                 "latency_table": write_json(output_dir / "latency_table.json", table_record(table)),
                 "card": write_cards(request, results, output_dir)}
        log_to_wandb(logger, table, options, damages, plan, results)
        results["lineage"] = log_lineage(logger, results, files)
    except BaseException:
        logger.finish(exit_code=1)
        raise
    logger.finish(exit_code=0)
    write_sealed_json(output_dir / "results.json", results)
    dist_utils.barrier()  # the other ranks end once the results are written
    print(format_summary(results))
    return results


def baseline_file(source: Any, baseline: Any, output_dir: Path) -> Path:
    """The baseline's weight file, or (for weights from a hub or a folder) ``baseline_source.json`` naming the source
    and the weights' digest: what the W&B lineage records as the baseline."""
    from ..pruning.importance import weights_digest

    if Path(str(source)).is_file():
        return Path(str(source))
    return write_json(output_dir / "baseline_source.json", {"source": str(source), "tag": getattr(
        baseline, "zoo_tag", None), "weights_digest": weights_digest(baseline)})


def write_cards(request: PruneRequest, results: dict[str, Any], output_dir: Path) -> Path:
    """The model card (``README.md``) beside ``pruned.safetensors``, and in the ``hf/`` folder of an hf export."""
    from .card import write_model_card
    from .cli import hydra_context

    overrides, task = hydra_context().get("overrides"), request.entry.task
    export = results.get("export") or {}
    if export.get("format") == "hf" and export.get("passed") is not False:
        write_model_card(export["path"], results, overrides, task)
    return write_model_card(output_dir, results, overrides, task)


def job_logger_cfg(cfg: Any) -> Any:
    """The logger's settings; in a multirun each W&B run is named after its job's overrides (same group)."""
    from dataclasses import replace

    from ..training.settings import LoggerConfig
    from .cli import hydra_context
    from .train_config import typed

    context = hydra_context()
    logger = typed(cfg.logger, LoggerConfig)
    if logger.run_name or "job_num" not in context:
        return logger
    from hydra.core.hydra_config import HydraConfig

    return replace(logger, run_name=HydraConfig.get().job.override_dirname or f"job{context['job_num']}")
