"""Data sets and loaders built from a data config alone (:func:`build_loaders`).

Image data sets (classification): ``digits`` (scikit-learn's 8x8 digits upsampled to RGB, fixed split, no
download), ``cifar10``/``cifar100`` (torchvision, ``root`` + ``download``), ``imagefolder`` (``root/train``
and ``root/val``), ``synthetic`` (random tensors). Text data sets (byte-level language modelling, vocab 256):
``bytes`` (an embedded corpus: docstrings of a fixed list of standard-library modules, read from their
sources with :mod:`ast`) and ``text`` (local files).

Determinism: the training sampler draws a permutation from ``(seed, epoch)`` and yields ``(epoch, index)``;
random transforms run under an RNG seeded from ``(seed, epoch, index)``. So the data order and augmentation
do not depend on worker count or on where a run was resumed.
"""

from __future__ import annotations

import ast
import glob
import math
import random
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import DataError
from .settings import DataConfig
from .tasks import IMAGE_DATASETS, TEXT_DATASETS, task_of

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BYTE_VOCAB = 256
CORPUS_MODULES = (
    "argparse", "ast", "asyncio/events", "base64", "bisect", "calendar", "collections/__init__", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email/message", "enum",
    "fractions", "functools", "heapq", "http/client", "inspect", "ipaddress", "json/__init__", "logging/__init__",
    "mailbox", "pathlib", "pickle", "pprint", "random", "shutil", "socket", "statistics", "string", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "typing", "unittest/case", "urllib/parse", "uuid", "zipfile",
)


@dataclass
class DataBundle:
    """What a training run needs from the data: loaders, the task and the label space."""

    train: DataLoader
    val: DataLoader
    task: str
    num_classes: int
    input_size: tuple[int, ...]
    sampler: EpochSampler
    info: dict[str, Any] = field(default_factory=dict)


class EpochSampler(Sampler):
    """Seeded per-epoch order, sharded over ranks, that can start part-way through an epoch.

    Yields ``(epoch, index)`` pairs; every rank gets ``len(dataset) // world`` indices.
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1):
        self.size, self.seed, self.shuffle, self.rank, self.world = size, seed, shuffle, rank, world
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the order of `epoch` and skip this rank's first `start` samples (a resumed epoch)."""
        self.epoch, self.start = epoch, start

    def order(self) -> list[int]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.size, generator=gen).tolist()
        else:
            order = list(range(self.size))
        per_rank = self.size // self.world
        return order[self.rank::self.world][:per_rank]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for index in self.order()[self.start:]:
            yield self.epoch, index

    def __len__(self) -> int:
        return self.size // self.world - self.start


class ShardSampler(Sampler):
    """Evaluation order: every sample exactly once over all ranks (rank r takes r, r+world, ...)."""

    def __init__(self, size: int, rank: int = 0, world: int = 1):
        self.indices = list(range(rank, size, world))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class EpochSeeded(Dataset):
    """Wraps a data set so that item ``(epoch, index)`` is drawn under an RNG seeded from both."""

    def __init__(self, dataset: Dataset, seed: int, random_items: bool = True):
        self.dataset, self.seed, self.random_items = dataset, seed, random_items

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if not self.random_items:
            return self.dataset[index]
        item_seed = (self.seed * 1_000_003 + epoch) * 10_000_019 + index
        py_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(item_seed)
            random.seed(item_seed)
            try:
                return self.dataset[index]
            finally:
                random.setstate(py_state)


