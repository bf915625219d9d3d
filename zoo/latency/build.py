"""Building a latency table (:func:`build_table`): capture each segment's inputs in one forward, key every
(segment, variant) record and the fixed part, time the records the cache lacks (in context, or isolated in
rounds), merge them into the cache file and assemble the :class:`~zoo.latency.table.LatencyTable`.

Other workloads: ``forward_kwargs`` and ``example_input`` change the network call the inputs are captured from,
and ``workload`` names it in the cache key. For a RetNet recurrent decode step, for instance::

    state = model.init_state(batch)  # or a state after a prompt
    build_table(model, batch_size=batch, input_size=(1,), workload="decode",
                forward_kwargs={"mode": "recurrent", "state": state})

measures every retention/FFN sub-layer on its one-token input with the recurrent state it gets in that call.
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from filelock import Timeout
from torch import nn

from ..errors import ZooError
from ..pruning.capture import Capture, capture_segments, describe, replay_model
from ..pruning.surgery import Segment, build_segment, segments
from .cache import LatencyCache, LatencyCacheWarning, device_lock
from .device import resolve_device, resolve_dtype, timing_context
from .measure import Bench, call_peak_memory, check_clock, measured_form, prepare
from .runtime import check_runtime
from .settings import FIXED, OVERHEAD, WHOLE, TableSettings, condition_key, record_key
from .table import LatencyTable, variant_label
from .timing import Pending, choose_cuda_timing, context_overhead_record, measure_in_context, measure_rounds

logger = logging.getLogger("zoo.latency")


def normalise_input_size(model: nn.Module, input_size: int | Sequence[int] | None) -> tuple[int, ...]:
    """Per-sample input size: an int sets the spatial size (CNNs: C x n x n) or the sequence length."""
    default = tuple(model.default_cfg["input_size"])
    if input_size is None:
        return default
    allowed = ("an int (the image side or sequence length) or a per-sample size such as [3, 224, 224] / [128]; "
               "every value >= 1")
    try:
        values = [input_size] if isinstance(input_size, int) else [int(v) for v in input_size]
    except (TypeError, ValueError):
        raise ZooError(f"input_size={input_size!r} is not a size; give {allowed}.") from None
    if isinstance(input_size, bool) or not values or min(values) < 1 or len(values) > len(default):
        raise ZooError(f"input_size={input_size!r} does not fit {getattr(model, 'zoo_name', 'this model')} "
                       f"(default {list(default)}); give {allowed}.")
    image = getattr(model, "task", "classification") != "language_model"
    if isinstance(input_size, int):
        return (default[0], input_size, input_size) if image else (input_size,)
    size = tuple(values)
    return (default[0], *size) if image and len(size) == 2 else size


def chains_after_previous(segs: Sequence[Segment], captures: Sequence[Capture], runtime: str) -> list[bool]:
    """Per segment, whether its records are timed chained after the previous segment (outside eager): the previous
    segment's output is exactly this one's only input, and neither takes keyword arguments."""
    def plain(cap: Capture) -> bool:
        return not cap.kwargs and len(cap.args) == 1 and torch.is_tensor(cap.args[0])

    return [runtime != "eager" and i > 0 and plain(cap) and plain(captures[i - 1])
            and torch.is_tensor(captures[i - 1].output) and captures[i - 1].output.shape == cap.args[0].shape
            and bool(torch.equal(captures[i - 1].output, cap.args[0])) for i, cap in enumerate(captures)]


def _variant_records(model: nn.Module, segs: Sequence[Segment], captures: Sequence[Capture], device: torch.device,
                     channels_last: bool, merge: bool, settings: TableSettings
                     ) -> tuple[list[dict[frozenset[str], str | None]], list[Pending], list[str | None]]:
    """The cache key of every (segment, variant), the built module behind each distinct key, and per segment the key
    of the prefix its records are measured after (None: measured alone).

    Outside eager a runtime converts tensors into its own layout at the edges of what it runs (channels-last or
    blocked convolution layouts), work the whole network does once but a record timed alone does at its every edge.
    So there a segment's variant is timed chained after the previous segment, intact (``prev -> variant``), and its
    cost is that chain's time less the previous segment's alone: the edge costs cancel.
    """
    def build(seg: Segment, variant: frozenset[str]) -> nn.Module:
        return prepare(measured_form(build_segment(model, seg, variant, merge), settings), device, channels_last)

    chained = chains_after_previous(segs, captures, settings.runtime)
    keys: list[dict[frozenset[str], str | None]] = []
    prefixes: list[str | None] = []
    built: dict[str, Pending] = {}
    for i, (seg, cap) in enumerate(zip(segs, captures)):
        seg_keys: dict[frozenset[str], str | None] = {}
        for variant in seg.variants():
            if seg.name in variant:
                seg_keys[variant] = None
                continue
            module = build(seg, variant)
            relative = [name[len(seg.name) + 1:] for name in variant]
            label = f"{seg.name} [{variant_label(seg, variant)}] {type(module).__name__}"
            if not chained[i]:
                key = record_key("segment", module, relative, cap)
                built.setdefault(key, Pending(key, module, cap, f"{label} {describe(cap.args)}"))
            else:
                chain = nn.Sequential(build(segs[i - 1], frozenset()), module)
                key = record_key("chain", chain, relative, captures[i - 1])
                built.setdefault(key, Pending(key, chain, captures[i - 1], f"{label} after {segs[i - 1].name} "
                                                                             f"{describe(captures[i - 1].args)}"))
            seg_keys[variant] = key
        keys.append(seg_keys)
        prefixes.append(None)
    for i in range(1, len(segs)):  # a chained segment's prefix: the previous segment's intact record alone
        if chained[i]:
            prev, alone = segs[i - 1], build(segs[i - 1], frozenset())
            prefixes[i] = record_key("segment", alone, [], captures[i - 1])
            built.setdefault(prefixes[i], Pending(prefixes[i], alone, captures[i - 1],
                                                  f"{prev.name} [-] alone {describe(captures[i - 1].args)}"))
    return keys, list(built.values()), prefixes


def _fixed_pending(model: nn.Module, segs: Sequence[Segment], captures: Sequence[Capture], example: Any,
                   call_kwargs: Mapping[str, Any], device: torch.device, channels_last: bool, settings: TableSettings
                   ) -> Pending:
    """The record behind the fixed part. Eager: the network with its segments replayed. Other runtimes compile across
    segment boundaries and fold a replayed constant (and drop the stem that feeds it), so a replay network would
    time something else: there the record is the whole intact network, and the fixed part is derived from it
    (:func:`fixed_from_whole`)."""
    name = getattr(model, "zoo_name", type(model).__name__)
    capture = Capture((example,), call_kwargs)
    if settings.runtime == "eager":
        module = prepare(measured_form(replay_model(model, segs, captures), settings), device, channels_last)
        what = f"{name} fixed part (segments replayed)"
        return Pending(record_key(FIXED, module, [], capture), module, capture, what)
    module = prepare(measured_form(copy.deepcopy(model), settings), device, channels_last)
    return Pending(record_key(WHOLE, module, [], capture), module, capture, f"{name} whole network")


STATS = ("median_ms", "mean_ms", "min_ms", "p10_ms")


def record_cost(record: Mapping[str, Any], base: Mapping[str, Any], stat: str) -> float:
    """A record's cost under one statistic: its time less its base (the call overhead, or a chained record's prefix)."""
    return max(0.0, record[stat] - base[stat])


def fixed_from_whole(whole: Mapping[str, Any], intact: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The fixed part of a table outside eager: the whole network's time less every intact segment's cost (`intact`:
    per segment, its cost under each statistic), so the table predicts the intact network as measured and a plan by
    the costs of what it changes."""
    derived = dict(whole)
    for stat in STATS:
        derived[stat] = whole[stat] - sum(costs[stat] for costs in intact)
    derived["what"] = f"{whole.get('what', 'whole network')} less its intact segments"
    derived["peak_mem_bytes"] = None  # the stem and head alone were not run: memory predictions use the records
    return derived


