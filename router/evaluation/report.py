"""`tandem eval`'s report: a router against the random router and the oracle, as JSON and a terminal table."""

from __future__ import annotations

import json
import math

from router.evaluation.inputs import LoadedTable, RouterScores
from router.evaluation.metrics import (
    Outcomes,
    evaluate_scores,
    oracle_scores,
    random_curve,
    summarize,
)


def build_report(table: LoadedTable, router: RouterScores, num_seeds: int = 100, seed: int = 0) -> dict:
    """Metrics of `router`, of the random router (the mean curve over `num_seeds` seeds) and of the oracle."""
    outcomes = Outcomes.of(table.examples)
    routers = {}
    if router.name != "random":  # "random" is the baseline itself
        routers[router.name] = evaluate_scores(router.strong_need, outcomes)
    routers["random"] = summarize(random_curve(outcomes, num_seeds, seed), outcomes)
    routers["oracle"] = evaluate_scores(oracle_scores(outcomes), outcomes)
    weak, strong = outcomes.weak, outcomes.strong
    return {
        "router": router.name,
        "num_prompts": int(weak.size),
        "num_dropped_contaminated": table.num_dropped_contaminated,
        "sources": table.sources,
        "weak_acc": outcomes.weak_acc,
        "strong_acc": outcomes.strong_acc,
        "num_only_strong_right": int((strong & ~weak).sum()),
        "num_only_weak_right": int((weak & ~strong).sum()),
        "num_random_seeds": num_seeds,
        "routers": {name: metrics.as_dict() for name, metrics in routers.items()},
    }


def report_json(report: dict) -> str:
    """Strict JSON: NaN (no gap to recover, a level never reached) becomes null."""

    def clean(value):
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, list):
            return [clean(item) for item in value]
        return value

    return json.dumps(clean(report), indent=2)


def print_report(report: dict, console=None) -> None:
    """The metrics per router, then the curves at the deciles, as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    fmt = "{:.3f}".format
    metrics = Table(
        title=f"Routing: {report['router']} on {report['num_prompts']} prompts "
        f"({report['num_dropped_contaminated']} contaminated dropped)",
        caption=f"weak {fmt(report['weak_acc'])}, strong {fmt(report['strong_acc'])}; "
        f"random = mean of {report['num_random_seeds']} seeds",
    )
    cpt_levels = list(next(iter(report["routers"].values()))["cpt"])
    for column in ["router", "AUC", "APGR", *(f"CPT({level})" for level in cpt_levels)]:
        metrics.add_column(column, justify="left" if column == "router" else "right")
    for name, m in report["routers"].items():
        metrics.add_row(name, fmt(m["auc"]), fmt(m["apgr"]), *(fmt(m["cpt"][level]) for level in cpt_levels))
    console.print(metrics)
    curves = Table(title="Quality at each cloud share")
    curves.add_column("cloud share", justify="right")
    for name in report["routers"]:
        curves.add_column(name, justify="right")
    shares = next(iter(report["routers"].values()))["shares"]
    for i, share in enumerate(shares):
        curves.add_row(f"{share:.0%}", *(fmt(m["quality"][i]) for m in report["routers"].values()))
    console.print(curves)