class TensorPairs(Dataset):
    """In-memory ``(input, target)`` tensors."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


class RandomShift(Dataset):
    """Pads an image by `pad` pixels of `fill` and crops it back at a random offset (small translations)."""

    def __init__(self, dataset: Dataset, pad: int, fill: float):
        self.dataset, self.pad, self.fill = dataset, pad, fill

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        image, target = self.dataset[index]
        _, height, width = image.shape
        padded = torch.nn.functional.pad(image, (self.pad,) * 4, value=self.fill)
        top, left = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
        return padded[:, top:top + height, left:left + width], target


class RandomWindows(Dataset):
    """`count` windows of ``seq_len + 1`` tokens at random offsets: ``(tokens[:-1], tokens[1:])``.

    ``bytes_per_token`` (1 for byte tokens) turns a loss per token into bits per byte (:func:`evaluate`)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, count: int, bytes_per_token: float = 1.0):
        if len(tokens) <= seq_len + 1:
            raise DataError(f"The text has {len(tokens)} tokens, too few for data.seq_len={seq_len}.")
        self.tokens, self.seq_len, self.count = tokens, seq_len, count
        self.bytes_per_token = bytes_per_token

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(torch.randint(0, len(self.tokens) - self.seq_len - 1, ()))
        window = self.tokens[start:start + self.seq_len + 1].long()
        return window[:-1], window[1:]


class FixedWindows(RandomWindows):
    """Consecutive non-overlapping windows (evaluation)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, limit: int | None = None, bytes_per_token: float = 1.0):
        count = (len(tokens) - 1) // seq_len
        super().__init__(tokens, seq_len, min(count, limit) if limit else count, bytes_per_token)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[index * self.seq_len:(index + 1) * self.seq_len + 1].long()
        return window[:-1], window[1:]


# ----------------------------------------------------------------------------------------------- images
def _digits_split(cfg: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """scikit-learn digits normalised to ``3 x S x S``, and the indices of the training images, of the training
    split's images that ``data.train_samples`` leaves out, and of the validation images."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    size = cfg.image_size or 32
    images = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.tensor(digits.target, dtype=torch.long)
    try:
        split_idx, val_idx = train_test_split(
            list(range(len(labels))), test_size=cfg.val_fraction, random_state=0, stratify=digits.target
        )
    except ValueError as exc:
        raise DataError(f"data.val_fraction={cfg.val_fraction} cannot split the {len(labels)} digits with every class "
                        f"on both sides ({exc}); use a fraction between 0.01 and 0.99.") from None
    train_idx = split_idx
    if cfg.train_samples:  # a harder task: a fixed stratified subset of the training split
        train_idx = _stratified_subset(split_idx, digits.target, cfg.train_samples)
    unused_idx = sorted(set(split_idx) - set(train_idx))
    train, unused, val = (torch.tensor(i, dtype=torch.long) for i in (train_idx, unused_idx, val_idx))
    mean, std = images[train].mean().item(), images[train].std().item()
    images = ((images - mean) / std).expand(-1, 3, -1, -1).contiguous()
    info = {"mean": mean, "std": std, "train_size": len(train), "val_size": len(val)}
    return images, labels, train, unused, val, info


def _digits(cfg: Any, seed: int) -> tuple[Dataset, Dataset, int, dict]:
    """scikit-learn digits as normalised ``3 x S x S`` tensors, stratified fixed split (random_state=0).

    ``data.train_samples`` keeps a fixed stratified subset of the training images (null: all). Training images
    are shifted by up to ``data.shift`` pixels (0: no augmentation)."""
    images, labels, train_idx, _, val_idx, info = _digits_split(cfg)
    train: Dataset = TensorPairs(images[train_idx], labels[train_idx])
    if cfg.shift:
        mean, std = info["mean"], info["std"]
        train = RandomShift(train, cfg.shift, fill=-mean / std)
    return train, TensorPairs(images[val_idx], labels[val_idx]), 10, info


def unused_digits(cfg: Any) -> Dataset:
    """The digits of the training split that ``data.train_samples`` leaves out (normalised as the training images,
    not shifted): images the baseline never saw that are not the validation split either (a development set)."""
    if cfg.name != "digits":
        raise DataError(f"unused_digits needs data=digits, not data={cfg.name}.")
    images, labels, _, unused_idx, _, _ = _digits_split(cfg)
    if len(unused_idx) == 0:
        raise DataError("data.train_samples uses every training image: no unused digits are left.")
    return TensorPairs(images[unused_idx], labels[unused_idx])


