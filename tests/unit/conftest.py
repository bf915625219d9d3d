"""The unit tier's order: its longest modules first, so that under ``--dist loadscope`` (a module stays on one worker)
the two workers finish together instead of one waiting for a long module handed out last."""

from __future__ import annotations

from pathlib import Path

import pytest

LONGEST_FIRST = ("test_prune_job.py", "test_bad_input.py", "test_train.py", "test_export.py", "test_features.py",
                 "test_zoo.py", "test_doors.py", "test_runtimes.py")  # (each 20-65 s on 2 cores, 2026-12-07)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.path).name, len(rank)))  # (stable: each module keeps its order)