def _table_records(pending: Sequence[Pending], known: Mapping[str, dict[str, Any]],
                   keys: Sequence[Mapping[frozenset[str], str | None]], prefixes: Sequence[str | None], fixed_key: str,
                   settings: TableSettings) -> dict[str, dict[str, Any]]:
    """The table's records from the cache's; outside eager the fixed part is derived (never cached itself)."""
    records = {p.key: known[p.key] for p in pending}
    if settings.runtime != "eager":
        overhead = records[pending[-1].key]
        intact = [{stat: record_cost(records[k[frozenset()]], records[prefix] if prefix else overhead, stat)
                   for stat in STATS} for k, prefix in zip(keys, prefixes)]
        records[fixed_key] = fixed_from_whole(records[fixed_key], intact)
    return records


def _overhead_pending(device: torch.device) -> Pending:
    capture = Capture((torch.zeros(1, device=device),), {})
    return Pending(record_key(OVERHEAD, nn.Identity(), [], capture), nn.Identity(), capture, "nn.Identity call")


def _store(cache: LatencyCache, records: dict[str, dict[str, Any]], known: dict[str, dict[str, Any]]
           ) -> dict[str, dict[str, Any]]:
    """Merge new records into the cache file; on a write failure warn and keep them in memory."""
    if not records:
        return known
    try:
        return cache.merge_write(records)
    except (OSError, Timeout) as exc:
        warnings.warn(f"Could not write latency cache {cache.path} ({exc}); the table is kept in memory only.",
                      LatencyCacheWarning, stacklevel=3)
        return {**known, **records}