def _stratified_subset(indices: list[int], labels: Sequence[int], count: int) -> list[int]:
    """`count` of `indices`, every class in proportion (fixed: random_state=0); all of them when count >= len."""
    from sklearn.model_selection import train_test_split

    if count >= len(indices):
        return indices
    classes = len(set(labels[i] for i in indices))
    if count < classes:
        raise DataError(f"data.train_samples={count} is fewer than the {classes} classes; give at least {classes} "
                        f"(or null for all {len(indices)} training images).")
    subset, _ = train_test_split(indices, train_size=count, random_state=0, stratify=[labels[i] for i in indices])
    return sorted(subset)


def _synthetic(cfg: Any, seed: int) -> tuple[Dataset, Dataset, int, dict]:
    size = cfg.image_size or 32
    gen = torch.Generator().manual_seed(seed)
    n_val = max(cfg.num_samples // 4, 1)
    images = torch.randn(cfg.num_samples + n_val, 3, size, size, generator=gen)
    labels = torch.randint(0, cfg.num_classes, (cfg.num_samples + n_val,), generator=gen)
    train = TensorPairs(images[:cfg.num_samples], labels[:cfg.num_samples])
    return train, TensorPairs(images[cfg.num_samples:], labels[cfg.num_samples:]), cfg.num_classes, {}


def _transforms(cfg: Any, model_cfg: dict | None) -> tuple[Any, Any]:
    """timm train/eval transforms with the model's mean/std/interpolation.

    With ``data.image_size: null`` the evaluation transform is exactly timm's for the model's config (a pretrained
    tag's eval config: test input size, crop_pct, crop_mode, interpolation, mean/std), built by timm's own
    ``resolve_data_config`` + ``create_transform`` as its validate script does; the training transform uses the
    training input size. An explicit ``data.image_size`` resizes to that size instead (center crop by crop_pct
    above 64 px).
    """
    from timm.data import create_transform, resolve_data_config

    pretrained = dict(model_cfg or {"mean": IMAGENET_MEAN, "std": IMAGENET_STD})
    resolved = resolve_data_config(pretrained_cfg=pretrained)
    size = cfg.image_size or resolved["input_size"][-1]
    common = {"input_size": (3, size, size), "mean": resolved["mean"], "std": resolved["std"],
              "interpolation": resolved["interpolation"]}
    train_tf = create_transform(is_training=True, hflip=cfg.hflip, scale=tuple(cfg.scale), **common)
    if cfg.image_size is None:
        eval_tf = create_transform(**resolve_data_config(pretrained_cfg=pretrained, use_test_size=True),
                                   is_training=False)
    else:
        eval_tf = create_transform(is_training=False, crop_pct=resolved["crop_pct"] if size > 64 else 1.0, **common)
    return train_tf, eval_tf


def _cifar(cfg: Any, seed: int, model_cfg: dict | None) -> tuple[Dataset, Dataset, int, dict]:
    from torchvision import datasets

    cls, classes = (datasets.CIFAR10, 10) if cfg.name == "cifar10" else (datasets.CIFAR100, 100)
    if not cfg.root:
        raise DataError(f"data={cfg.name} needs data.root (a folder holding or receiving the data set).")
    train_tf, eval_tf = _transforms(cfg, model_cfg)
    try:
        train = cls(cfg.root, train=True, download=cfg.download, transform=train_tf)
        val = cls(cfg.root, train=False, download=cfg.download, transform=eval_tf)
    except RuntimeError as exc:
        hint = "" if cfg.download else " Set data.download=true (needs network) or point data.root at a copy."
        raise DataError(f"{cfg.name} not found or corrupted under data.root={cfg.root}: {exc}.{hint}") from exc
    return train, val, classes, {"root": str(cfg.root)}


def read_image(path: str) -> Any:
    """An RGB PIL image; a file PIL cannot read is a DataError naming it (never skipped silently)."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except (OSError, ValueError) as exc:
        raise DataError(f"Cannot read image {path} ({type(exc).__name__}: {exc}). Remove or replace the file: "
                        f"data=imagefolder reads every image under data.root.") from None


def _imagefolder(cfg: Any, seed: int, model_cfg: dict | None) -> tuple[Dataset, Dataset, int, dict]:
    from torchvision import datasets

    root = Path(cfg.root or "")
    missing = [str(root / split) for split in ("train", "val") if not (root / split).is_dir()]
    if not cfg.root or missing:
        raise DataError(f"data=imagefolder needs data.root with train/ and val/ folders of class sub-folders; "
                        f"missing: {', '.join(missing) or 'data.root'}.")
    train_tf, eval_tf = _transforms(cfg, model_cfg)
    try:
        train = datasets.ImageFolder(str(root / "train"), transform=train_tf, loader=read_image)
        val = datasets.ImageFolder(str(root / "val"), transform=eval_tf, loader=read_image)
    except (FileNotFoundError, RuntimeError) as exc:
        raise DataError(f"Cannot read image folders under {root}: {exc}") from exc
    if train.classes != val.classes:
        raise DataError(f"{root}/train and {root}/val have different classes: {train.classes} vs {val.classes}.")
    return train, val, len(train.classes), {"classes": train.classes}


# ------------------------------------------------------------------------------------------------- text
def stdlib_corpus() -> bytes:
    """The embedded ``bytes`` corpus: module, class and function docstrings of :data:`CORPUS_MODULES`.

    Read from the interpreter's own standard-library sources (never imported, never downloaded), in a fixed
    order, so it is the same on every run of a given Python version.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    for module in CORPUS_MODULES:
        path = stdlib / f"{module}.py"
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef,
                                                                        ast.AsyncFunctionDef))]
        parts.extend(doc for n in nodes if (doc := ast.get_docstring(n)))
    if not parts:
        raise DataError(f"No standard-library sources found under {stdlib} to build the bytes corpus.")
    return "\n\n".join(parts).encode("utf-8")


