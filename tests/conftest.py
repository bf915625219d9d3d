"""Fixtures shared by the test modules (plain helpers, and the one subprocess runner, are in ``helpers.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest


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