def build_table(
    model: nn.Module | str,
    batch_size: int = 1,
    input_size: int | Sequence[int] | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    channels_last: bool = False,
    threads: int | None = None,
    cache_dir: str | None = None,
    settings: TableSettings | None = None,
    merge: bool = True,
    workload: str = "forward",
    forward_kwargs: Mapping[str, Any] | None = None,
    example_input: Any = None,
) -> LatencyTable:
    """Build (or load from the cache) the latency table of `model` (a zoo model or a registered name).

    The model is copied, moved to `device` and put in eval mode; records missing from the cache are measured
    now in interleaved rounds and merged into the cache file. The prediction model: :mod:`zoo.latency.table`; the
    `workload` / `forward_kwargs` / `example_input` hooks: this module's docstring. The deploy runtime the records
    are timed in is ``settings.runtime`` (:mod:`zoo.latency.runtime`; eager by default); one that is missing here is
    refused before any work.
    """
    start = time.perf_counter()
    settings = settings or TableSettings()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ZooError(f"batch_size={batch_size!r} must be an integer >= 1.")
    if threads is not None:
        settings = replace(settings, threads=threads)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    check_clock(settings.clock, dev, settings.threads)
    check_runtime(settings.runtime, dev, torch_dtype)
    if isinstance(model, str):
        from ..weights.create import create_model

        model = create_model(model)
    else:
        model = copy.deepcopy(model)
    model = prepare(model, dev, channels_last)
    size = normalise_input_size(model, input_size)
    example = example_input if example_input is not None else model.example_input(batch_size, size)
    example = example.to(dev)
    if channels_last and example.dim() == 4:
        example = example.contiguous(memory_format=torch.channels_last)
    call_kwargs = dict(forward_kwargs or {})
    segs = segments(model)
    probe: dict[str, Any] = {}
    if settings.entries == "auto":
        in_context = dev.type == "cpu" and settings.runtime == "eager"
        settings = replace(settings, entries="context" if in_context else "isolated")
    if dev.type == "cuda":
        def condition_of(s: TableSettings) -> dict[str, Any]:
            return condition_key(dev, torch_dtype, batch_size, size, channels_last, workload, s)

        with device_lock(dev):
            settings, probe = choose_cuda_timing(model, example, call_kwargs, dev, torch_dtype, channels_last,
                                                 condition_of, cache_dir, settings)
    condition = condition_key(dev, torch_dtype, batch_size, size, channels_last, workload, settings)
    cache = LatencyCache(condition, cache_dir)
    with timing_context(dev, torch_dtype, settings.threads):
        captures = capture_segments(model, segs, example, call_kwargs)
        keys, pending, prefixes = _variant_records(model, segs, captures, dev, channels_last, merge, settings)
        fixed = _fixed_pending(model, segs, captures, example, call_kwargs, dev, channels_last, settings)
        pending += [fixed, _overhead_pending(dev)]
        known = cache.load()
        missing = [p for p in pending if p.key not in known]
        if missing:
            with device_lock(dev), warnings.catch_warnings():  # another process may have measured them meanwhile
                warnings.simplefilter("ignore", LatencyCacheWarning)  # a damaged file was reported by the first read
                known = cache.load()
                missing = [p for p in pending if p.key not in known]
                if missing:
                    logger.info("latency table: measuring %d of %d entries on %s", len(missing), len(pending),
                                condition["device_name"])
                    Bench(model, (example,), call_kwargs, dev, settings.cuda_graph, settings.clock).warmup(
                        settings.warmup_s)
                    if settings.entries == "context":
                        records = measure_in_context(model, segs, keys, fixed.key, example, call_kwargs, dev,
                                                     channels_last, merge, settings)
                        for p in pending:  # peak memory of each record's module alone (a CPU estimate)
                            if p.key in records:
                                mem = call_peak_memory(p.module, p.capture.args, p.capture.kwargs, dev)
                                what = p.what if p is not fixed else p.what.replace("segments replayed",
                                                                                    "time outside the segments")
                                records[p.key].update(peak_mem_bytes=mem[0], mem_estimated=mem[1], what=what)
                        records[pending[-1].key] = context_overhead_record()
                        wanted = {p.key for p in missing}
                        records = {k: v for k, v in records.items() if k in wanted}
                    else:
                        records = measure_rounds(missing, dev, settings, reference=fixed)
                    known = _store(cache, records, known)
    measured = {p.key for p in missing}
    sources = {p.key: "measured" if p.key in measured else "cached" for p in pending}
    return LatencyTable(
        model_name=getattr(model, "zoo_name", type(model).__name__), condition=condition, segments=segs, keys=keys,
        records=_table_records(pending, known, keys, prefixes, fixed.key, settings), fixed_key=fixed.key,
        prefix_keys=prefixes,
        overhead_key=pending[-1].key,
        n_measured=len(missing), n_cached=len(pending) - len(missing), build_s=time.perf_counter() - start,
        sources=sources, model=model, example=example, forward_kwargs=call_kwargs, merge=merge, settings=settings,
        timing_probe=probe,
    )


__all__ = ["STATS", "build_table", "chains_after_previous", "fixed_from_whole", "normalise_input_size",
           "record_cost"]
