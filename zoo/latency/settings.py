"""How tables and whole networks are timed: :class:`TableSettings` (``prune.table``) and
:class:`NetworkTimingSettings` (``prune.measure``), both extending the interleaved rounds of
:class:`~zoo.latency.measure.RoundSettings`, and the values their fields allow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ZooError
from .measure import CLOCKS, RoundSettings
from .runtime import RUNTIMES

ESTIMATORS = ("median", "p10", "min")
ENTRY_TIMINGS = ("auto", "context", "isolated")
CUDA_TIMINGS = ("auto", "queued", "isolated")


@dataclass(frozen=True)
class TableSettings(RoundSettings):
    """How a table is measured: the rounds of :class:`~zoo.latency.measure.RoundSettings` (each record leaves the
    rounds once its median is precise enough), plus:

    runtime: the deploy runtime every record (and every whole network in a prediction check and in ``prune.py``'s
        final timing) runs in (:mod:`zoo.latency.runtime`): ``eager``, ``compile`` (torch.compile, inductor),
        ``onnxruntime`` or ``tensorrt`` (CUDA), or an INT8 form (``compile_int8``, ``onnxruntime_int8``,
        ``tensorrt_int8``: each record quantised first). Outside eager every record's module is compiled or exported
        on its own and timed isolated; the compile/export time is part of the build time (``runtime_build_s``).
    entries: how the records are timed. ``context`` times every (segment, variant) inside running probe networks
        (hooks at the segment boundaries), so each one starts from the cache state the network leaves it in;
        ``isolated`` times each alone on its captured inputs in interleaved rounds, the machine's drift divided out
        by the fixed part's network timed in every round; ``auto``: context on the CPU in eager, isolated elsewhere.
    entry_warmup_s: untimed calls of each record's module (each probe network in context) before the rounds.
    min_rounds: 150 by default: fewer rounds leave a per-build shift in every predicted speed-up (docs/latency.md,
        "Where the error sits").
    estimator: the statistic of the runs the costs use: ``median``, ``p10`` (robust to a busy machine, whose
        interference only adds time) or ``min``. In context, a part's cost is its mean over the runs whose
        whole-network time is near that statistic of the totals, so the parts add up to it.
    threads, cuda_graph, clock: as :class:`~zoo.latency.measure.MeasureSettings`.
    probe_spacing: in context, every m-th segment of a probe network takes a changed variant (1: all of them, the
        fewest networks; m: each changed variant between intact neighbours, m times the networks).
    deploy: time every record and network in its deploy form (:func:`zoo.fuse`), the form a pruned network is
        served in.
    cuda_timing: on CUDA, ``queued`` times each record's device time behind already queued kernels (a device-bound
        network); ``isolated`` from an idle device, host launch time included (host-bound small batches);
        ``auto`` keeps an existing cache's protocol, else takes ``queued`` when the device is busy for at least
        80 % of the network's latency (:func:`~zoo.latency.protocol.resolve_cuda_timing`). Whole networks are always
        timed isolated.
    """

    warmup_s: float = 3.0
    min_rounds: int = 150
    max_rounds: int = 400
    rel_tol: float = 0.01
    max_time_s: float = 240.0
    entry_warmup_s: float = 0.05
    threads: int = 1
    cuda_graph: bool = False
    estimator: str = "p10"
    clock: str = "wall"
    deploy: bool = True
    cuda_timing: str = "auto"
    entries: str = "auto"
    runtime: str = "eager"
    probe_spacing: int = 1
    label: ClassVar[str] = "TableSettings (prune.table)"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.threads < 1:
            raise ZooError(f"TableSettings (prune.table): threads={self.threads} must be >= 1.")
        if self.probe_spacing < 1:
            raise ZooError(f"TableSettings (prune.table): probe_spacing={self.probe_spacing} must be >= 1.")
        if self.entry_warmup_s < 0:
            raise ZooError(f"TableSettings (prune.table): entry_warmup_s={self.entry_warmup_s} must be >= 0.")
        if self.clock not in CLOCKS:
            raise ZooError(f"Unknown clock {self.clock!r}; allowed are {', '.join(CLOCKS)}.")
        if self.estimator not in ESTIMATORS:
            raise ZooError(f"Unknown estimator {self.estimator!r}; allowed are {', '.join(ESTIMATORS)}.")
        if self.entries not in ENTRY_TIMINGS:
            raise ZooError(f"Unknown entries timing {self.entries!r}; allowed are {', '.join(ENTRY_TIMINGS)}.")
        if self.runtime not in RUNTIMES:
            raise ZooError(f"Unknown runtime {self.runtime!r}; allowed are {', '.join(RUNTIMES)}.")
        if self.entries == "context" and self.runtime != "eager":
            raise ZooError(f"entries='context' times segments inside the running eager network; runtime="
                           f"{self.runtime!r} runs one compiled graph without segment boundaries: use entries='auto' "
                           f"or 'isolated'.")
        if self.cuda_graph and self.runtime in ("onnxruntime", "onnxruntime_int8", "tensorrt", "tensorrt_int8"):
            raise ZooError(f"cuda_graph=true replays a captured PyTorch call; runtime={self.runtime!r} runs its own "
                           f"engine (it manages its own graphs): use cuda_graph=false, or runtime=eager / compile.")
        if self.cuda_timing not in CUDA_TIMINGS:
            raise ZooError(f"Unknown cuda_timing {self.cuda_timing!r}; allowed are {', '.join(CUDA_TIMINGS)}.")


@dataclass(frozen=True)
class NetworkTimingSettings(RoundSettings):
    """Interleaved timing of whole networks (:func:`~zoo.latency.networks.time_networks`: a table's prediction check
    and correction, ``prune.py``'s side-by-side measurement, ``prune.measure``): the rounds of
    :class:`~zoo.latency.measure.RoundSettings`, each network warmed for `net_warmup_s` first; the table's estimator
    summarises the runs. No warm calls by default: a warm call makes a network's time its own steady state, which
    inside a served pipeline it is not (docs/latency.md, "Neighbours")."""

    net_warmup_s: float = 0.1
    label: ClassVar[str] = "NetworkTimingSettings (prune.measure)"


__all__ = ["CUDA_TIMINGS", "ENTRY_TIMINGS", "ESTIMATORS", "NetworkTimingSettings", "TableSettings"]
