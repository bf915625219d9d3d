"""The one door of every study's and suite's command line (``benchmarks.common.CommandLine``), fuzzed: arguments drawn
by hypothesis from each command's own options and from values users get wrong (zero and negative counts, NaN and
infinities, empty strings, unknown names, files where folders go, JSON of another shape) are either accepted, and then
within what the option allows, or refused in one line naming the command, before any work. Never a traceback.

The bench tier runs the same property over more examples (``bench/test_command_line_fuzz.py``)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import common
from benchmarks.common import BenchmarkInputError
from zoo.errors import run_command

ROOT = Path(__file__).resolve().parents[2]


def commands() -> list[str]:
    """Every study and suite with a command line: the modules under studies/ and benchmarks/ that run as
    ``python -m``."""
    found = []
    for folder in ("studies", "benchmarks"):
        for path in sorted((ROOT / folder).glob("*.py")):
            text = path.read_text()
            if 'if __name__ == "__main__"' in text or path.stem == "__main__":
                found.append(f"{folder}.{path.stem}" if path.stem != "__main__" else folder)
    return found


COMMANDS = commands()
PARSERS: dict[str, argparse.ArgumentParser] = {}


def parser_of(command: str) -> argparse.ArgumentParser:
    if command not in PARSERS:
        module = importlib.import_module(command if command not in ("benchmarks",) else "benchmarks.__main__")
        PARSERS[command] = module.command_line()
    return PARSERS[command]


# What each reading type promises about the value it accepts (the contract the fuzzer checks, written here, not
# read from the code under test).
PROMISES = {
    common.count: lambda v: isinstance(v, int) and v >= 1,
    common.whole: lambda v: isinstance(v, int) and v >= 0,
    common.positive: lambda v: isinstance(v, float) and math.isfinite(v) and v > 0,
    common.non_negative: lambda v: isinstance(v, float) and math.isfinite(v) and v >= 0,
    common.out_folder: lambda v: not Path(v).is_file(),
    common.out_file: lambda v: not Path(v).is_dir(),
    common.existing_file: lambda v: Path(v).is_file(),
    common.model_name: lambda v: __import__("zoo").is_model(v),
    common.run_folder: lambda v: (Path(v) / "results.json").is_file(),
}


def test_every_command_line_goes_through_the_door():
    """No study or suite builds its own argparse parser: each has ``command_line()`` returning a CommandLine (so a
    wrong argument is one line and exit 2), and its main reads its arguments from it."""
    assert len(COMMANDS) >= 20, COMMANDS
    for command in COMMANDS:
        path = command.replace(".", "/") + ".py" if "." in command else f"{command}/__main__.py"
        source = (ROOT / path).read_text()
        assert "argparse.ArgumentParser(" not in source, command
        assert isinstance(parser_of(command), common.CommandLine), command
        assert re.search(r"command_line\(\)(\.parse_args\(argv\))?", source.split("def main", 1)[-1]), command


def test_a_wrong_argument_is_one_line_and_exit_2_through_main(capsys):
    """Each command's own main, as ``python -m`` runs it (through run_command): an unknown option is refused in one
    line that names the command, exit status 2, before any work."""
    for command in COMMANDS:
        module = importlib.import_module(command if command != "benchmarks" else "benchmarks.__main__")
        code = run_command(lambda: module.main(["--no-such-option"]))  # noqa: B023 - called at once
        said = capsys.readouterr()
        assert code == 2, (command, said.err)
        lines = said.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: python -m {command}"), (command, said.err)
        assert not said.out, command


@pytest.fixture(scope="module")
def things(tmp_path_factory) -> dict[str, str]:
    """Paths a user might give: a folder, a file, a JSON result of another study, one that is not JSON, a missing
    one, a folder that cannot be written."""
    base = tmp_path_factory.mktemp("fuzz")
    (base / "folder").mkdir()
    (base / "note.txt").write_text("not json")
    (base / "other.json").write_text(json.dumps({"suite": "something_else", "rows": []}))
    (base / "list.json").write_text("[1, 2]")
    locked = base / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return {"folder": str(base / "folder"), "text": str(base / "note.txt"), "other": str(base / "other.json"),
            "list": str(base / "list.json"), "missing": str(base / "missing" / "x.json"),
            "locked": str(locked / "out") if os.geteuid() != 0 else str(base / "note.txt" / "out")}


WORDS = ["0", "1", "2", "-1", "3", "1.5", "0.5", "nan", "inf", "-inf", "1e309", "", " ", "abc", "speed", "quality",
         "speed,quality", "speed,nope", ",", "mobilenetv2_100", "mobilenetv2_035", "timm/resnet18", "no_such_model",
         "cpu", "cuda", "auto", "4,6", "64,64", "64", "dp,greedy", "loss", "convnext_atto", "eager,compile", "tflite",
         "gpu_check", "latency_table", "prune_quality"]
PATHS = ["folder", "text", "other", "list", "missing", "locked"]


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@st.composite
def argv_for(draw, parser: argparse.ArgumentParser, things: dict[str, str]) -> list[str]:
    """An argument list: some of the command's options, each with a value from WORDS or a path, sometimes a stray
    word or an unknown option; sub-commands first when the command has them."""
    argv: list[str] = []
    target = parser
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        name = draw(st.sampled_from(sorted(subs[0].choices)))
        argv.append(name)
        target = subs[0].choices[name]
    value = st.one_of(st.sampled_from(WORDS), st.sampled_from(PATHS).map(things.__getitem__))
    for action in draw(st.lists(st.sampled_from(options(target)), max_size=4)) if options(target) else []:
        argv.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs != 0:
            argv.extend(draw(st.lists(value, min_size=1, max_size=2 if action.nargs in ("+", "*") else 1)))
    positionals = [a for a in target._actions if not a.option_strings and not isinstance(a,
                                                                                        argparse._SubParsersAction)]
    if positionals or draw(st.booleans()):
        argv.extend(draw(st.lists(value, min_size=0, max_size=2)))
    if draw(st.integers(0, 9)) == 0:
        argv.append("--frobnicate")
    return argv


def check_one(command: str, argv: list[str]) -> None:
    """Parse `argv` as `command` does: accepted within every option's promise, or refused in one line; nothing
    printed, nothing else raised."""
    parser = parser_of(command)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            parsed = parser.parse_args(argv)
        except BenchmarkInputError as refused:
            message = str(refused)
            assert "\n" not in message and message.startswith(f"python -m {command}"), (argv, message)
            assert not out.getvalue(), (argv, out.getvalue())
            return
    assert not out.getvalue(), (argv, out.getvalue())
    chosen = [a.choices[getattr(parsed, a.dest)] for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    actions = [a for p in [parser, *chosen] for a in p._actions]  # (the sub-command that was run, not its siblings)
    for action in actions:
        promise = PROMISES.get(action.type)
        value = getattr(parsed, action.dest, None)
        if promise is None or value is None or value == action.default:
            continue
        for item in value if isinstance(value, list) else [value]:
            assert promise(item), (command, argv, action.dest, item)


def fuzz_command(command: str, things: dict[str, str], examples: int) -> None:
    """`examples` drawn argument lists through :func:`check_one` (the bench tier runs more)."""

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                             HealthCheck.too_slow])
    @given(data=st.data())
    def fuzz(data):
        check_one(command, data.draw(argv_for(parser_of(command), things)))

    fuzz()


@pytest.mark.parametrize("command", COMMANDS)
def test_fuzzed_arguments_are_accepted_within_their_promise_or_refused_in_one_line(command, things):
    fuzz_command(command, things, examples=40)
