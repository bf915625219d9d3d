"""The prune job's fine-tune: the plan applied as a linearised network with fading activations, trained (distilling
from the baseline, resumable), then merged."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from ..pruning import surgery
from ..training.engine import Callback
from ..training.settings import OptimConfig, TrainerConfig
from .train_config import typed

_log = logging.getLogger(__name__)


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
             config: dict, heal: bool = True, subdir: str = "finetune") -> tuple[nn.Module, dict[str, float]]:
    """Apply the plan as a linearised network (healed where ``prune.heal=linear`` and `heal`), fine-tune it
    (distilling from `baseline`, checkpoints in ``output_dir / subdir``), then merge.

    Seeded anew (``trainer.seed``), so the result does not depend on what ran before it in this process (a baseline
    trained now or read from the cache); an interrupted fine-tuning resumes from ``finetune/checkpoints``.
    """
    from ..training import distributed as dist_utils
    from ..training import evaluate, fit, seed_everything

    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    fading = cfg.finetune.linearise_fraction > 0 and cfg.finetune.epochs > 0
    healed = heal_report(cfg, baseline, plan, data) if heal and cfg.prune.heal == "linear" else None
    model = surgery.apply_plan(baseline, {**plan, "merge": False}, inplace=False, blend=fading,
                               **(healed.pop("apply") if healed else {}))
    memory: dict[str, float] = {}
    lora = cfg.finetune.lora_rank > 0 and cfg.finetune.epochs > 0
    if lora:
        adapters = with_lora(model, cfg.finetune.lora_rank, cfg.finetune.lora_alpha)
    if cfg.finetune.epochs > 0:
        optim = replace(typed(cfg.optim, OptimConfig), lr=cfg.finetune.lr or cfg.optim.lr * 0.3, warmup_epochs=0)
        trainer = replace(typed(cfg.trainer, TrainerConfig), max_epochs=cfg.finetune.epochs, resume=None)
        callback = Linearise(model, cfg.finetune.linearise_fraction)
        resume = dist_utils.broadcast_object(resumable(output_dir / subdir) if dist_utils.info().is_main
                                             else None)
        done = fit(model, data, optim, trainer, logger, teacher=baseline,
                   distill_weight=cfg.finetune.distill_weight,
                   distill_temperature=cfg.finetune.distill_temperature, callbacks=[callback],
                   output_dir=output_dir / subdir, config=config, resume_from=resume,
                   resume_hint=" Run the same command again: fine-tuning resumes where it stopped, with the same plan.")
        memory = done.memory
    if lora:
        model.lora_report = {"rank": cfg.finetune.lora_rank, "alpha": cfg.finetune.lora_alpha, **adapters,
                             **merge_lora(model)}
    model = surgery.finalize_merges(model) if cfg.prune.merge else model
    model.finetune_memory = memory  # peak training memory of the fine-tuning, for results.json
    model.heal_report = healed  # heal=linear: the patches and the one-shot metrics with and without them
    device = next(baseline.parameters()).device
    metrics = evaluate(model.to(device).eval(), data.val, task=data.task)
    return model, metrics


def with_lora(model: nn.Module, rank: int, alpha: float) -> dict[str, float]:
    """``finetune.lora_rank``: `model`'s transformers model (``model.lm``) wrapped by peft with LoRA adapters of
    `rank` on every linear layer (its other weights frozen); the trainable and total parameter counts."""
    from peft import LoraConfig, get_peft_model

    model.lm = get_peft_model(model.lm, LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"lora_trainable_params": float(trainable), "lora_total_params": float(sum(p.numel() for p in
                                                                                       model.parameters()))}


def merge_lora(model: nn.Module) -> dict[str, float]:
    """The LoRA adapters multiplied into the weights they adapt and peft's wrapper removed (the model is again the
    transformers model it was, every weight trainable); the largest difference the merge made to the logits on the
    model's example input, relative to their scale (float rounding only)."""
    import torch

    example = model.example_input(2, (16,))
    with torch.no_grad():
        before = model.eval()(example)
        model.lm = model.lm.merge_and_unload()
        after = model(example)
    for param in model.parameters():
        param.requires_grad_(True)
    return {"lora_merge_rel_diff": float((after - before).abs().max() / (before.abs().max() or 1.0))}


