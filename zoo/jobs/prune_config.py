"""``prune.*`` and ``finetune.*``: the prune job's config schema, the checks :func:`zoo.jobs.prune_request.read_request`
makes of it before any work, and what the settings decide (runtimes, timing settings)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ZooError
from ..pruning.healing import HEALS
from ..pruning.importance import SCORES
from ..pruning.search import SEARCHES
from .train_config import TrainConfig


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
    importance: str = "tempered"
    calib_batches: int = 4
    heal: str = "none"
    heal_ridge: float = 1e-3
    heal_compare: bool = True
    search: str = "interaction"
    bins: int = 1000
    target_tolerance: float = 0.05
    target_corrections: int = 3
    recovery_steps: int = 0
    seed: int = 0
    correction_plans: int = 0
    cache_dir: str | None = None
    workload: str = "forward"
    plan: str | None = None
    force: bool = False
    export: str | None = None
    export_rtol: float = 1e-4
    export_dynamic_size: bool = False
    quantize: str | None = None
    int8_table: bool = True
    objectives: list[str] = field(default_factory=lambda: ["metric"])
    runtime: str = "eager"
    runtime_report: list[str] = field(default_factory=list)
    max_memory_mb: float | None = None
    table: dict[str, Any] = field(default_factory=dict)
    measure: dict[str, Any] = field(default_factory=dict)
    require_trained_baseline: bool = False


@dataclass
class FinetuneSettings:
    """``finetune.*``: epochs after surgery, learning rate, distillation, progressive linearisation."""

    epochs: int = 4
    lr: float | None = None
    distill_weight: float = 0.3
    distill_temperature: float = 2.0
    linearise_fraction: float = 0.5
    qat: bool = False
    qat_epochs: int = 1
    qat_lr: float | None = None
    lora_rank: int = 0
    lora_alpha: float = 16.0


@dataclass
class PruneConfig(TrainConfig):
    """The root schema of ``conf/prune.yaml``: the training schema plus ``checkpoint``, ``prune`` and ``finetune``."""

    checkpoint: str | None = None
    prune: PruneSettings = field(default_factory=PruneSettings)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)


def register_configs(config_dir: str | Path | None = None) -> None:
    """Store ``prune_schema`` (:class:`PruneConfig`) and the training schemas in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from .train_config import register_configs as register_train

    register_train(config_dir)
    ConfigStore.instance().store(name="prune_schema", node=PruneConfig)


PRUNE_RANGES = (  # (key, lowest, highest, lowest excluded?): see zoo.jobs.train_config.RANGES
    ("prune.target_speedup", 1.0, None, True), ("prune.target_latency_ms", 0.0, None, True),
    ("prune.max_memory_mb", 0.0, None, True), ("prune.batch_size", 1, None, False),
    ("prune.calib_batches", 1, None, False), ("prune.bins", 10, None, False), ("prune.threads", 1, None, False),
    ("prune.target_tolerance", 0.0, 1.0, True), ("prune.target_corrections", 0, None, False),
    ("prune.recovery_steps", 0, None, False), ("prune.heal_ridge", 0.0, None, False),
    ("prune.correction_plans", 0, None, False), ("prune.export_rtol", 0.0, None, False),
    ("finetune.epochs", 0, None, False), ("finetune.lr", 0.0, None, True),
    ("finetune.distill_weight", 0.0, 1.0, False), ("finetune.distill_temperature", 0.0, None, True),
    ("finetune.linearise_fraction", 0.0, 1.0, False), ("finetune.qat_epochs", 1, None, False),
    ("finetune.qat_lr", 0.0, None, True), ("finetune.lora_rank", 0, None, False),
    ("finetune.lora_alpha", 0.0, None, True),
)


OBJECTIVES = {  # what a prune job can return to a Hydra sweeper (Optuna): name -> where it is in results.json
    "metric": "the pruned model's validation metric (val/acc1, else val/loss)",
    "val/acc1": "top-1 accuracy (%)", "val/acc5": "top-5 accuracy (%)", "val/loss": "validation loss",
    "val/ppl": "validation perplexity", "latency_ms": "the pruned model's measured latency (ms)",
    "speedup": "the measured speed-up against the baseline", "params": "the pruned model's parameter count",
}


