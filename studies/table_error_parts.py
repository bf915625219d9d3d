"""Which part of a latency table's error repeats from build to build: the held-out plans of a ``latency_table`` run
(the same plans in every cold build) split into a shift each build shares, a part each plan repeats in every build
(the table's own error for that plan) and the rest, and the plans that are off with one sign in every build.

    python -m studies.table_error_parts RESULT.json [RESULT.json ...] [--kind anchored|raw] [--out FILE]

RESULT: what ``python -m benchmarks.latency_table`` wrote (the builds form; each build keeps its plans' errors).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from benchmarks.common import (
    BenchmarkInputError,
    CommandLine,
    out_file,
    read_json,
    result_of,
)
from zoo.errors import run_command
from zoo.files import write_json

KINDS = ("anchored", "raw")


def per_plan(builds: list[dict[str, Any]], key: str = "error_anchored") -> list[dict[str, float]]:
    """Per held-out plan, its signed error's median over the builds, its range and the share of builds with the same
    sign as the median: a systematic table error is large with one sign in every build, noise is not."""
    rows = []
    for plans in zip(*(b["plans"] for b in builds)):
        errors = [p[key] for p in plans]
        mid = statistics.median(errors)
        rows.append({"label": plans[0]["label"], "removed": len(plans[0]["remove"]), "median": mid,
                     "min": min(errors), "max": max(errors),
                     "same_sign": sum((e > 0) == (mid > 0) for e in errors) / len(errors)})
    return rows


def error_components(builds: list[dict[str, Any]], key: str = "error_anchored") -> dict[str, float] | None:
    """The signed errors of the held-out plans (builds x plans) split three ways, each as a standard deviation:
    ``common``, the shift every plan of a build shares (the original's prediction against its measurement, for
    anchored errors), with its mean over the builds; ``plan``, the part of a plan's error that repeats in every build
    (the table's error for that plan); ``rest``, what is left (each build's own table noise and measurement noise).
    None with fewer than 2 builds or plans."""
    errors = np.array([[p[key] for p in b["plans"]] for b in builds], dtype=np.float64)
    if errors.ndim != 2 or min(errors.shape) < 2:
        return None
    common = errors.mean(axis=1, keepdims=True)
    plan = (errors - common).mean(axis=0, keepdims=True)
    rest = errors - common - plan
    dof = (errors.shape[0] - 1) * (errors.shape[1] - 1)  # what the two means leave free
    return {"common_mean": float(common.mean()), "common_sd": float(common.std(ddof=1)),
            "plan_sd": float(plan.std(ddof=1)), "rest_sd": float(np.sqrt((rest ** 2).sum() / dof))}


def parts(result: dict[str, Any], kind: str = "anchored") -> list[dict[str, Any]]:
    """Per model row of a latency_table result: its plans (worst first) and its error components."""
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list) or result.get("form") == "conditions":
        raise BenchmarkInputError("not a latency_table result of the builds form (rows of cold builds); give a file "
                                  "that python -m benchmarks.latency_table wrote.")
    key, out = f"error_{kind}", []
    for row in result["rows"]:
        builds = row.get("builds") or []
        try:
            plans = sorted(per_plan(builds, key), key=lambda p: -abs(p["median"])) if builds else []
            parts = error_components(builds, key) if builds else None
        except (KeyError, TypeError) as exc:
            raise BenchmarkInputError(f"a build of {row.get('model')!r} keeps no per-plan {key} ({exc!r}): written by "
                                      "a latency_table older than its per-plan records; give a newer run.") from None
        out.append({"model": row["model"], "batch_size": row["batch_size"], "builds": len(builds), "kind": kind,
                    "plans": plans, "components": parts})
    return out


def markdown(rows: list[dict[str, Any]], worst: int = 3) -> str:
    """The plans with the largest median error and the split, per model, in sentences."""
    lines = []
    for r in rows:
        lines.append(f"{r['model']}, batch {r['batch_size']} ({r['builds']} builds): plans with the largest median "
                     f"{r['kind']} error over the builds: " + "; ".join(
                         f"{p['label']} ({p['removed']} removed) {p['median']:+.1%}, range {p['min']:+.1%} to "
                         f"{p['max']:+.1%}, same sign in {p['same_sign']:.0%}" for p in r["plans"][:worst]) + ".")
        if c := r["components"]:
            lines.append(f"Its {r['kind']} errors split into a shift every plan of a build shares "
                         f"({c['common_mean']:+.1%} on average, {c['common_sd']:.1%} sd over the builds), a part each "
                         f"plan repeats in every build ({c['plan_sd']:.1%} sd over the plans) and the rest "
                         f"({c['rest_sd']:.1%} sd).")
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("studies.table_error_parts", __doc__)
    parser.add_argument("results", nargs="+", type=result_of("latency_table", ["rows"]),
                        help="latency_table result files (builds form)")
    parser.add_argument("--kind", choices=KINDS, default="anchored", help="which error: anchored (the predicted "
                        "speed-up's) or raw (the predicted ms)")
    parser.add_argument("--out", type=out_file, default=None, help="also write the parts as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = command_line().parse_args(argv)
    found = {str(path): parts(read_json(path), args.kind) for path in args.results}
    for path, rows in found.items():
        print(f"## {path}\n\n{markdown(rows)}\n")
    if args.out:
        write_json(args.out, {"study": "table_error_parts", "kind": args.kind, "results": found})
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
