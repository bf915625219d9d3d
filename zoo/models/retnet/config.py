"""RetNet's sizes and option values, declared once: the registered sizes (the paper's for the large ones) and what
``mode``, ``decode``, ``decay`` and ``rope`` may be."""

from __future__ import annotations

from typing import Any

MODES = ("parallel", "recurrent", "chunkwise")


DECODES = ("auto", "graph", "static", "forward")


DECAYS = ("torchscale", "linspace")


ROPES = ("torchscale", "neox")  # interleaved pairs, linspace frequencies | rotate-half, theta^(-2i/d) (fla's)


SHAPE_KEYS = ("dim", "depth", "heads")


GPT2_VOCAB = 50257


RETNET_SIZES: dict[str, dict[str, Any]] = {
    "retnet_tiny": dict(dim=64, depth=2, heads=2, vocab_size=256, chunk_size=16, context=64),
    "retnet_small": dict(dim=256, depth=6, heads=4, vocab_size=256, chunk_size=64, context=256),
    "retnet_base": dict(dim=512, depth=12, heads=4, vocab_size=256, chunk_size=128, context=512),
    "retnet_1_3b": dict(dim=2048, depth=24, heads=8, vocab_size=GPT2_VOCAB, chunk_size=512, context=2048),
    "retnet_2_7b": dict(dim=2560, depth=32, heads=10, vocab_size=GPT2_VOCAB, chunk_size=512, context=2048),
    "retnet_6_7b": dict(dim=4096, depth=32, heads=16, vocab_size=GPT2_VOCAB, chunk_size=512, context=2048),
}