def objective_values(results: dict[str, Any], objectives: list[str]) -> float | tuple[float, ...] | None:
    """The values of `objectives` in a prune job's results (one float for one objective, else a tuple; None on a
    torchrun rank other than 0); a metric the task does not have raises ZooError naming the ones it has."""
    if "measured_speedup" not in results:  # a torchrun rank other than 0: it measures and reports nothing
        return None
    pruned = results["pruned"]
    metrics = pruned["metrics"]
    known = {**metrics, "metric": metrics.get("val/acc1", metrics.get("val/loss")),
             "latency_ms": pruned.get("latency_ms"), "speedup": results.get("measured_speedup"),
             "params": pruned.get("params")}
    missing = [o for o in objectives if known.get(o) is None]
    if missing:
        raise ZooError(f"prune.objectives names {', '.join(missing)}, which this run does not measure; it has "
                       f"{', '.join(k for k, v in known.items() if v is not None)}.")
    values = tuple(float(known[o]) for o in objectives)
    return values[0] if len(values) == 1 else values


def check_prune_choices(p: PruneSettings, finetune: FinetuneSettings, model: str, task: str) -> None:
    """The prune job's own choices (its ranges are :data:`PRUNE_RANGES`): a budget, the importance score, the search,
    the objectives a sweeper may ask of `model` (a `task` model), the workload, the export and what goes with it."""
    if p.target_latency_ms is None and p.target_speedup is None:
        raise ZooError("Give a budget: prune.target_speedup (e.g. 1.5) or prune.target_latency_ms.")
    if p.importance not in SCORES:
        raise ZooError(f"prune.importance={p.importance!r}; allowed: {', '.join(SCORES)}.")
    if p.search not in SEARCHES:
        raise ZooError(f"prune.search={p.search!r}; allowed: {', '.join(SEARCHES)}.")
    if p.heal not in HEALS:
        raise ZooError(f"prune.heal={p.heal!r}; allowed: {', '.join(HEALS)}.")
    if p.heal == "linear" and p.recovery_steps > 0:
        raise ZooError("prune.heal=linear judges the search's finalists healed; prune.recovery_steps>0 judges them "
                       "after a short recovery: choose one (prune.recovery_steps=0 with heal=linear).")
    task_metrics = ("val/ppl",) if task == "language_model" else ("val/acc1", "val/acc5")
    if finetune.lora_rank > 0 and not model.startswith("hf/"):
        raise ZooError(f"finetune.lora_rank={finetune.lora_rank} fine-tunes a transformers model's linear layers "
                       f"through peft (model=hf); model={model} is fine-tuned in full: set finetune.lora_rank=0.")
    if finetune.lora_rank > 0 and importlib.util.find_spec("peft") is None:
        raise ZooError(f"finetune.lora_rank={finetune.lora_rank} needs peft: pip install -e \".[lora]\" (or "
                       f"finetune.lora_rank=0 to fine-tune the whole network).")
    if finetune.lora_rank > 0 and finetune.qat:
        raise ZooError("finetune.lora_rank>0 and finetune.qat=true: LoRA adapters are not quantisation-aware; choose "
                       "one.")
    if finetune.qat and p.quantize is None:
        raise ZooError("finetune.qat=true trains the pruned network for the INT8 model it ships; it needs "
                       "prune.quantize=int8 (or finetune.qat=false).")
    unknown = [o for o in p.objectives if o not in OBJECTIVES or (o in ("val/acc1", "val/acc5", "val/ppl")
                                                                   and o not in task_metrics)]
    if unknown or not p.objectives:
        raise ZooError(f"prune.objectives={list(p.objectives)}: give one or more of {', '.join(OBJECTIVES)} (what a "
                       f"job returns to a sweeper, in the order of hydra.sweeper.direction).")
    if p.workload not in WORKLOADS:
        raise ZooError(f"prune.workload={p.workload!r}; allowed: forward (the whole forward pass) or decode "
                       "(one recurrent decode step of a language model such as RetNet).")
    if p.export_dynamic_size and (p.export is None or task == "language_model"):
        raise ZooError("prune.export_dynamic_size=true makes an exported image model take any height and width; "
                       + ("it goes with prune.export=onnx or torch_export." if p.export is None else
                          f"{model} takes no images: set prune.export_dynamic_size=false (the batch axis is always "
                          "dynamic)."))
    if p.export is not None:
        from ..deploy.export import FORMATS, _require

        if p.export not in FORMATS:
            raise ZooError(f"prune.export={p.export!r}; allowed: null, {', '.join(FORMATS)}.")
        if p.export == "onnx":
            _require("onnx", "onnxscript", "onnxruntime")