def read_text_files(patterns: Sequence[str]) -> bytes:
    """The bytes of every file matching `patterns` (paths or globs), sorted, joined by newlines."""
    if not patterns:
        raise DataError("data=text needs data.files: a list of text files or glob patterns.")
    paths: list[Path] = []
    for pattern in patterns:
        found = sorted(Path(p) for p in glob.glob(str(Path(pattern).expanduser()), recursive=True))
        if not found:
            raise DataError(f"data.files entry {pattern!r} matches no file.")
        paths.extend(p for p in found if p.is_file())
    blob = b"\n".join(p.read_bytes() for p in paths)
    if not blob:
        raise DataError(f"The text files {', '.join(map(str, paths))} are empty.")
    return blob


def unigram_entropy(tokens: torch.Tensor, vocab: int = BYTE_VOCAB) -> float:
    """Entropy (nats) of the token frequency distribution: what a model without context can reach."""
    counts = torch.bincount(tokens.long(), minlength=vocab).double()
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * probs.log()).sum())


def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer by local path or hub name (``transformers.AutoTokenizer``; offline it reads the local
    cache). A name that cannot be loaded is a DataError saying where it was looked for."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError(f"data.tokenizer={name!r} needs the transformers package: pip install transformers "
                        f"(or data.tokenizer=bytes).") from None
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        where = "local folder" if Path(name).expanduser().exists() else "hub name (offline: from the local HF cache)"
        raise DataError(f"data.tokenizer={name!r} cannot be loaded as a {where}: {str(exc).splitlines()[0]} Give a "
                        f"folder with tokenizer files (tokenizer.json or tokenizer.model + config), a hub name in the "
                        f"cache, or bytes.") from None


def tokenize(blob: bytes, tokenizer: str) -> tuple[torch.Tensor, int, dict]:
    """(token ids, vocabulary size, facts) of text: raw bytes for ``bytes``, else the named tokenizer's ids of the
    UTF-8 text (undecodable bytes replaced)."""
    if tokenizer == "bytes":
        return (torch.frombuffer(bytearray(blob), dtype=torch.uint8), BYTE_VOCAB,
                {"tokenizer": "bytes", "bytes_per_token": 1.0})
    tok = load_tokenizer(tokenizer)
    ids = tok(blob.decode("utf-8", errors="replace"), add_special_tokens=False)["input_ids"]
    vocab = len(tok)
    dtype = torch.int32 if vocab < 2**31 else torch.int64
    return torch.tensor(ids, dtype=dtype), vocab, {"tokenizer": tokenizer, "bytes_per_token": len(blob) / max(
        len(ids), 1)}


