"""The longer run of the command-line fuzzer (tests/unit/test_command_lines.py): the same property, every study's
and suite's command line, 400 drawn argument lists each."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..unit.test_command_lines import COMMANDS, argv_for, check_one, parser_of, things  # noqa: F401 - a fixture


@pytest.mark.parametrize("command", COMMANDS)
def test_fuzzed_arguments_over_many_examples(command, things):  # noqa: F811 - the imported fixture
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
    @given(data=st.data())
    def fuzz(data):
        check_one(command, data.draw(argv_for(parser_of(command), things)))

    fuzz()
