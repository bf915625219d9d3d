"""A prune config read once: :func:`read_request` turns the composed config into one typed :class:`PruneRequest`
(the ``prune``/``finetune`` settings as dataclasses, the model's registry entry, family and tag resolved once, and
what they decide) and checks it in one pass, in the order of what can fail, before any work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ZooError
from .prune_config import (
    PRUNE_RANGES,
    FinetuneSettings,
    PruneConfig,
    PruneSettings,
    check_baseline_source,
    check_capabilities,
    check_folders,
    check_prune_choices,
    check_runtimes,
    measure_settings,
    planning_runtime,
    read_plan_file,
    reported_runtimes,
    table_settings,
)


@dataclass(frozen=True)
class PruneRequest:
    """What a prune job was asked for, typed and checked (:func:`read_request`).

    model: the canonical registry name; entry/family: its registry entry and family; tag: ``model.tag`` or the tag
    the given weights carry; device: where latency is measured; planning_runtime/reported_runtimes: where the table
    is built and where the plan is also timed; table/measure: the latency table's and the final timing's settings;
    plan: a given plan (``prune.plan``), read; data_model_cfg: the tag's eval config, which the data transforms
    follow."""

    model: str
    entry: Any
    family: Any
    tag: str | None
    prune: PruneSettings
    finetune: FinetuneSettings
    device: torch.device
    planning_runtime: str
    reported_runtimes: tuple[str, ...]
    table: Any
    measure: Any
    plan: dict[str, Any] | None
    data_model_cfg: dict[str, Any]


def check_vocabulary(vocab: int, tokenizer: str | None, model: str) -> None:
    """The data's token ids (bytes: 256; else the tokenizer's) must index rows of the embedding of the model's own
    weights (`vocab` rows)."""
    from ..training.data import load_tokenizer

    size = 256 if tokenizer in (None, "bytes") else len(load_tokenizer(tokenizer))
    if size > vocab:
        raise ZooError(f"data.tokenizer={tokenizer or 'bytes'} has {size} tokens but {model} embeds {vocab}: ids from "
                       f"{vocab} up would index no row; use the tokenizer the weights were trained with")


def read_request(cfg: Any) -> PruneRequest:
    """The composed prune config as a :class:`PruneRequest`, checked in the order of what can fail, cheapest first
    (raises ZooError, before any work):

    1. every group's keys, choices and ranges, every number finite (the training groups', then ``prune``'s and
       ``finetune``'s); the prune job's own choices;
    2. the files it names: a plan file, the baseline's weights (``checkpoint=``);
    3. what the model's family can be deployed to (workload, quantisation, runtimes, export);
    4. the model's structure: a model whose depth units are discovered must trace and have a unit to remove;
    5. what this machine has: the runtimes and their INT8 paths, writable folders.

    After it, in :func:`zoo.jobs.prune.prune_in`: the latency ceiling (the untrained network's table, before the
    baseline trains), then the baseline."""
    from ..latency.device import resolve_device, resolve_dtype
    from ..models.registry import get_entry, get_family
    from ..weights.tags import pretrained_cfg
    from .model_spec import model_tag, weights_arg
    from .train_config import canonical_model_name, check_ranges, typed, validate

    canonical_model_name(cfg)
    validate(cfg, PruneConfig)  # 1
    check_ranges(cfg, PRUNE_RANGES)
    prune, finetune = typed(cfg.prune, PruneSettings), typed(cfg.finetune, FinetuneSettings)
    entry = get_entry(cfg.model.name)
    family = get_family(entry.family)
    check_prune_choices(prune, finetune, cfg.model.name, entry.task)
    plan = read_plan_file(prune.plan) if prune.plan else None  # 2
    weights = weights_arg(cfg.checkpoint)
    if weights is not False:
        check_baseline_source(weights, cfg.model.name, cfg.model.get("tag"))
    table, measure = table_settings(prune), measure_settings(prune)
    weights_given = weights is not False or weights_arg(cfg.model.get("pretrained")) is not False
    options = dict(cfg.model.get("overrides") or {})
    check_capabilities(prune, cfg.model.name, family, None if weights_given else options)  # 3
    if entry.precheck is not None:  # 4
        image, length = cfg.data.get("image_size"), cfg.data.get("seq_len")
        entry.precheck(options, (3, image, image) if image else (length,) if length else None)
    if "vocab_size" in entry.default_cfg and weights_arg(cfg.model.get("pretrained")) is True:
        check_vocabulary(entry.default_cfg["vocab_size"], cfg.data.get("tokenizer"), cfg.model.name)
    device = resolve_device(prune.device)  # 5
    check_runtimes(prune, device, resolve_dtype(prune.dtype, device))
    check_folders(cfg)
    tag = model_tag(cfg.model, cfg.checkpoint or None)
    return PruneRequest(
        model=cfg.model.name, entry=entry, family=family, tag=tag, data_model_cfg=pretrained_cfg(cfg.model.name, tag),
        prune=prune, finetune=finetune, device=device,
        planning_runtime=planning_runtime(prune), reported_runtimes=tuple(reported_runtimes(prune)), table=table,
        measure=measure, plan=plan)
