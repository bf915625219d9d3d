"""The prune job's timing: its latency table, baseline and pruned networks side by side in the table's runtime, the
other runtimes' reports, and the export of the pruned network."""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from .prune_config import table_settings

_log = logging.getLogger(__name__)


def build_job_table(cfg: Any, baseline: nn.Module, data: Any, runtime: str | None = None) -> Any:
    """The latency table of `baseline` for the configured device, batch, dtype, layout and workload, in `runtime`
    (default the planning runtime: ``prune.runtime``, or its INT8 form with ``prune.quantize=int8``)."""
    from ..latency import build_table
    from ..latency.device import resolve_device

    p = cfg.prune
    settings = table_settings(p, runtime)
    kwargs: dict[str, Any] = {"input_size": data.input_size}
    if p.workload == "decode":
        context = data.input_size[0]
        kwargs = {"input_size": (1,), "workload": decode_workload(baseline, context), "forward_kwargs":
                  baseline.decode_inputs(p.batch_size, context, resolve_device(p.device))}
        if getattr(baseline, "kv_cache", False) and settings.entries == "auto":  # a layer timed alone would append
            settings = replace(settings, entries="context")  # to its captured cache at every call; a network's
            # decode step starts from the same cache each time
    return build_table(baseline, batch_size=p.batch_size, device=p.device, dtype=p.dtype,
                       channels_last=p.channels_last, threads=p.threads, cache_dir=p.cache_dir, merge=p.merge,
                       settings=settings, **kwargs)


def decode_workload(model: nn.Module, context: int) -> str:
    """The table's name of one decode step: ``decode``, or ``decode@<context>`` for a model whose step reads a KV
    cache of that many tokens (its cost depends on it)."""
    return f"decode@{context}" if getattr(model, "kv_cache", False) else "decode"


def decode_context(table: Any) -> int | None:
    """The context a decode table's step follows (None: the model's own, or a forward table)."""
    name = str(table.condition.get("workload", ""))
    return int(name.partition("@")[2]) if name.startswith("decode@") else None


class DecodeStep(nn.Module):
    """One decode step of `model` from the same starting point every call (`inputs`: its ``decode_inputs``): token
    ids [B, 1] -> logits [B, vocab]."""

    def __init__(self, model: nn.Module, inputs: dict[str, Any]):
        super().__init__()
        self.model, self.inputs = model, inputs

    def forward(self, token: Any) -> Any:
        return self.model(token, **self.inputs)[:, -1]


def measure_side_by_side(table: Any, nets: dict[str, nn.Module], settings: Any = None, unfused: bool = True
                         ) -> dict[str, dict[str, float]]:
    """Latency statistics (ms) of each network, timed in interleaved rounds under the table's conditions (its runtime
    included).

    Each network runs in the form the table measures (its deploy form, :func:`zoo.fuse`, by default) and, with
    `unfused`, as ``<name>_eager`` as it is. `settings`: a :class:`~zoo.latency.NetworkTimingSettings` (None: its
    defaults).
    """
    from ..latency.accuracy import time_networks
    from ..latency.measure import measured_form, prepare
    from ..latency.settings import NetworkTimingSettings

    device = next(table.model.parameters()).device
    channels_last = table.condition["layout"] == "channels_last"
    forms = {}
    for name, net in nets.items():
        forms[name] = measured_form(net, table.settings)
        if unfused:
            forms[f"{name}_eager"] = net
    prepared = [prepare(copy.deepcopy(net), device, channels_last) for net in forms.values()]
    if str(table.condition.get("workload")).startswith("decode"):
        batch, context = table.example.shape[0], decode_context(table)
        prepared = [DecodeStep(net, net.decode_inputs(batch, context, device)) for net in prepared]
    benches = time_networks(prepared, table.example, {}, table, settings or NetworkTimingSettings(), list(forms))
    return {name: {k: round(v, 5) for k, v in bench.summary().items()} for name, bench in zip(forms, benches)}


def heal_latency(table: Any, healed: dict[str, float], unhealed: dict[str, float]) -> dict[str, Any]:
    """``prune.heal=linear``: the healed network's latency beside the same plan unhealed, timed in the same interleaved
    rounds; a difference within twice their combined relative uncertainty is a tie (the patch adds no op, so a tie is
    what is expected)."""
    estimate = f"{table.settings.estimator}_ms"
    ratio = healed[estimate] / unhealed[estimate]
    noise = 2.0 * math.hypot(healed["rel_uncertainty"], unhealed["rel_uncertainty"])
    verdict = "tie" if abs(ratio - 1.0) <= noise else "slower" if ratio > 1.0 else "faster"
    return {"healed_ms": healed[estimate], "unhealed_ms": unhealed[estimate], "ratio": round(ratio, 4),
            "noise": round(noise, 4), "verdict": verdict, "estimator": table.settings.estimator}


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


