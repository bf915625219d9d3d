"""The training engine: :func:`fit` trains an already-built model (:mod:`.evaluation` measures one).

Tasks: ``classification`` (cross-entropy, or timm's label-smoothing / soft-target losses with mixup/cutmix;
metrics loss, acc1, acc5 in percent) and ``language_model`` (next-token cross-entropy over ``[B, T, V]`` logits;
metrics loss in nats per token, ppl, tokens_per_s).

Knowledge distillation (`teacher`, `distill_weight` w, `distill_temperature` T):
``loss = (1 - w) * task_loss + w * T^2 * KL(softmax(teacher / T) || softmax(student / T))``, the KL averaged
over samples (classification) or tokens (LM). The teacher runs in eval mode without gradients.

Determinism: on CPU the same seed gives the same weights, and a run resumed from ``last`` (saved at an
epoch end or, after SIGINT/SIGTERM or :meth:`Trainer.request_stop`, after any optimizer step) ends with
the same weights as an uninterrupted run: the state holds the position in the epoch and every RNG state.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, NonFiniteLossError, TrainingInterrupted
from ..latency.device import resolve_device
from ..signals import on_stop_signals
from . import distributed as dist_utils
from . import state as ckpt
from .data import DataBundle, batches_per_epoch
from .evaluation import default_monitor, distill_loss, evaluate
from .resources import autocast, process_peak_memory, reset_peak_memory
from .settings import OptimConfig, TrainerConfig

_log = logging.getLogger(__name__)


class Callback:
    """Hooks into :func:`fit`; override what you need. ``trainer.progress`` runs from 0 to 1 over training."""

    def on_train_start(self, trainer: Trainer) -> None:
        pass

    def on_step_end(self, trainer: Trainer) -> None:
        """After every optimizer update (``trainer.step`` updates done)."""

    def on_epoch_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        pass


@dataclass
class FitResult:
    """What :func:`fit` returns: final metrics and where the checkpoints are."""

    metrics: dict[str, float]
    last_checkpoint: Path | None
    best_checkpoint: Path | None
    epochs: int
    steps: int
    train_time_s: float
    history: list[dict[str, float]] = field(default_factory=list)
    monitor: str = ""
    best_value: float | None = None
    best_epoch: int | None = None
    memory: dict[str, Any] = field(default_factory=dict)  # peak memory of the training (process_peak_memory)
    converged: bool = False  # stopped by trainer.patience: the monitor stopped improving


class Trainer:
    """One training run of an already-built model; see :func:`fit` for the arguments."""

    def __init__(self, model: nn.Module, data: DataBundle, optim_cfg: OptimConfig, trainer_cfg: TrainerConfig,
                 logger: Any = None, *, teacher: nn.Module | None = None, distill_weight: float = 0.0,
                 distill_temperature: float = 2.0, callbacks: Sequence[Callback] = (),
                 output_dir: str | Path | None = None, config: dict | None = None, resume_hint: str | None = None):
        from .logger import NullLogger

        self.cfg, self.optim_cfg, self.data = trainer_cfg, optim_cfg, data
        self.logger = logger or NullLogger()
        self.callbacks = list(callbacks)
        self.config = config or {}
        self.resume_hint = resume_hint
        self.dist = dist_utils.info()
        if trainer_cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=cpu.")
        self.device = resolve_device(trainer_cfg.device, self.dist.local_rank, warn_fallback=False)
        if trainer_cfg.precision == "fp16" and self.device.type != "cuda":
            raise ConfigError("trainer.precision=fp16 needs CUDA; on CPU use bf16 or fp32.")
        if self.device.type == "cpu":
            torch.set_flush_denormal(True)  # denormal floats slow CPU kernels several-fold
        self.task = data.task
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.model = model.to(self.device)
        if trainer_cfg.channels_last and self.task == "classification":
            self.model = self.model.to(memory_format=torch.channels_last)
        if getattr(trainer_cfg, "grad_checkpointing", False):
            if not hasattr(self.model, "set_grad_checkpointing"):
                raise ConfigError(f"trainer.grad_checkpointing=true: {type(self.model).__name__} has no "
                                  f"set_grad_checkpointing; every zoo model has.")
            self.model.set_grad_checkpointing(trainer_cfg.grad_checkpointing)  # true or a share of the blocks
        self.teacher = teacher.to(self.device).eval() if teacher is not None else None  # run under no_grad
        if not 0.0 <= distill_weight <= 1.0:
            raise ConfigError(f"distill_weight={distill_weight} must lie in [0, 1].")
        self.distill_weight, self.distill_temperature = distill_weight, distill_temperature
        self.batches_per_epoch = self._batches_per_epoch()
        self.updates_per_epoch = math.ceil(self.batches_per_epoch / trainer_cfg.accum_steps)
        self.total_updates = self.updates_per_epoch * trainer_cfg.max_epochs
        self._build_loss()
        self._build_optimizer()
        self.ema = None
        if trainer_cfg.ema:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=trainer_cfg.ema_decay)
        self.scaler = torch.amp.GradScaler("cuda") if trainer_cfg.precision == "fp16" else None
        self.train_model = self._wrap(self.model)
        self.monitor, self.monitor_mode = default_monitor(self.task)
        self.monitor = trainer_cfg.monitor or self.monitor
        self.monitor_mode = trainer_cfg.monitor_mode or self.monitor_mode
        self.epoch, self.batch_in_epoch, self.step = 0, 0, 0
        self.best_value: float | None = None
        self.best_epoch: int | None = None
        self.history: list[dict[str, float]] = []
        self.metrics: dict[str, float] = {}
        self.train_time_s = 0.0
        self._stop_signal: int | None = None

    # ------------------------------------------------------------------------------------------ setup
    def _batches_per_epoch(self) -> int:
        batches = batches_per_epoch(self.data)
        limit = self.cfg.limit_train_batches
        return min(batches, limit) if limit else batches

    def _build_loss(self) -> None:
        from timm.data import Mixup
        from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

        cfg = self.cfg
        self.mixup = None
        if self.task == "classification" and (cfg.mixup_alpha > 0 or cfg.cutmix_alpha > 0):
            self.mixup = Mixup(mixup_alpha=cfg.mixup_alpha, cutmix_alpha=cfg.cutmix_alpha,
                               label_smoothing=cfg.label_smoothing, num_classes=self.data.num_classes)
            self.criterion = SoftTargetCrossEntropy()
        elif cfg.label_smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(smoothing=cfg.label_smoothing)
        else:
            self.criterion = nn.CrossEntropyLoss()

    def _build_optimizer(self) -> None:
        from timm.optim import create_optimizer_v2
        from timm.scheduler import create_scheduler_v2

        oc = self.optim_cfg
        try:
            self.optimizer = create_optimizer_v2(self.model, opt=oc.opt, lr=oc.lr, weight_decay=oc.weight_decay,
                                                 momentum=oc.momentum)
        except (AssertionError, ValueError) as exc:
            raise ConfigError(f"Cannot create the {oc.opt} optimizer with lr={oc.lr}, weight_decay={oc.weight_decay}, "
                              f"momentum={oc.momentum}: {exc}.") from None
        self.scheduler = None
        if oc.sched not in ("none", "constant"):
            try:
                self.scheduler, _ = create_scheduler_v2(
                    self.optimizer, sched=oc.sched, num_epochs=self.cfg.max_epochs, warmup_epochs=oc.warmup_epochs,
                    warmup_lr=oc.warmup_lr, min_lr=oc.min_lr, step_on_epochs=False,
                    updates_per_epoch=self.updates_per_epoch, plateau_mode=self.cfg.monitor_mode or "max",
                )
            except (AssertionError, ValueError) as exc:
                raise ConfigError(f"optim.sched={oc.sched!r} is not a timm scheduler ({exc}). Choices include "
                                  f"cosine, step, multistep, plateau, poly, tanh, none.") from exc

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        if self.cfg.compile:
            model = torch.compile(model)
        return model

    # ---------------------------------------------------------------------------------- state & resume
    @property
    def progress(self) -> float:
        return self.step / max(self.total_updates, 1)

    def request_stop(self, signum: int = signal.SIGINT) -> None:
        """Ask the loop to save ``last`` after the current optimizer step and raise TrainingInterrupted."""
        self._stop_signal = signum

    def state_dict(self) -> dict[str, Any]:
        return {
            "model_name": getattr(self.model, "zoo_name", None),
            "overrides": dict(getattr(self.model, "zoo_overrides", {})),
            "plan": getattr(self.model, "zoo_plan", None),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "ema": self.ema.state_dict() if self.ema else None,
            "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "step": self.step,
            "best_value": self.best_value, "best_epoch": self.best_epoch, "history": self.history,
            "metrics": self.metrics, "train_time_s": self.train_time_s, "rng": ckpt.rng_state(),
            "config": self.config,
        }

    def resume(self, path: str | Path) -> None:
        """Restore everything from a ``last.state.pt`` (the model must be the checkpoint's model)."""
        state = ckpt.load_state(path)
        ckpt.check_same_model(state, self.model, path)
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as exc:
            raise ckpt.CheckpointError(f"Weights in {path} do not fit this model: {exc}") from exc
        self.optimizer.load_state_dict(state["optimizer"])
        for obj, key in ((self.scheduler, "scheduler"), (self.scaler, "scaler"), (self.ema, "ema")):
            if obj is not None and state.get(key) is not None:
                obj.load_state_dict(state[key])
        for key in ("epoch", "batch_in_epoch", "step", "best_value", "best_epoch", "history", "metrics",
                    "train_time_s"):
            setattr(self, key, state[key])
        ckpt.set_rng_state(state["rng"])
        _log.info("Resumed from %s at epoch %d, batch %d, step %d.", path, self.epoch, self.batch_in_epoch, self.step)

    def _checkpoint_dir(self) -> Path | None:
        if self.output_dir is None or not self.cfg.save_checkpoints:
            return None
        return ckpt.checkpoint_dir(self.output_dir)

    def save(self, best: bool = False) -> Path | None:
        """Write ``last`` (weights + state) and, with `best`, ``best`` weights; rank 0 only. The state is written
        last and ``best`` renamed into place after it (see :mod:`zoo.training.state`)."""
        directory = self._checkpoint_dir()
        if directory is None or not self.dist.is_main:
            return None
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise NonFiniteLossError(
                f"The weights hold NaN/inf at epoch {self.epoch + 1}, step {self.step}; they were not saved, so "
                f"{directory / 'last.safetensors'} still holds the last good checkpoint. Lower optim.lr or set "
                f"optim.clip_grad."
            )
        meta = {"epoch": self.epoch, "step": self.step, "metrics": self.metrics, "config": self.config,
                "task": self.task}
        last = ckpt.save_weights(self.model, directory / "last.safetensors", **meta)
        if best:
            ckpt.save_weights(self.model, directory / ckpt.PENDING_BEST, **meta)
        ckpt.save_state(self.state_dict(), directory / f"last{ckpt.STATE_SUFFIX}")  # the commit point
        ckpt.settle_best(directory, self.best_epoch)
        return last

    # ------------------------------------------------------------------------------------------- loop
    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with autocast(self.device, self.cfg.precision):
            logits = self.train_model(inputs)
            if self.task == "language_model":
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
            else:
                loss = self.criterion(logits, targets)
            if self.teacher is not None and self.distill_weight > 0:
                with torch.no_grad():
                    teacher_logits = self.teacher(inputs)
                kd = distill_loss(logits, teacher_logits, self.distill_temperature)
                loss = (1.0 - self.distill_weight) * loss + self.distill_weight * kd
        return loss

    def _optimizer_step(self) -> None:
        cfg = self.optim_cfg
        if self.scaler is not None:
            if cfg.clip_grad:
                self.scaler.unscale_(self.optimizer)
        if cfg.clip_grad:
            from timm.utils import dispatch_clip_grad

            dispatch_clip_grad(self.model.parameters(), cfg.clip_grad, mode=cfg.clip_mode)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=self.step)
        if self.ema is not None:
            self.ema.update(self.model, step=self.step)

    def _check_finite(self, loss_sum: torch.Tensor) -> None:
        bad = not bool(torch.isfinite(loss_sum).item())
        if dist_utils.any_rank(bad, self.device):
            last = self._checkpoint_dir()
            kept = f"The last good checkpoint is kept: {last / 'last.safetensors'}." if last and (
                last / "last.safetensors").exists() else "No checkpoint had been written yet."
            raise NonFiniteLossError(
                f"The training loss became {loss_sum.item()} at epoch {self.epoch + 1}, step {self.step}; training "
                f"stopped without saving the broken weights. {kept} Lower optim.lr (now {self.optim_cfg.lr}), set "
                f"optim.clip_grad, or use trainer.precision=fp32."
            )

    def _stop_requested(self) -> bool:
        if not self.dist.enabled:
            return self._stop_signal is not None
        return dist_utils.any_rank(self._stop_signal is not None, self.device)

    def _interrupt(self) -> None:
        signum = self._stop_signal or signal.SIGTERM
        path = self.save()
        hint = ""
        if path is not None:
            hint = self.resume_hint or (f" Resume with trainer.resume=auto hydra.run.dir={self.output_dir}.")
        raise TrainingInterrupted(signum, str(path) if path else None, hint)

    def train_one_epoch(self) -> dict[str, float]:
        """Train from ``batch_in_epoch`` to the end of epoch ``epoch``; returns train metrics."""
        cfg = self.cfg
        self.train_model.train()
        self.data.sampler.set_epoch(self.epoch, start=self.batch_in_epoch * self.data.train.batch_size)
        check_every = 1 if self.device.type == "cpu" else cfg.log_every
        loss_sum = torch.zeros((), device=self.device)
        window_loss, window_batches, window_start = torch.zeros((), device=self.device), 0, time.perf_counter()
        batches, samples, start = 0, 0, time.perf_counter()
        bar = self._progress_bar()
        for inputs, targets in self.data.train:
            index = self.batch_in_epoch
            if index >= self.batches_per_epoch:
                break
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            if cfg.channels_last and inputs.dim() == 4:
                inputs = inputs.contiguous(memory_format=torch.channels_last)
            if self.mixup is not None:
                inputs, targets = self.mixup(inputs, targets)
            update = (index + 1) % cfg.accum_steps == 0 or index + 1 == self.batches_per_epoch
            sync = contextlib.nullcontext() if update or not self.dist.enabled else self.train_model.no_sync()
            with sync:
                loss = self._loss(inputs, targets)
                scaled = loss / cfg.accum_steps
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            detached = loss.detach()
            loss_sum += detached
            window_loss += detached
            batches += 1
            window_batches += 1
            samples += inputs.shape[0] * (inputs.shape[1] if self.task == "language_model" else 1)
            self.batch_in_epoch += 1
            if bar is not None:
                bar.update(1)
            if not update:
                continue
            if self.step % check_every == 0 or self._stop_signal is not None:
                self._check_finite(window_loss)
            self._optimizer_step()
            for callback in self.callbacks:
                callback.on_step_end(self)
            if self.step % cfg.log_every == 0:
                self._log_window(window_loss / window_batches, window_batches, window_start, bar)
                window_loss, window_batches, window_start = torch.zeros((), device=self.device), 0, time.perf_counter()
            if self._stop_requested():
                if bar is not None:
                    bar.close()
                self._interrupt()
        if bar is not None:
            bar.close()
        self._check_finite(loss_sum)
        elapsed = time.perf_counter() - start
        totals = dist_utils.all_reduce_sum(torch.stack([loss_sum.double(), torch.tensor(batches, dtype=torch.float64,
                                                        device=self.device)]))
        rate = samples * self.dist.world / max(elapsed, 1e-9)
        unit = "tokens_per_s" if self.task == "language_model" else "samples_per_s"
        return {"train/loss": (totals[0] / totals[1].clamp(min=1)).item(), f"train/{unit}": rate,
                "train/epoch_time_s": elapsed, "train/lr": self.optimizer.param_groups[0]["lr"]}

    def _progress_bar(self) -> Any:
        """A tqdm bar on a terminal only: redirected output gets the one summary line per epoch instead."""
        if not (self.cfg.progress and self.dist.is_main and sys.stderr.isatty()):
            return None
        from tqdm import tqdm

        return tqdm(total=self.batches_per_epoch, initial=self.batch_in_epoch, leave=False, dynamic_ncols=True,
                    desc=f"epoch {self.epoch + 1}/{self.cfg.max_epochs}", unit="batch", mininterval=0.5)

    def _log_window(self, mean_loss: torch.Tensor, batches: int, start: float, bar: Any) -> None:
        value = mean_loss.item()
        rate = batches * self.data.train.batch_size / max(time.perf_counter() - start, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        self.logger.log({"train/loss_step": value, "train/lr": lr, "train/batches_per_s": rate /
                         self.data.train.batch_size, "trainer/epoch": self.epoch + self.batch_in_epoch /
                         max(self.batches_per_epoch, 1)}, step=self.step)
        if bar is not None:
            bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}", refresh=False)

    def validate(self) -> dict[str, float]:
        kwargs = {"device": self.device, "precision": self.cfg.precision, "channels_last": self.cfg.channels_last,
                  "limit_batches": self.cfg.limit_val_batches}
        metrics = {f"val/{k}": v for k, v in evaluate(self.model, self.data.val, self.task, **kwargs).items()}
        if self.ema is not None:
            ema_metrics = evaluate(self.ema.module, self.data.val, self.task, **kwargs)
            metrics.update({f"val_ema/{k}": v for k, v in ema_metrics.items()})
        return metrics

    def _is_better(self, value: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value > self.best_value if self.monitor_mode == "max" else value < self.best_value

    def _summary_line(self, metrics: dict[str, float]) -> str:
        parts = [f"epoch {self.epoch}/{self.cfg.max_epochs}", f"train loss {metrics['train/loss']:.4f}"]
        for key, fmt in (("val/loss", "val loss {:.4f}"), ("val/acc1", "acc1 {:.2f}"), ("val/acc5", "acc5 {:.2f}"),
                         ("val/ppl", "ppl {:.3f}"), ("val/bpb", "bpb {:.3f}"), ("val_ema/acc1", "ema acc1 {:.2f}"),
                         ("train/samples_per_s", "{:.0f} samples/s"), ("train/tokens_per_s", "{:.0f} tokens/s"),
                         ("train/epoch_time_s", "{:.1f} s")):
            if key in metrics:
                parts.append(fmt.format(metrics[key]))
        return " | ".join(parts)

    def _end_epoch(self, train_metrics: dict[str, float]) -> None:
        final = self.epoch + 1 == self.cfg.max_epochs
        metrics = dict(train_metrics)
        if final or (self.cfg.eval_every and (self.epoch + 1) % self.cfg.eval_every == 0):
            metrics.update(self.validate())
        if self.scheduler is not None:
            self.scheduler.step(self.epoch + 1, metrics.get(self.monitor))
        self.epoch += 1
        self.batch_in_epoch = 0
        metrics["trainer/epoch"] = self.epoch
        improved = self._is_better(metrics.get(self.monitor))
        if improved:
            self.best_value, self.best_epoch = metrics[self.monitor], self.epoch
        self.metrics = {k: v for k, v in metrics.items() if k.startswith("val")} or self.metrics
        self.history.append(metrics)
        self.logger.log(metrics, step=self.step)
        if self.dist.is_main:
            _log.info(self._summary_line(metrics))
        self.save(best=improved)
        for callback in self.callbacks:
            callback.on_epoch_end(self, metrics)

    @contextlib.contextmanager
    def _signals_saved(self):
        """While training, SIGINT/SIGTERM request a save of ``last`` and a clean stop (a second SIGINT aborts)."""

        def handle(signum, frame):
            if self._stop_signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self._stop_signal = signum
            _log.warning("Signal %d received: saving `last` after this step, then stopping.", signum)

        with on_stop_signals(handle):
            yield

    def converged(self) -> bool:
        """``trainer.patience`` epochs have passed since the monitor last improved (a validated epoch each)."""
        patience = self.cfg.patience
        return bool(patience) and self.best_epoch is not None and self.epoch - self.best_epoch >= patience

    def fit(self, resume_from: str | Path | None = None) -> FitResult:
        if resume_from is not None:
            self.resume(resume_from)
        if self._checkpoint_dir() is not None and self.dist.is_main:
            ckpt.remove_stale_temps(self._checkpoint_dir())
            ckpt.settle_best(self._checkpoint_dir(), self.best_epoch)
        for callback in self.callbacks:
            callback.on_train_start(self)
        memory_scope = reset_peak_memory(self.device)
        with self._signals_saved():
            while self.epoch < self.cfg.max_epochs and not self.converged():
                start = time.perf_counter()
                train_metrics = self.train_one_epoch()
                self.train_time_s += time.perf_counter() - start
                self._end_epoch(train_metrics)
                if self._stop_requested():
                    self._interrupt()
        if self.converged() and self.dist.is_main:
            _log.info("Converged: %s has not improved for %d epochs (best %.4f at epoch %d); stopped at epoch %d of "
                      "%d.",
                      self.monitor, self.cfg.patience, self.best_value, self.best_epoch, self.epoch,
                      self.cfg.max_epochs)
        directory = self._checkpoint_dir()
        last = directory / "last.safetensors" if directory else None
        best = directory / "best.safetensors" if directory and (directory / "best.safetensors").exists() else None
        memory = {**{k: round(v, 1) for k, v in process_peak_memory(self.device).items()}, "scope": memory_scope}
        self.logger.summary({**self.metrics, "best/" + self.monitor: self.best_value, "best/epoch": self.best_epoch,
                             "trainer/steps": self.step, "train_time_s": self.train_time_s,
                             **{f"memory/{k}": v for k, v in memory.items()}})
        if best is not None:
            self.logger.log_checkpoint(best, aliases=["best", f"epoch-{self.best_epoch}"])
        return FitResult(dict(self.metrics), last, best, self.epoch, self.step, self.train_time_s, list(self.history),
                         self.monitor, self.best_value, self.best_epoch, memory, self.converged())


def fit(model: nn.Module, data: DataBundle, optim_cfg: OptimConfig, trainer_cfg: TrainerConfig, logger: Any = None, *,
        teacher: nn.Module | None = None, distill_weight: float = 0.0, distill_temperature: float = 2.0,
        callbacks: Sequence[Callback] = (), output_dir: str | Path | None = None, config: dict | None = None,
        resume_from: str | Path | None = None, resume_hint: str | None = None) -> FitResult:
    """Train an already-built zoo model on `data` (from :func:`zoo.training.build_loaders`).

    `optim_cfg`/`trainer_cfg`: :class:`~zoo.training.settings.OptimConfig` and
    :class:`~zoo.training.settings.TrainerConfig` (the ``optim`` and ``trainer`` groups' schemas). `logger`: a
    :class:`~zoo.training.logger.NullLogger`-like object (None: no logging).
    `teacher`/`distill_weight`/`distill_temperature`: knowledge distillation (module docstring).
    `callbacks`: :class:`Callback` hooks. `output_dir`: checkpoints go to ``<output_dir>/checkpoints``
    (None: no checkpoints). `config`: stored in checkpoints. `resume_from`: a ``last.state.pt``. `resume_hint`: what
    the interruption's message tells the user to do (default: ``trainer.resume=auto`` with this run directory).
    Returns a :class:`FitResult` (final val metrics, ``last``/``best`` paths, epochs, steps, time).
    Raises NonFiniteLossError on a NaN/inf loss and TrainingInterrupted after SIGINT/SIGTERM (``last`` saved).
    """
    trainer = Trainer(model, data, optim_cfg, trainer_cfg, logger, teacher=teacher, distill_weight=distill_weight,
                      distill_temperature=distill_temperature, callbacks=callbacks, output_dir=output_dir,
                      config=config, resume_hint=resume_hint)
    return trainer.fit(resume_from=resume_from)