def _text(cfg: Any, seed: int) -> tuple[Dataset, Dataset, int, dict]:
    blob = stdlib_corpus() if cfg.name == "bytes" else read_text_files(list(cfg.files))
    tokens, vocab, info = tokenize(blob, cfg.tokenizer or "bytes")
    split = int(len(tokens) * (1.0 - cfg.val_fraction))
    train_tokens, val_tokens = tokens[:split], tokens[split:]
    count = cfg.train_samples or max((len(train_tokens) - 1) // cfg.seq_len, 1)
    info.update({"corpus_bytes": len(blob), "tokens": len(tokens), "unigram_entropy": unigram_entropy(tokens, vocab),
                 "train_unigram_entropy": unigram_entropy(train_tokens, vocab)})
    per_token = info["bytes_per_token"]
    return (RandomWindows(train_tokens, cfg.seq_len, count, per_token),
            FixedWindows(val_tokens, cfg.seq_len, cfg.val_samples, per_token), vocab, info)


# ---------------------------------------------------------------------------------------------- loaders
def build_datasets(cfg: Any, seed: int = 0, model_cfg: dict | None = None) -> tuple[Dataset, Dataset, int, dict]:
    """``(train, val, num_classes_or_vocab, info)`` for a data config; `model_cfg` gives mean/std for timm."""
    name = cfg.name
    if name == "digits":
        return _digits(cfg, seed)
    if name == "synthetic":
        return _synthetic(cfg, seed)
    if name in ("cifar10", "cifar100"):
        return _cifar(cfg, seed, model_cfg)
    if name == "imagefolder":
        return _imagefolder(cfg, seed, model_cfg)
    if name in TEXT_DATASETS:
        return _text(cfg, seed)
    raise DataError(f"Unknown data set {name!r}; available: {', '.join(IMAGE_DATASETS + TEXT_DATASETS)}.")


def build_loaders(cfg: DataConfig, seed: int = 0, model_cfg: dict | None = None, rank: int = 0, world: int = 1,
                  pin_memory: bool = False) -> DataBundle:
    """Training and validation loaders for the data set `cfg` describes (:class:`~zoo.training.settings.DataConfig`,
    the ``data`` group's schema).

    The train loader drops the last incomplete batch and is ordered by an :class:`EpochSampler` (call
    ``bundle.sampler.set_epoch``); the validation loader visits every sample once over all ranks.
    """
    train, val, num_classes, info = build_datasets(cfg, seed, model_cfg)
    random_items = cfg.name != "synthetic" and not (cfg.name == "digits" and not cfg.shift)
    sampler = EpochSampler(len(train), seed, shuffle=True, rank=rank, world=world)
    # Own generators: creating a loader iterator then never draws from the global RNG (resume stays exact).
    workers = {"num_workers": cfg.num_workers, "persistent_workers": cfg.num_workers > 0, "pin_memory": pin_memory,
               "generator": torch.Generator().manual_seed(seed)}
    train_loader = DataLoader(EpochSeeded(train, seed, random_items), batch_size=cfg.batch_size, sampler=sampler,
                              drop_last=True, **workers)
    val_loader = DataLoader(val, batch_size=cfg.eval_batch_size or cfg.batch_size,
                            sampler=ShardSampler(len(val), rank, world), **workers)
    if len(train_loader) == 0:
        raise DataError(f"data={cfg.name} has {len(train)} training samples per rank, fewer than one batch of "
                        f"data.batch_size={cfg.batch_size}.")
    task = task_of(cfg.name)
    sample = val[0][0]
    input_size = tuple(sample.shape)
    info.update(train_samples=len(train), val_samples=len(val))
    return DataBundle(train_loader, val_loader, task, num_classes, input_size, sampler, info)


def batches_per_epoch(bundle: DataBundle) -> int:
    return math.floor(len(bundle.sampler.order()) / bundle.train.batch_size)
