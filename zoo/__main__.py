"""``python -m zoo list [pattern]``: a table of every registered model; ``python -m zoo info NAME``; ``python -m zoo
report SWEEP_DIR``: a sweep's report (:mod:`zoo.jobs.sweep_report`)."""

from __future__ import annotations

import argparse
import json
import sys

from . import list_models, model_info
from .errors import UnknownModelError, run_command
from .models.registry import load_plugins
from .weights.tags import known_tags, resolve_tag, split_name


def _format_params(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"


def print_table(pattern: str = "*") -> None:
    """Print name, family, parameters, input size and default pretrained tag of matching models."""
    names = list_models(pattern)
    if not names:
        raise UnknownModelError(f"No registered model matches {pattern!r}; `python -m zoo list` lists all "
                                f"{len(list_models())} (patterns are shell-style, e.g. 'mobilenetv2_*').")
    rows = [model_info(name) for name in names]
    header = f"{'model':<22} {'family':<12} {'params':>9}  {'input':<14} pretrained"
    print(header)
    print("-" * len(header))
    for info in rows:
        size = "x".join(str(s) for s in info["input_size"])
        print(f"{info['name']:<22} {info['family']:<12} {_format_params(info['params']):>9}  {size:<14} "
              f"{info['pretrained_tag'] or '-'}")
    print(f"{len(rows)} models")


def print_tags(pattern: str = "*") -> None:
    """Print every pretrained tag of the matching models with its eval config (what ``pretrained=True`` loads)."""
    names = known_tags(pattern)
    if not names:
        raise UnknownModelError(f"No registered model matching {pattern!r} has pretrained tags; `python -m zoo list "
                                f"--pretrained` lists all of them.")
    header = f"{'model.tag':<48} {'input':<10} {'crop':>5}  {'interp':<9} {'classes':>7}  mean / std"
    print(header)
    print("-" * len(header))
    for full in names:
        cfg = resolve_tag(*split_name(full))
        size = "x".join(str(s) for s in cfg["input_size"][1:])
        stats = f"{tuple(round(m, 3) for m in cfg['mean'])} / {tuple(round(s, 3) for s in cfg['std'])}"
        print(f"{full:<48} {size:<10} {cfg['crop_pct']:>5.3f}  {cfg['interpolation']:<9} {cfg['num_classes']:>7}  "
              f"{stats}")
    print(f"{len(names)} pretrained tags")


def print_prunable(pattern: str) -> None:
    """For every timm model matching `pattern`, whether it can be depth-pruned: its removable blocks and sub-layers
    (the units ``create_model`` offers: the same discovery and cache), or why not. Each model is built and its units
    proven (seconds each; the census, ``python -m studies.timm_census``, has all of timm)."""
    from .models.timm_any import PREFIX, prunable

    pattern = pattern if pattern.startswith(PREFIX) else PREFIX + ("*" if pattern in ("*", "timm") else pattern)

    def progress(done: int, total: int, arch: str) -> None:
        if total > 1:
            print(f"[{done + 1}/{total}] {arch}", file=sys.stderr, flush=True)

    rows = prunable(pattern, progress)
    header = f"{'model':<48} {'prunable':<8} {'blocks':>6} {'sublayers':>9}  why not"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['model']:<48} {'yes' if row['prunable'] else 'no':<8} {row['blocks']:>6} {row['sublayers']:>9}  "
              f"{row['reason'] or ''}")
    print(f"{sum(r['prunable'] for r in rows)} of {len(rows)} timm models can be depth-pruned "
          f"(python prune.py model=timm model.name=<name>)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    list_cmd = sub.add_parser("list", help="table of registered models")
    list_cmd.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'mobilenetv2_*'")
    list_cmd.add_argument("--pretrained", action="store_true", help="list pretrained tags and their eval configs")
    list_cmd.add_argument("--prunable", action="store_true", help="timm models (pattern: timm/<shell pattern>) that "
                          "can be depth-pruned, with their discovered units")
    info_cmd = sub.add_parser("info", help="one model's details as JSON")
    info_cmd.add_argument("name")
    sub.add_parser("report", help="a sweep's report.md, report.csv and pareto.png (python -m zoo report --help)",
                   add_help=False)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["report"]:  # its own options: the sweep report's command line
        from .jobs.sweep_report import main as report_main

        return report_main(argv[1:])
    args = parser.parse_args(argv)

    def command() -> int:
        load_plugins()
        if args.command == "list" and args.prunable:
            print_prunable(args.pattern)
        elif args.command == "list":
            (print_tags if args.pretrained else print_table)(args.pattern)
        else:
            print(json.dumps(model_info(args.name), indent=2))
        return 0

    return run_command(command)


if __name__ == "__main__":
    raise SystemExit(main())