WORKLOADS = ("forward", "decode")


def deploy_requests(p: PruneSettings) -> list[tuple[str, str, str]]:
    """(kind, value, the setting that asks for it) of everything this run will deploy the model to: its workload, its
    quantisation, each runtime it is timed in (planned and reported; an INT8 runtime counts as its float runtime plus
    the quantisation) and its export format."""
    requests = [("workload", p.workload, "prune.workload")]
    if p.quantize is not None:
        requests.append(("quantize", p.quantize, "prune.quantize"))
    for runtime in dict.fromkeys([planning_runtime(p), *reported_runtimes(p)]):
        key = "prune.runtime" if runtime == planning_runtime(p) else "prune.runtime_report"
        requests.append(("runtime", runtime.removesuffix("_int8"), key))
    if p.export is not None:
        requests.append(("export", p.export, "prune.export"))
    return requests


def check_capabilities(p: PruneSettings, name: str, family: Any, options: dict[str, Any] | None) -> None:
    """Everything the run deploys model `name` to against its family's declared capabilities
    (:attr:`zoo.models.registry.Family.deploy`): refused here, with the family's reason, rather than after the
    baseline, table, search and fine-tune. `options`: the model's builder options, None where given weights decide
    them (a checkpoint, published weights: checked when the model is built)."""
    for kind, value, key in deploy_requests(p):
        if value not in family.deploy[kind]:
            continue  # a value the code does not know: its own check names the allowed ones (all known are declared)
        why = family.refusal(kind, value, options)
        if why is not None:
            raise ZooError(f"{key}={value} is not possible for model={name} (the {family.name} family): {why}.")


def check_folders(cfg: Any) -> None:
    """Every folder the run writes into can be written now: its outputs and baselines (``paths.log_dir``), its caches
    (``prune.cache_dir``, by default under ``paths.log_dir``) and the latency cache with the device timing lock
    (``$DEPTHZOO_CACHE``, by default ``~/.cache/depthzoo``)."""
    from ..files import check_writable
    from ..latency.cache import CACHE_ENV, cache_root

    check_writable(cfg.paths.log_dir, "paths.log_dir")
    check_writable(cfg.prune.cache_dir or Path(cfg.paths.log_dir) / "cache",
                   "prune.cache_dir" if cfg.prune.cache_dir else "paths.log_dir (its cache folder)")
    check_writable(cache_root(), f"${CACHE_ENV} (the latency cache and the device timing lock)")


def check_runtimes(p: PruneSettings, device: torch.device, dtype: torch.dtype) -> None:
    """``prune.runtime`` and every ``prune.runtime_report`` runtime known and usable here (else ZooError with the
    install command), before any work; ``prune.table.runtime`` is not a second way to say it."""
    from ..latency.runtime import check_runtime

    if p.quantize is not None:
        check_quantize(p)
    if "runtime" in (p.table or {}):
        raise ZooError("Set the runtime with prune.runtime (it applies to the table and to every measurement), not "
                       "prune.table.runtime.")
    for key, runtime in [("prune.runtime", planning_runtime(p)),
                         *(("prune.runtime_report" if r in p.runtime_report else "prune.quantize=int8 measures in "
                            "runtime", r) for r in reported_runtimes(p))]:
        try:
            check_runtime(runtime, device, dtype)
        except ZooError as exc:
            raise ZooError(f"{key}={runtime}: {exc}") from None


INT8_PAIRS = {  # prune.runtime -> (its float32 runtime, its INT8 runtime) with prune.quantize=int8
    "onnxruntime": ("onnxruntime", "onnxruntime_int8"), "eager": ("onnxruntime", "onnxruntime_int8"),
    "compile": ("compile", "compile_int8"), "tensorrt": ("tensorrt", "tensorrt_int8"),
}


def planning_runtime(p: Any) -> str:
    """The runtime the table is built, the plan searched and the networks measured in: ``prune.runtime``, or its INT8
    form with ``prune.quantize=int8`` (``onnxruntime_int8``, ``compile_int8`` for ``prune.runtime=compile``,
    ``tensorrt_int8`` for ``prune.runtime=tensorrt``); ``prune.int8_table=false`` plans on the float32 table and
    still ships and reports the INT8 network."""
    if p.quantize != "int8":
        return p.runtime
    fp32, int8 = INT8_PAIRS.get(p.runtime, (p.runtime, p.runtime))
    return int8 if p.int8_table else fp32