def plan_in_table(other: Any, request: Any, baseline: nn.Module, pruned: nn.Module, plan: dict[str, Any]
                  ) -> dict[str, Any]:
    """The chosen plan in a table it was not chosen in (another runtime, another workload): baseline and pruned
    timed side by side there (deploy forms), beside that table's predictions."""
    timed = measure_side_by_side(other, {"baseline": baseline, "pruned": pruned.eval()}, request.measure,
                                 unfused=False)
    return {**runtime_row(other, plan, timed), "chosen_here": False}


def report_runtimes(cfg: Any, request: Any, table: Any, measured: dict[str, dict[str, float]], baseline: nn.Module,
                    pruned: nn.Module, plan: dict[str, Any], data: Any) -> dict[str, dict[str, Any]]:
    """Per runtime of the job's `request` (:class:`~zoo.jobs.prune_request.PruneRequest`): the chosen plan (chosen in
    the planning runtime) measured and predicted there. The planning runtime comes first, from the final measurement;
    each other runtime (:func:`~zoo.jobs.prune_config.reported_runtimes`: with
    ``prune.quantize=int8`` onnxruntime's float32 and INT8 forms, then ``prune.runtime_report``) gets its own
    (cached) table and its own side-by-side timing (:func:`plan_in_table`)."""
    rows = {request.planning_runtime: {**runtime_row(table, plan, measured), "chosen_here": True}}
    for runtime in request.reported_runtimes:
        _log.info("runtime report: the plan in %s", runtime)
        rows[runtime] = plan_in_table(build_job_table(cfg, baseline, data, runtime), request, baseline, pruned, plan)
    return rows


def report_workloads(cfg: Any, request: Any, table: Any, measured: dict[str, dict[str, float]],
                     baseline: nn.Module, pruned: nn.Module, plan: dict[str, Any], data: Any
                     ) -> dict[str, dict[str, Any]]:
    """Per workload the model's family supports (a language model's prefill, ``forward``, and its ``decode`` step):
    the chosen plan (chosen in ``prune.workload``) measured and predicted there, the other workload with its own
    (cached) table and its own side-by-side timing (:func:`plan_in_table`), in the planning runtime."""
    from omegaconf import open_dict

    rows = {cfg.prune.workload: {**runtime_row(table, plan, measured), "chosen_here": True}}
    for workload in request.family.supported("workload"):
        if workload == cfg.prune.workload or request.family.refusal("workload", workload, {}) is not None:
            continue
        _log.info("workload report: the plan in the %s workload", workload)
        other_cfg = copy.deepcopy(cfg)
        with open_dict(other_cfg):
            other_cfg.prune.workload = workload
        other = build_job_table(other_cfg, baseline, data)
        rows[workload] = {**plan_in_table(other, request, baseline, pruned, plan),
                          "condition_workload": other.condition["workload"]}
    return rows


def export_pruned(cfg: Any, pruned: nn.Module, data: Any, output_dir: Path) -> dict[str, Any]:
    """``prune.export``: the pruned model as ``pruned.onnx`` or ``pruned.pt2`` with a dynamic batch axis at the data's
    input size (dynamic height and width too with ``prune.export_dynamic_size``; for ``prune.workload=decode``, a
    RetNet's decode step), checked against PyTorch (zoo.export) at two batch sizes within ``prune.export_rtol``; or,
    with ``hf``, a RetNet as a flash-linear-attention folder ``hf/`` (with the run's tokenizer, when it used one).
    An export that fails or misses the tolerance is recorded (``passed: false`` and the error) and reported, after
    the run's own results are safe."""
    from ..deploy.export import export
    from ..errors import ExportError

    path = output_dir / {"onnx": "pruned.onnx", "torch_export": "pruned.pt2", "hf": "hf"}[cfg.prune.export]
    form = "recurrent" if cfg.prune.workload == "decode" and cfg.prune.export != "hf" else "parallel"
    tokenizer = cfg.data.get("tokenizer")
    try:
        report = export(copy.deepcopy(pruned).cpu().float(), path, format=cfg.prune.export,
                        input_size=data.input_size, form=form, rtol=cfg.prune.export_rtol,
                        dynamic_size=cfg.prune.export_dynamic_size,
                        tokenizer=tokenizer if tokenizer not in (None, "bytes") else None).as_dict()
    except ExportError as error:
        _log.error("prune.export=%s failed: %s", cfg.prune.export, error)
        return {"path": str(path), "format": cfg.prune.export, "form": form, "passed": False, "error": str(error)}
    _log.info("exported %s (%s; max difference %.1e relative)", report["path"], report["checked_with"],
              report["max_rel_diff"])
    return report
