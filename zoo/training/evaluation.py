"""Measuring a model: :func:`evaluate` (loss, acc1/acc5 or perplexity, reduced over torchrun ranks), the monitored
metric of a task (:func:`default_monitor`) and the distillation loss the engine trains with (:func:`distill_loss`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from . import distributed as dist_utils
from .resources import autocast

_log = logging.getLogger(__name__)


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(teacher || student)`` on logits softened by T, averaged over rows (samples or tokens)."""
    vocab = student.shape[-1]
    log_s = F.log_softmax(student.reshape(-1, vocab).float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher.reshape(-1, vocab).float() / temperature, dim=-1)
    return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * temperature**2


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, task: str, device: torch.device | str | None = None,
             precision: str = "fp32", channels_last: bool = False,
             limit_batches: int | None = None) -> dict[str, float]:
    """Metrics of `model` on `loader`, summed over all ranks.

    classification: ``loss``, ``acc1``, ``acc5`` (percent); language_model: ``loss`` (nats/token), ``ppl``, ``bpb``
    (bits per byte of text, from the data set's ``bytes_per_token``), ``tokens_per_s``.
    """
    from timm.utils import accuracy

    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, top1, top5, count
    start = time.perf_counter()
    for index, (inputs, targets) in enumerate(loader):
        if limit_batches is not None and index >= limit_batches:
            break
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        with autocast(device, precision):
            logits = model(inputs)
        logits = logits.float()
        if task == "language_model":
            count = targets.numel()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
            totals += torch.stack([loss.double(), loss.new_zeros(()).double(), loss.new_zeros(()).double(),
                                   torch.tensor(count, dtype=torch.float64, device=device)])
        else:
            count = targets.shape[0]
            loss = F.cross_entropy(logits, targets, reduction="sum")
            top1, top5 = accuracy(logits, targets, topk=(1, min(5, logits.shape[-1])))
            totals += torch.tensor([loss.item(), top1.item() * count / 100, top5.item() * count / 100, count],
                                   dtype=torch.float64, device=device)
    elapsed = time.perf_counter() - start
    model.train(was_training)
    loss_sum, top1, top5, count = dist_utils.all_reduce_sum(totals).tolist()
    count = max(count, 1.0)
    if task == "language_model":
        loss = loss_sum / count
        per_token = getattr(getattr(loader, "dataset", None), "bytes_per_token", 1.0)
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "bpb": loss / math.log(2) / per_token,
                "tokens_per_s": count / max(elapsed, 1e-9)}
    return {"loss": loss_sum / count, "acc1": 100.0 * top1 / count, "acc5": 100.0 * top5 / count}


def default_monitor(task: str) -> tuple[str, str]:
    """The metric that picks ``best`` (and that train.py returns to sweepers) and its direction."""
    return ("val/acc1", "max") if task == "classification" else ("val/loss", "min")
