"""The longer runs of the fuzzers: every study's and suite's command line, 400 drawn argument lists each (the
property of tests/unit/test_command_lines.py), and 300 drawn override lists each for prune.py and train.py (the
property of tests/unit/test_override_fuzz.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..unit.test_command_lines import COMMANDS, argv_for, check_one, parser_of, things  # noqa: F401 - a fixture
from ..unit.test_override_fuzz import check, hydra_context, overrides_for  # noqa: F401 - a fixture


@pytest.mark.parametrize("command", COMMANDS)
def test_fuzzed_arguments_over_many_examples(command, things):  # noqa: F811 - the imported fixture
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
    @given(data=st.data())
    def fuzz(data):
        check_one(command, data.draw(argv_for(parser_of(command), things)))

    fuzz()


@pytest.mark.parametrize("script", ["prune", "train"])
def test_fuzzed_overrides_over_many_examples(script, hydra_context):  # noqa: F811 - the imported fixture
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
    @given(overrides=overrides_for(script))
    def fuzz(overrides):
        check(script, overrides, hydra_context)

    fuzz()

