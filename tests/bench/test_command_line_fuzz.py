"""The longer runs of the fuzzers: every study's and suite's command line, 400 drawn argument lists each (the
property of tests/unit/test_command_lines.py), and 300 drawn override lists each for prune.py and train.py (the
property of tests/unit/test_override_fuzz.py)."""

from __future__ import annotations

import pytest

from ..unit.test_command_lines import COMMANDS, fuzz_command, things  # noqa: F401 - a fixture
from ..unit.test_override_fuzz import fuzz_overrides, hydra_context  # noqa: F401 - a fixture


@pytest.mark.parametrize("command", COMMANDS)
def test_fuzzed_arguments_over_many_examples(command, things):  # noqa: F811 - the imported fixture
    fuzz_command(command, things, examples=400)


@pytest.mark.parametrize("script", ["prune", "train"])
def test_fuzzed_overrides_over_many_examples(script, hydra_context):  # noqa: F811 - the imported fixture
    fuzz_overrides(script, hydra_context, examples=300)
