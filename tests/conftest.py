"""Fixtures shared by the test tiers (plain helpers, and the one subprocess runner, are in ``helpers.py``).

The tiers are folders (tests/README.md): ``unit`` (the README's test command), ``e2e`` and ``bench`` (CI). Each test
gets its tier's marker and, unless it sets its own, its tier's timeout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TIER_TIMEOUT_S = {"unit": 60, "e2e": 900, "bench": 900}


def pytest_configure(config: pytest.Config) -> None:
    """One thread per test process, as the subprocess runner gives each entry point: a tiny model runs as fast, and
    two workers (or a busy machine) do not make PyTorch's threads fight over the cores."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread_after_each_test():
    """A test that sets torch's thread count (a job run in process with ``trainer.threads``, a timing) leaves the
    worker at one thread again: two workers each with two threads on two cores made later tests up to 17x slower (the
    unit tier's patience test took 44 s instead of 2.6 s)."""
    import torch

    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # the tier markers are in place before -m selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        tier = Path(item.path).relative_to(root).parts[0]
        if tier not in TIER_TIMEOUT_S:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUT_S[tier]))


@pytest.fixture(scope="session", autouse=True)
def own_cache_root(tmp_path_factory) -> Path:
    """``$DEPTHZOO_CACHE`` of this test process (each xdist worker has one): its latency tables and its timing lock
    are its own, never the user's ``~/.cache/depthzoo``, and two workers do not wait for each other's lock."""
    root = tmp_path_factory.mktemp("depthzoo-cache")
    before = os.environ.get("DEPTHZOO_CACHE")
    os.environ["DEPTHZOO_CACHE"] = str(root)
    yield root
    if before is None:
        os.environ.pop("DEPTHZOO_CACHE", None)
    else:
        os.environ["DEPTHZOO_CACHE"] = before


@pytest.fixture
def offline_hub(monkeypatch, tmp_path) -> Path:
    """A Hugging Face home of this test's own (``tmp_path/hf``), offline: what ``helpers.put_in_hf_cache`` places
    there is what a hub id resolves to, and nothing is downloaded."""
    import huggingface_hub.constants as hf_constants

    hf_home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    return hf_home


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """A latency cache directory shared by one test module's tables."""
    return tmp_path_factory.mktemp("latency-cache")


@pytest.fixture(scope="module")
def table(cache_dir: Path):
    """A small CPU latency table (helpers.small_table), built once per test module."""
    from .helpers import small_table

    return small_table(cache_dir)