def reported_runtimes(p: Any) -> list[str]:
    """The runtimes the chosen plan is also measured in: with ``prune.quantize=int8``, the float32 and INT8 forms of
    its runtime (whichever was not planned in), then ``prune.runtime_report``; never the planning runtime twice."""
    int8_pair = list(INT8_PAIRS.get(p.runtime, ())) if p.quantize == "int8" else []
    planned = planning_runtime(p)
    return [r for r in dict.fromkeys([*int8_pair, *p.runtime_report]) if r != planned]


def check_quantize(p: Any) -> None:
    """``prune.quantize``: int8, in a runtime with an INT8 path (onnxruntime's static QDQ or torch.compile with PT2E on
    the CPU, TensorRT's explicit quantisation on a GPU)."""
    from ..deploy.quantization import QUANTIZE, QuantizationError, check_pt2e_available, check_quantization_available

    if p.quantize not in QUANTIZE:
        raise ZooError(f"prune.quantize={p.quantize!r}; allowed: null, {', '.join(QUANTIZE)}.")
    if p.runtime not in INT8_PAIRS:
        raise ZooError(f"prune.quantize=int8 plans against INT8 latencies in onnxruntime (static QDQ) or torch.compile "
                       f"(PT2E) on the CPU, or TensorRT on a GPU; prune.runtime={p.runtime} has no INT8 path: use "
                       f"prune.runtime={', '.join(r for r in INT8_PAIRS if r != 'eager')}.")
    try:
        check_pt2e_available() if p.runtime == "compile" else check_quantization_available()
    except QuantizationError as error:
        raise ZooError(f"prune.quantize=int8: {error}") from None


def int8_format(p: Any) -> tuple[str, str | None]:
    """How the INT8 network of a ``prune.quantize=int8`` run is written: (export format, INT8 scheme of an ONNX file).
    ``torch_export`` (PT2E, for torch.compile) with ``prune.runtime=compile``; else ``onnx`` in TensorRT's QDQ form
    with ``prune.runtime=tensorrt``, in onnxruntime's otherwise."""
    if p.runtime == "compile":
        return "torch_export", None
    return "onnx", "tensorrt" if p.runtime == "tensorrt" else "onnxruntime"


def check_baseline_source(source: bool | str, model: str, tag: str | None) -> None:
    """``checkpoint=`` names weights for `model`: a depthzoo checkpoint of it, a timm-format file, a hub id or true
    (the weights of `tag`, else its default tag); `source` as :func:`~zoo.jobs.model_spec.weights_arg` gives it.
    Checked before any work; a hub id is resolved when the baseline is built."""
    from ..training import state as ckpt
    from ..weights.checkpoint import read_checkpoint_meta
    from ..weights.pretrained import WEIGHT_SUFFIXES, check_source, is_local
    from ..weights.tags import resolve_tag

    if source is True and not model.startswith("hf/"):  # (a transformers folder's weights are its own)
        resolve_tag(model, tag)  # an architecture without published weights fails here
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
        if name is not None and name != model:
            raise ZooError(f"checkpoint={source} holds model {name!r}, but model={model}. Use "
                           f"model={name} or a checkpoint of {model}.")


def _settings(kind: type, values: Any, key: str) -> Any:
    """A settings dataclass from a ``prune.table``/``prune.measure`` mapping; an unknown key is a clear error."""
    from dataclasses import fields

    allowed = [f.name for f in fields(kind)]
    unknown = sorted(set(values or {}) - set(allowed))
    if unknown:
        raise ZooError(f"{key} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}.")
    return kind(**dict(values or {}))


def table_settings(p: PruneSettings, runtime: str | None = None) -> Any:
    """The latency table's settings from ``prune.table`` (defaults where unset) in `runtime` (default the planning
    runtime, :func:`planning_runtime`; ``prune.table.runtime`` is refused by :func:`check_runtimes`)."""
    from dataclasses import replace

    from ..latency import TableSettings

    return replace(_settings(TableSettings, p.table, "prune.table"), runtime=runtime or planning_runtime(p))


def measure_settings(p: PruneSettings) -> Any:
    """The final side-by-side timing's settings from ``prune.measure``."""
    from ..latency import NetworkTimingSettings

    return _settings(NetworkTimingSettings, p.measure, "prune.measure")


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """A plan from a JSON file, checked for its form (not yet against a model); raises PlanError."""
    from ..errors import PlanError
    from ..pruning.surgery import _validate_plan

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
