"""The data sets the training library reads, by task (light: no torch, so config checks can import it)."""

from __future__ import annotations

IMAGE_DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
TEXT_DATASETS = ("bytes", "text")


def task_of(data_name: str) -> str:
    """``"language_model"`` for text data sets, ``"classification"`` for image data sets (the registry's tasks)."""
    return "language_model" if data_name in TEXT_DATASETS else "classification"