def heal_report(cfg: Any, baseline: nn.Module, plan: dict[str, Any], data: Any) -> dict[str, Any]:
    """``prune.heal=linear``: the plan healed on the importance's calibration batches (``prune.calib_batches``; a run
    of removed blocks it cannot heal stays as is, with why), and the one-shot validation metrics of the plan merged,
    healed and not. Returns the report with ``apply``: the arguments that heal the fine-tuned network the same way."""
    import time

    from ..training import distributed as dist_utils
    from ..training import evaluate
    from .plan import calibration_batches
    from .prune_results import metric_view

    device = next(baseline.parameters()).device
    main = dist_utils.info().is_main  # every rank heals with rank 0's batches (each rank reads its own shard)
    calibration = dist_utils.broadcast_object(
        [inputs.cpu() for inputs, _ in calibration_batches(data, cfg.prune.calib_batches)] if main else None)
    calibration = [inputs.to(device) for inputs in calibration]
    apply = {"heal": "linear", "calibration": calibration, "ridge": cfg.prune.heal_ridge, "strict": False}
    started = time.perf_counter()
    healed = surgery.apply_plan(baseline, plan, inplace=False, **apply).eval()
    seconds = time.perf_counter() - started
    unhealed = surgery.apply_plan(baseline, plan, inplace=False).eval()
    one_shot = {name: metric_view(evaluate(net, data.val, task=data.task))
                for name, net in (("healed", healed), ("unhealed", unhealed))}
    _log.info("heal=linear: %d run(s) healed, %d left (%.1f s); one-shot %s", len(healed.zoo_heal),
              len(healed.zoo_unhealed), seconds, {k: v.get("val/acc1", v.get("val/loss")) for k, v in one_shot.items()})
    return {"patches": healed.zoo_heal, "unhealed": healed.zoo_unhealed, "fit_seconds": round(seconds, 3),
            "calibration_batches": len(calibration), "ridge": cfg.prune.heal_ridge, "one_shot": one_shot,
            "apply": apply}


def qat_finetune(cfg: Any, baseline: nn.Module, pruned: nn.Module, data: Any, logger: Any, output_dir: Path,
                 config: dict) -> tuple[nn.Module, dict[str, float]]:
    """``finetune.qat=true``: quantisation-aware training of the pruned network's deploy form (BatchNorm folded)
    for ``finetune.qat_epochs`` (learning rate ``finetune.qat_lr``, else a tenth of the fine-tune's), distilling
    from `baseline`, in float32, logged under ``qat/``, resumable from ``qat/checkpoints``.

    Returns the trained float network (plain layers again, for onnxruntime to quantise) and its validation metrics
    with the INT8 rounding simulated (what the training saw)."""
    from ..deploy.fuse import fuse
    from ..deploy.quantization import prepare_qat, strip_qat
    from ..training import distributed as dist_utils
    from ..training import evaluate, fit, seed_everything
    from ..training.logger import PrefixedLogger
    from .prune_config import int8_format

    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
    device = next(baseline.parameters()).device
    scheme = int8_format(cfg.prune)[1] or "onnxruntime"  # (PT2E's activations are unsigned too)
    model = prepare_qat(fuse(pruned).to(device).train(), scheme)  # fuse works on a copy
    lr = cfg.finetune.qat_lr or (cfg.finetune.lr or cfg.optim.lr * 0.3) * 0.1
    optim = replace(typed(cfg.optim, OptimConfig), lr=lr, warmup_epochs=0)
    trainer = replace(typed(cfg.trainer, TrainerConfig), max_epochs=cfg.finetune.qat_epochs, resume=None,
                      precision="fp32", compile=False)
    resume = dist_utils.broadcast_object(resumable(output_dir / "qat") if dist_utils.info().is_main else None)
    fit(model, data, optim, trainer, PrefixedLogger(logger, "qat"), teacher=baseline,
        distill_weight=cfg.finetune.distill_weight, distill_temperature=cfg.finetune.distill_temperature,
        output_dir=output_dir / "qat", config=config, resume_from=resume,
        resume_hint=" Run the same command again: quantisation-aware training resumes where it stopped.")
    metrics = evaluate(model.eval(), data.val, task=data.task)
    return strip_qat(model), metrics


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
