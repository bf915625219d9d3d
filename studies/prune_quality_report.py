"""The statistics, verdicts, tables and plot of a ``prune_quality`` result: everything computed from its stored
cells, nothing measured (``python -m studies.prune_quality --summarise RESULT.json`` runs only this part).

Statistics (:mod:`studies.stats`): the default against every other rule, paired by seed at each target and stage, t
test (or a paired bootstrap over the validation samples when the seeds do not vary), Holm-corrected over the family's
comparisons: better, worse or tie. A sensitivity analysis (``span_sensitivity``, declared after the 2026-12-04 run,
so never a verdict) repeats them without the cells interpolated between plans more than ``SPAN`` (10 %) from the
target: a line across a gap in a rule's plans is not a network near the target. The plan scorer's Spearman
correlation against the real one-shot validation loss
is reported over every plan. The suite's targets (:func:`checks`): never significantly worse than any rule in every
family, better than random in every family, better than greedy and than the previous default (``dp_loss``) in at
least three, the scorer's Spearman at 2.0x at least 0.8 in every family.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Check, judge, markdown_table, read_json, results_dir, verdicts, write_result
from studies import stats

TARGETS = (1.5, 2.0)
STAGES = ("one_shot", "short")
CEILING_ACC, SEPARATION_POINTS, SEPARATION_PPL = 97.0, 5.0, 0.20
SPEARMAN_TARGET = 0.8
SPAN = 0.10  # the sensitivity analysis: interpolations only between plans that measured within 10 % of the target


def metric_name(task: str) -> str:
    """The tested metric: top-1 accuracy (points, higher is better) or validation loss (nats per token, lower)."""
    return "acc1" if task == "classification" else "loss"


def higher_is_better(metric: str) -> bool:
    return metric not in ("ppl", "bpb", "kl", "loss")


# ------------------------------------------------------------------------------------------------ statistics
def span_of(cell: dict[str, Any], target: float) -> float:
    """How far from the target the farthest plan a cell uses measured (relative)."""
    return max(abs(u["speedup"] / target - 1.0) for u in cell["used"])


def beyond_span(cell: dict[str, Any], target: float, span: float = SPAN) -> bool:
    """An interpolation between plans more than `span` from the target: a line across a gap in the rule's plans
    (whole-layer rules on a 4-layer model, say) rather than a network near the target."""
    return bool(cell.get("interpolated")) and span_of(cell, target) > span + 1e-9  # 2.2x is 10 % from 2.0x


def counts(cell: dict[str, Any], span: float | None = None) -> bool:
    """Whether a cell enters the comparisons: evaluated and at the target (with `span`, the sensitivity analysis:
    not interpolated across a gap wider than it)."""
    return "used" in cell and cell["at_target"] and not (span is not None and beyond_span(cell, cell["target"], span))


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(family: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (target, rule, stage): mean and sd over seeds of the metric, agreement, KL and speed-ups."""
    rows = []
    metric = family["metric"]
    for target in sorted({c["target"] for c in family["cells"]}):
        for rule in dict.fromkeys(c["rule"] for c in family["cells"]):
            done = [c for c in family["cells"] if c["target"] == target and c["rule"] == rule and "used" in c]
            failed = [c for c in family["cells"] if c["target"] == target and c["rule"] == rule and "error" in c]
            for stage in STAGES:
                row = {"family": family["family"], "target": target, "rule": rule, "stage": stage,
                       "seeds": len(done), "failed": len(failed),
                       "off_target": sum(not c["at_target"] for c in done),
                       "beyond_span": sum(c["at_target"] and beyond_span(c, target) for c in done),
                       "faster": sum(bool(c.get("faster")) for c in done),
                       "interpolated": sum(c["interpolated"] for c in done)}
                for key in dict.fromkeys((metric, "ppl" if metric == "loss" else "acc1", "agreement", "kl")):
                    row[f"{key}_mean"], row[f"{key}_sd"] = mean_sd([c[stage][key] for c in done])
                row["speedup_mean"], row["speedup_sd"] = mean_sd([c["speedup"] for c in done])
                row["session_speedup_mean"], row["session_speedup_sd"] = mean_sd([c["session_speedup"] for c in done])
                row["removed_mean"], _ = mean_sd([c["removed"] for c in done])
                row["search_s_mean"], _ = mean_sd([c["search_s"] for c in done])
                rows.append(row)
    return rows


def comparison(family: dict[str, Any], rule: str, reference: str, target: float, stage: str,
               span: float | None = None) -> dict[str, Any] | None:
    """`rule` against `reference`, paired by seed (positive: `rule` is better), at cells of both that count at the
    target (:func:`counts`)."""
    metric = family["metric"]
    sign = 1.0 if higher_is_better(metric) else -1.0
    cells = {r: {c["seed"]: c for c in family["cells"] if c["rule"] == r and c["target"] == target and counts(c, span)}
             for r in (rule, reference)}
    seeds = sorted(set(cells[rule]) & set(cells[reference]))
    if len(seeds) < 2:
        return None
    diffs = [sign * (cells[rule][s][stage][metric] - cells[reference][s][stage][metric]) for s in seeds]
    samples = [sign * (np.asarray(cells[rule][s][stage]["samples"]) - np.asarray(cells[reference][s][stage]["samples"]))
               for s in seeds]

    def mean_span(r: str) -> float:  # how far from the target the plans a rule's cells use lie, on average
        return statistics.fmean(span_of(cells[r][s], target) for s in seeds)

    return {"rule": rule, "reference": reference, "target": target, "stage": stage, "seeds": seeds,
            **stats.compare(diffs, samples), "span": mean_span(rule), "reference_span": mean_span(reference)}


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (None with fewer than 3 pairs or a constant side)."""
    from scipy.stats import spearmanr

    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return float(spearmanr(xs, ys).statistic)


def scorer_check(family: dict[str, Any]) -> list[dict[str, Any]]:
    """Per target, over every plan of every rule and seed, Spearman correlations: the default's plan score (real
    calibration loss of the whole plan) against the same loss on the validation split (``plan_score_spearman``, the
    target: at its best temperature when the default's importance is ``tempered``), against the plain one-shot
    validation loss and against the tested metric after the short fine-tune (signed so that positive means the
    score predicts it); the previous default's additive surrogate against the plain one-shot validation loss."""
    sign = 1.0 if higher_is_better(family["metric"]) else -1.0
    out = []
    for target in sorted({c["target"] for c in family["cells"]}):
        used = {(c["seed"], u["name"]): u for c in family["cells"] if c["target"] == target and "used" in c
                for u in c["used"]}
        if not used:
            continue
        plain = [u["one_shot_loss"] for u in used.values()]
        scores = [u["plan_score"] for u in used.values()]
        score = spearman(scores, [u.get("one_shot_scored_loss", u["one_shot_loss"]) for u in used.values()])
        short = [-sign * u["short_metric"] for u in used.values() if "short_metric" in u]
        out.append({"target": target, "plans": len(used), "plan_score_spearman": score,
                    "plain_loss_spearman": spearman(scores, plain),
                    "short_spearman": spearman(scores, short) if len(short) == len(scores) else None,
                    "surrogate_spearman": spearman([u["surrogate"] for u in used.values()], plain),
                    "passed": score is not None and score >= SPEARMAN_TARGET})
    return out


def summary_of(words: list[str]) -> str:
    """One word for a rule's comparisons: worse if any is worse, better if all are, partly better if some are."""
    if "worse" in words:
        return "worse"
    if words and all(v == "better" for v in words):
        return "better"
    return "partly better" if "better" in words else "tie"


def compared(family: dict[str, Any], default: str, span: float | None = None) -> dict[str, Any]:
    """The default against every other rule, Holm-corrected over the family: the judged comparisons, those that
    could not be made, each rule's summary and ``never_worse``; with `span`, the sensitivity analysis
    (interpolations across wider gaps left out)."""
    targets = sorted({c["target"] for c in family["cells"]})
    others = [r for r in dict.fromkeys(c["rule"] for c in family["cells"]) if r != default]
    pairs = [(rule, target, stage, comparison(family, default, rule, target, stage, span))
             for target in targets for stage in STAGES for rule in others]
    judged = stats.verdicts([p for *_, p in pairs if p])
    not_compared = [{"rule": rule, "target": target, "stage": stage} for rule, target, stage, p in pairs if p is None]
    by_reference: dict[str, dict[str, Any]] = {}
    for rule in others:
        mine = [j for j in judged if j["reference"] == rule]
        words = [j["verdict"] for j in mine]
        by_reference[rule] = {
            "comparisons": len(mine), "better": words.count("better"), "worse": words.count("worse"),
            "tie": words.count("tie"), "summary": summary_of(words),
            "not_compared": sum(n["rule"] == rule for n in not_compared)}
    return {"comparisons": judged, "not_compared": not_compared, "by_reference": by_reference,
            "never_worse": not any(j["verdict"] == "worse" for j in judged)}


def family_verdicts(family: dict[str, Any], default: str) -> dict[str, Any]:
    """The default against every other rule (:func:`compared`), and the issue's targets, computed."""
    targets = sorted({c["target"] for c in family["cells"]})
    metric, base = family["metric"], family["baseline"]
    random_one_shot = [c["one_shot"][metric] for c in family["cells"] if c["rule"] == "random"
                       and c["target"] == max(targets) and "used" in c]
    out: dict[str, Any] = {"default": default, **compared(family, default), "scorer": scorer_check(family)}
    if random_one_shot and family["task"] == "classification":
        out["baseline_below_ceiling"] = base["acc1"] <= CEILING_ACC
        out["random_one_shot_cost"] = base["acc1"] - statistics.fmean(random_one_shot)
        out["separates"] = out["random_one_shot_cost"] >= SEPARATION_POINTS
    elif random_one_shot:
        out["baseline_below_ceiling"] = True  # a language model's ceiling (0 bits per byte) is not reached
        out["random_one_shot_cost"] = math.exp(statistics.fmean(random_one_shot)) / base["ppl"] - 1.0
        out["separates"] = out["random_one_shot_cost"] >= SEPARATION_PPL
    return out


def with_statistics(family: dict[str, Any], default: str) -> dict[str, Any]:
    family["rows"] = summarise(family)
    family["verdicts"] = family_verdicts(family, default)
    within = compared(family, default, SPAN)
    family["span_sensitivity"] = {"span": SPAN, "compared": len(within["comparisons"]),
                                  "never_worse": within["never_worse"] if within["comparisons"] else None,
                                  "not_compared": within["not_compared"],
                                  "by_reference": {rule: v["summary"] for rule, v in within["by_reference"].items()},
                                  "worse": [c for c in within["comparisons"] if c["verdict"] == "worse"]}
    return family


def overall(result: dict[str, Any]) -> dict[str, Any]:
    """The counts the suite's targets are stated on, over the families, and ``passed``: every target of
    :func:`checks` met."""
    families = result["families"]

    def count(reference: str, strict: bool) -> int:
        wanted = ("better",) if strict else ("better", "partly better")
        return sum(f["verdicts"]["by_reference"].get(reference, {}).get("summary") in wanted for f in families)

    top = max(TARGETS)
    scorer = {f["family"]: next((s["plan_score_spearman"] for s in f["verdicts"]["scorer"] if s["target"] == top),
                                None) for f in families}
    out = {"families": len(families), "requested": len(result.get("requested") or families),
           "never_worse_families": sum(f["verdicts"]["never_worse"] for f in families),
           "never_worse_families_within_span": sum(f.get("span_sensitivity", {}).get("never_worse") is True
                                                   for f in families),
           "never_worse": all(f["verdicts"]["never_worse"] for f in families),
           "better_than_random": count("random", strict=False), "better_than_random_everywhere":
               count("random", strict=True),
           "better_than_greedy": count("greedy", strict=False), "better_than_dp_loss": count("dp_loss", strict=False),
           "scorer_spearman_at_2x": scorer,
           "scorer_passed": all(v is not None and v >= SPEARMAN_TARGET for v in scorer.values())}
    out["passed"] = all(v is True for v in verdicts(stated(out)).values())
    return out


def stated(counts: dict[str, Any]) -> list[Check]:
    """The suite's targets on the counts of :func:`overall`."""
    n = counts["families"]
    some = min(3, n)
    requested = counts.get("requested", n)  # a run in parts: not measured (incomplete) until every family is done
    return [Check("families run of those requested", n if n >= requested else None, ">=", requested),
            Check("families where the default is never significantly worse than a rule",
                  counts.get("never_worse_families", n if counts["never_worse"] else 0), ">=", n),
            Check("families where the default is better than random", counts["better_than_random"], ">=", n),
            Check("families where the default is better than greedy", counts["better_than_greedy"], ">=", some),
            Check("families where the default is better than the previous default (dp_loss)",
                  counts["better_than_dp_loss"], ">=", some),
            *(Check(f"{family}: plan-score Spearman at {max(TARGETS)}x", value, ">=", SPEARMAN_TARGET)
              for family, value in counts["scorer_spearman_at_2x"].items())]


def checks(result: dict[str, Any]) -> list[Check]:
    """The suite's targets on a result's family statistics (recomputed by :func:`summarise_again`)."""
    return stated(overall(result))


def summarise_again(path: str | Path, out: str | None = None) -> dict[str, Any]:
    """Recompute the statistics, verdicts and plot of a stored result from its cells (nothing is measured again)."""
    result = read_json(path)
    result["families"] = [with_statistics(family, result["default"]) for family in result["families"]]
    result["overall"] = overall(result)
    figure = plot(result, results_dir(out) / "prune_quality.png")
    result["plot"] = str(figure) if figure else None
    judge("prune_quality", result)
    write_result("prune_quality", result, out, compress=True)
    return result


# ------------------------------------------------------------------------------------------------------- plot
def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Quality vs measured latency per rule (mean with error bars over seeds), one panel per family and stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = result["families"]
    if not families:
        return None
    fig, axes = plt.subplots(len(families), len(STAGES), figsize=(5 * len(STAGES), 4 * len(families)), squeeze=False)
    for row_axes, family in zip(axes, families):
        metric = family["metric"]
        shown = "ppl" if metric == "loss" else metric
        for ax, stage in zip(row_axes, STAGES):
            for rule in dict.fromkeys(r["rule"] for r in family["rows"]):
                rows = [r for r in family["rows"] if r["rule"] == rule and r["stage"] == stage
                        and r[f"{shown}_mean"] is not None]
                if rows:
                    ax.errorbar([1.0 / r["speedup_mean"] for r in rows], [r[f"{shown}_mean"] for r in rows],
                                yerr=[r[f"{shown}_sd"] for r in rows], marker="o", capsize=3, label=rule)
            ax.axhline(family["baseline"][shown], color="k", ls="--", lw=1, label="baseline")
            ax.set_title(f"{family['family']}: {stage.replace('_', '-')}")
            ax.set_xlabel("measured latency / baseline's (1 / speed-up, same session)")
            ax.set_ylabel(shown)
            if shown == "ppl":
                ax.set_yscale("log")
        row_axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def fmt(value: Any, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def listed(pairs: list[dict[str, Any]], key: str = "rule") -> str:
    """`rule at 1.5x stage, ...` for a list of records with `key` (the rule), target and stage."""
    return ", ".join(f"{n[key]} at {n['target']}x {n['stage']}" for n in pairs)


def markdown(result: dict[str, Any]) -> str:
    if result.get("suite") == "prune_quality_selection":
        return markdown_selection(result)
    parts = []
    for family in result["families"]:
        metric, base, v = family["metric"], family["baseline"], family["verdicts"]
        shown = "ppl" if metric == "loss" else metric
        parts.append(f"#### {family['family']} ({family['task']}; baseline {shown} {fmt(base[shown])} after "
                     f"{base['epochs']} epochs, {family['condition']['device_name']}, batch "
                     f"{family['condition']['batch_size']})\n")
        table = [{"target": r["target"], "rule": r["rule"], "stage": r["stage"],
                  shown: f"{fmt(r[f'{shown}_mean'])} ± {fmt(r[f'{shown}_sd'])}",
                  "agreement %": f"{fmt(r['agreement_mean'], 1)} ± {fmt(r['agreement_sd'], 1)}",
                  "measured speed-up": f"{fmt(r['speedup_mean'], 3)} ± {fmt(r['speedup_sd'], 3)}",
                  "one session": f"{fmt(r['session_speedup_mean'], 3)} ± {fmt(r['session_speedup_sd'], 3)}",
                  "removed": fmt(r["removed_mean"], 1), "search s": fmt(r["search_s_mean"], 1),
                  "seeds": f"{r['seeds']}" + (f" ({r['failed']} failed)" if r["failed"] else "")
                  + (f", {r['off_target']} off target" if r["off_target"] else "")
                  + (f", {r['faster']} faster than the target" if r.get("faster") else "")
                  + (f", {r['interpolated']} interpolated" if r["interpolated"] else "")
                  + (f" ({r['beyond_span']} across a gap > {100 * SPAN:.0f} %)" if r.get("beyond_span") else "")}
                 for r in family["rows"]]
        parts.append(markdown_table(table, ["target", "rule", "stage", shown, "agreement %", "measured speed-up",
                                            "one session", "removed", "search s", "seeds"]))
        comp = [{"vs": c["reference"], "target": c["target"], "stage": c["stage"],
                 "diff (default - rule)": fmt(c["mean"], 3 if metric == "loss" else 2), "test": c["test"],
                 "p": f"{c['p']:.2g}", "p (Holm)": f"{c['p_holm']:.2g}", "verdict": c["verdict"],
                 "plans from target % (default / rule)":
                     f"{fmt(100 * c['span'], 1)} / {fmt(100 * c['reference_span'], 1)}" if "span" in c else ""}
                for c in v["comparisons"]]
        sign = "points of top-1" if metric == "acc1" else "nats per token of validation loss, lower-is-better flipped"
        parts.append(f"\nThe default (`{v['default']}`) against every rule, paired by seed ({sign}; Holm over "
                     f"{len(comp)} comparisons): never significantly worse **{v['never_worse']}**.\n")
        parts.append(markdown_table(comp, ["vs", "target", "stage", "diff (default - rule)", "test", "p", "p (Holm)",
                                           "verdict", "plans from target % (default / rule)"]))
        if v.get("not_compared"):
            parts.append(f"\nNot compared (fewer than 2 seeds where both count at the target): "
                         f"{listed(v['not_compared'])}.")
        if family.get("span_sensitivity"):
            sens = family["span_sensitivity"]
            worse = listed(sens["worse"], "reference") or "none"
            tested = "not tested: nothing compared" if sens["never_worse"] is None else sens["never_worse"]
            parts.append(f"\nSensitivity (not a verdict): without the cells interpolated between plans more than "
                         f"{100 * sens['span']:.0f} % from the target, never significantly worse "
                         f"**{tested}** (worse: {worse}; not compared: "
                         f"{listed(sens['not_compared']) or 'none'}).")
        parts.append("\nPlan scorer (Spearman over every plan: the plan score against the same loss on the validation "
                     "split, against the plain one-shot validation loss, against the metric after the short "
                     "fine-tune; the previous default's surrogate against the plain loss):\n")
        parts.append(markdown_table([{k: fmt(x) for k, x in s.items()} for s in v["scorer"]],
                                    ["target", "plans", "plan_score_spearman", "plain_loss_spearman",
                                     "short_spearman", "surrogate_spearman", "passed"]))
    if result.get("overall"):
        o = result["overall"]
        parts.append(f"\nOverall: never worse {o['never_worse']} (families never worse in the sensitivity analysis: "
                     f"{o.get('never_worse_families_within_span', '-')} of {o['families']}); better than random in "
                     f"{o['better_than_random']} of {o['families']} families; better than greedy in "
                     f"{o['better_than_greedy']}, than the previous "
                     f"default (dp_loss) in {o['better_than_dp_loss']}; scorer Spearman at 2.0x "
                     f"{ {k: fmt(x) for k, x in o['scorer_spearman_at_2x'].items()} }; **passed: {o['passed']}**.")
    return "\n\n".join(parts)


def markdown_selection(result: dict[str, Any]) -> str:
    rules = result["rules"]
    table = [{"family": r["family"], "metric": r["metric"], "target": r["target"], "stage": r["stage"],
              **{rule: fmt(r[rule], 3) for rule in rules}} for r in result["means"]]
    ranks = ", ".join(f"{rule} {fmt(rank)}" for rule, rank in sorted(result["mean_rank"].items(), key=lambda x: x[1]))
    return (markdown_table(table, ["family", "metric", "target", "stage", *rules]) + f"\n\nMean rank: {ranks}. Choice: "
            f"**{result['choice']}**; the default (`{result['default']}`) is the choice: "
            f"**{result['default_is_choice']}**.")
