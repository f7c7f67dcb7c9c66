"""The prompt router out of sample, and learning from an app's labels, on RouteLLM's MMLU tables.

    python -m bench.router_learning [--quick | --smoke] --json bench/results/router_learning.json

The subjects are split once (router.prompt_router.locked_split): every choice is made on the
design subjects; the locked ones are scored once per recipe that ships (bench.router_locked).

1. Zero-shot on the design subjects: every recipe by 4-fold grouped CV (every subject held out
   once per seed; GSM8K always trains), per (seed, fold) APGR, its mean and SE, each paired
   with prompt length on the same folds. Recipes: prompt length, the recipe selected by
   cold_recipe (in sample here: it was chosen on these subjects), the head on every shape
   feature (what shipped before issue 37), the selected head trained for "the weak tier is
   wrong" only, ridge per tier on the MiniLM embedding and on shape + embedding. Then the
   selection procedure nested in the same folds (`design_nested`): its honest estimate.
2. Traffic simulation on the design subjects: per seed, a quarter of them is held out; the
   cold router trains on the rest (+ GSM8K) and the held-out prompts arrive as traffic,
   shuffled (or one subject after another). Feedback on `feedback` of the requests says how
   the tier that answered did (the cold router sends its top `cloud_share` by score to the
   cloud); shadow sampling of `shadow` of the locally answered requests is judged by the
   shipped `exact_match` judge (the local answer only, by agreement with the cloud's) or,
   as a separate setting, by a best-case judge that knows both tiers' truth. Whenever the
   labels reach a checkpoint (a share of the stream's length), each learning method is
   retrained on the labels so far and scores the part of the stream not yet seen, paired
   with the cold router on the same rows. Methods: the shipped one
   (`router.prompt_router.training.fit`: the head refitted on tables + traffic judged on both
   tiers, then the topic correction of its residuals; `tandem router train --from-traffic`),
   the same behind the background retrain's guard (bench.router_simulation.guarded_fit: swapped in
   only when it ranks the newest 100 labels better than the cold router, AUROC for a wrong local
   answer, by more than two paired SEs; and with the one-SE margin it had first), the topic
   correction alone, the head refit alone, a nearest-neighbour memory of residuals (k 50), per-cluster residual means
   (k-means, 15), per-subject residual means (an oracle: the product has no subject ids).
3. The locked subjects: the default router (and the selected recipe beside it), with 10% of
   each subject labelled in a table (`tandem router train --data`), and with 10% labelled by
   traffic under each judge; pooled APGR with its jackknife SE over subjects, per-subject spread.
4. The default cut (bench.router_default_cut): what `cascade.prompt_router = "default"` with
   nothing else set escalates before generation, on the design tables and on the locked subjects,
   and what that buys (the share of the weak-to-strong gap recovered).

Baselines: prompt length on the same rows; the cold router on the same rows (`*_minus_cold`);
a random router is 0.5. Embeddings: the int8 MiniLM export the router runs (cached; minutes
the first time). Writes the JSON and `<stem>.png` (APGR against labels).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bench.machine import report_header, write_report
from bench.router_default_cut import default_cut
from bench.router_locked import (
    LABELLED_SHARE,
    locked_via_traffic,
    locked_with_labelled_tables,
    locked_zero_shot,
    nested_estimate,
)
from bench.router_simulation import CHECKPOINTS, METHODS, MIN_REST, Traffic, labels_to_reach, simulate, summarize_runs
from router.eval_tables import DEFAULT_DATA_DIR, RoutingExample, load_routellm
from router.prompt_router.cold_recipe import DEFAULT, SELECTED
from router.prompt_router.cross_validation import grouped_cv
from router.prompt_router.linear_head import fit_head
from router.prompt_router.locked_split import DEFECTIVE_TABLES, split_rows
from router.prompt_router.training import table_rows

SEEDS, QUICK_SEEDS = tuple(range(20)), tuple(range(6))
CV_SEEDS, QUICK_CV_SEEDS = tuple(range(5)), (0, 1)
SMOKE_SEEDS, SMOKE_CV_SEEDS, SMOKE_EXAMPLES = (0, 1), (0,), 400  # two simulation seeds: a standard error needs two
# --smoke's streams are short (~80-140 prompts): checkpoints up to the headline's 10%, which both seeds reach
# (a checkpoint only one seed reaches has no standard error), and a shorter rest still to come
SMOKE_CHECKPOINTS, SMOKE_MIN_REST = (0.0, 0.05, 0.1), 20
TARGETS = {
    "apgr_locked_test_zero_shot": "above apgr_locked_test_length by more than its SE",
    "apgr_locked_test_at_10pct_labels": 0.60,
    "apgr_locked_test_at_10pct_labels_traffic_minus_length": "at least minus its SE (issue 52: learning never worse)",
}


def zero_shot(examples: list[RoutingExample], embeddings: np.ndarray, seeds) -> dict:
    rows = table_rows(examples)
    lengths = np.array([len(e.prompt) for e in examples], float)
    both = np.hstack([rows.shape, embeddings])

    def ridge(features, weak_only=False, columns=None, alpha=1.0):
        def score(train, held):
            labels = rows.labels[train].copy()
            if weak_only:  # "the weak tier is wrong": a strong tier that is always right
                labels[:, 1] = 1.0
            head = fit_head(features[train], labels[:, 0], labels[:, 1], alpha, features=columns)
            tiers = head.predict(features[held])
            return tiers[:, 1] - tiers[:, 0]

        return score

    recipes = {
        "prompt_length": lambda train, held: lengths[held],
        "selected_recipe": ridge(
            rows.shape, columns=SELECTED.indices, alpha=SELECTED.alpha
        ),  # chosen on these subjects: in sample
        "shape_ridge_all_features": ridge(rows.shape),  # the recipe shipped before issue 37
        "shape_ridge_weak_wrong": ridge(rows.shape, weak_only=True, columns=SELECTED.indices, alpha=SELECTED.alpha),
        "embedding_ridge_per_tier": ridge(embeddings),
        "shape_and_embedding_ridge_per_tier": ridge(both),
    }
    return grouped_cv(examples, recipes, folds=4, seeds=seeds, baseline="prompt_length")


def plot(curves: dict, path: Path) -> None:
    """Per traffic setting (a column): APGR on the rest of the stream (top) and the paired gain
    over the cold router on the same prompts (bottom: what the labels bought), each +-1 SE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {
        "cold": {"color": "grey", "linestyle": "--"},
        "subject_means_oracle": {"color": "black", "linestyle": ":"},
    }
    figure, grid = plt.subplots(2, len(curves), figsize=(6.0 * len(curves), 8.4), squeeze=False, sharex=True)
    try:
        for column, (title, curve) in enumerate(curves.items()):
            shares = [float(s) * 100 for s in curve]
            for row, (key, se_key) in enumerate((("apgr", "apgr_se"), ("minus_cold", "minus_cold_se"))):
                axes = grid[row][column]
                for name in METHODS:
                    means = np.array([entry[name].get(key, 0.0) for entry in curve.values()])
                    ses = np.array([entry[name].get(se_key, 0.0) for entry in curve.values()])
                    line = axes.plot(shares, means, marker="o", markersize=3, label=name, **styles.get(name, {}))[0]
                    axes.fill_between(shares, means - ses, means + ses, alpha=0.12, color=line.get_color())
                if row == 0:
                    axes.axhline(0.60, color="tab:red", linewidth=0.8, label="target 0.60")
                    axes.set_title(title, fontsize="medium")
                    axes.set_ylabel("APGR on the part of the stream not yet seen")
                    axes.legend(fontsize="x-small")
                else:
                    axes.axhline(0.0, color="grey", linewidth=0.8)
                    axes.set_ylabel("minus the cold router, same prompts (paired)")
                    axes.set_xlabel("labels so far, % of the stream's length")
                axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(path, dpi=100)
    finally:
        plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument(
        "--quick", action="store_true", help=f"{len(QUICK_SEEDS)} simulation seeds, {len(QUICK_CV_SEEDS)} CV seeds"
    )
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--feedback", type=float, default=Traffic.feedback)
    parser.add_argument("--shadow", type=float, default=Traffic.shadow)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"only checks that the bench works ({SMOKE_EXAMPLES} table rows, "
        f"{len(SMOKE_SEEDS)} simulation seeds, 1 CV seed): figures meaningless",
    )
    args = parser.parse_args()

    from router.prompt_router.embeddings import cached_embeddings

    start = time.perf_counter()
    header = report_header(
        "router_learning", smoke=args.smoke
    )  # before the plot is written: the commit of the code, not "+dirty" from our own PNG
    examples = list(load_routellm(args.data_dir))
    if args.smoke:
        from bench.prompt_router import smoke_examples

        examples = smoke_examples(examples, SMOKE_EXAMPLES)
    embeddings = cached_embeddings(
        [e.prompt for e in examples]
    )  # every table row, as before the split: one cache entry
    design_rows, locked_rows = split_rows(examples)
    design, locked = [examples[i] for i in design_rows], [examples[i] for i in locked_rows]
    design_embeddings, locked_embeddings = embeddings[design_rows], embeddings[locked_rows]
    seeds, cv_seeds = (
        (SMOKE_SEEDS, SMOKE_CV_SEEDS)
        if args.smoke
        else (QUICK_SEEDS, QUICK_CV_SEEDS)
        if args.quick
        else (SEEDS, CV_SEEDS)
    )
    checkpoints, min_rest = (SMOKE_CHECKPOINTS, SMOKE_MIN_REST) if args.smoke else (CHECKPOINTS, MIN_REST)

    # 1. design subjects only: every recipe by grouped CV, and the recipe procedure's nested estimate
    cold_start = zero_shot(design, design_embeddings, cv_seeds)
    nested = nested_estimate(design, cv_seeds)
    print("zero-shot (design):", {name: round(r["apgr"], 4) for name, r in cold_start["recipes"].items()}, flush=True)
    print("nested:", {k: v for k, v in nested.items() if k.endswith(("apgr", "minus_length"))}, flush=True)

    # 2. the traffic simulation on the design subjects
    settings = {
        "shuffled": Traffic(args.feedback, args.shadow),
        "shuffled_best_case_judge": Traffic(args.feedback, args.shadow, judge="best_case"),
        "shuffled_feedback_only": Traffic(args.feedback + args.shadow, 0.0),
        "shuffled_shadow_only": Traffic(0.0, args.feedback + args.shadow),
        "subject_blocked": Traffic(args.feedback, args.shadow, blocked=True),
    }
    curves = {}
    for name, traffic in settings.items():
        curves[name] = summarize_runs(
            [
                simulate(design, design_embeddings, seed, traffic, checkpoints=checkpoints, min_rest=min_rest)
                for seed in seeds
            ]
        )
        print(name, {share: round(entry["shipped"]["apgr"], 4) for share, entry in curves[name].items()}, flush=True)
    headline = curves["shuffled"]["0.1"]["shipped"]
    best_case = curves["shuffled_best_case_judge"]["0.1"]["shipped"]

    # 3. the locked subjects, each shipped recipe scored once
    locked_cold = locked_zero_shot(design, locked)
    label_seeds = seeds[: len(QUICK_SEEDS)]
    with_tables = locked_with_labelled_tables(design, locked, locked_embeddings, label_seeds)
    via_traffic = {
        judge: locked_via_traffic(
            design, locked, locked_embeddings, label_seeds, Traffic(args.feedback, args.shadow, judge=judge)
        )
        for judge in ("exact_match", "best_case")
    }
    chosen = locked_cold["length" if DEFAULT.is_length else "selected_recipe"]  # the recipe the default router uses
    print(
        "locked:",
        {
            "zero_shot": round(chosen["apgr"], 4),
            "length": round(locked_cold["length"]["apgr"], 4),
            "tables_10pct": round(with_tables["apgr"], 4),
            "traffic_10pct": {
                j: (round(v["apgr"], 4), round(v["unguarded"]["apgr"], 4)) for j, v in via_traffic.items()
            },
        },
        flush=True,
    )

    # 4. the shipped router's cut with nothing set (the score scale fixes it: no tuning)
    cut = default_cut({"design": design, "locked": locked})
    print("default cut:", {name: round(cut[name]["cloud_share"], 4) for name in ("design", "locked")}, flush=True)

    png = Path(args.json).with_suffix(".png")
    plot(
        {
            f"{name}: feedback {t.feedback:.0%}, shadow {t.shadow:.0%}, judge {t.judge}": curves[name]
            for name, t in settings.items()
            if name in ("shuffled", "shuffled_best_case_judge", "subject_blocked")
        },
        png,
    )
    report = {
        **header,
        "quick": args.quick,
        "baseline": "prompt length on the same rows (zero-shot, locked); "
        "the cold router on the same unseen rows (simulation)",
        "locked_subjects": sorted({e.source for e in locked}),
        "design_subjects": sorted({e.source for e in design}),
        "defective_tables": DEFECTIVE_TABLES,
        # the locked subjects, scored once per recipe that ships (pooled APGR, SE: jackknife over subjects)
        "apgr_locked_test_zero_shot": chosen["apgr"],
        "apgr_locked_test_zero_shot_se": chosen["apgr_se"],
        "apgr_locked_test_zero_shot_minus_length": chosen["minus_length"],
        "apgr_locked_test_zero_shot_minus_length_se": chosen["minus_length_se"],
        "apgr_locked_test_zero_shot_interval": [
            chosen["apgr"] - chosen["apgr_se"],
            chosen["apgr"] + chosen["apgr_se"],
        ],  # +- 1 SE
        "apgr_locked_test_zero_shot_per_subject": chosen["per_subject"],
        "apgr_locked_test_selected_recipe": locked_cold["selected_recipe"]["apgr"],
        "apgr_locked_test_selected_recipe_minus_length": locked_cold["selected_recipe"]["minus_length"],
        "apgr_locked_test_selected_recipe_minus_length_se": locked_cold["selected_recipe"]["minus_length_se"],
        "apgr_locked_test_length": locked_cold["length"]["apgr"],
        "apgr_locked_test_length_se": locked_cold["length"]["apgr_se"],
        "apgr_locked_test_length_per_subject": locked_cold["length"]["per_subject"],
        "apgr_locked_test_at_10pct_labels": with_tables["apgr"],
        "apgr_locked_test_at_10pct_labels_se": with_tables["apgr_se"],
        "apgr_locked_test_at_10pct_labels_interval": [
            with_tables["apgr"] - with_tables["apgr_se"],
            with_tables["apgr"] + with_tables["apgr_se"],
        ],
        "apgr_locked_test_at_10pct_labels_minus_length": with_tables["minus_length"],
        "apgr_locked_test_at_10pct_labels_minus_length_se": with_tables["minus_length_se"],
        "apgr_locked_test_at_10pct_labels_data": with_tables,
        "apgr_locked_test_at_10pct_labels_traffic": via_traffic["exact_match"]["apgr"],
        "apgr_locked_test_at_10pct_labels_traffic_se": via_traffic["exact_match"]["apgr_se"],
        "apgr_locked_test_at_10pct_labels_traffic_interval": [
            via_traffic["exact_match"]["apgr"] - via_traffic["exact_match"]["apgr_se"],
            via_traffic["exact_match"]["apgr"] + via_traffic["exact_match"]["apgr_se"],
        ],
        "apgr_locked_test_at_10pct_labels_traffic_minus_length": via_traffic["exact_match"]["minus_length"],
        "apgr_locked_test_at_10pct_labels_traffic_minus_length_se": via_traffic["exact_match"]["minus_length_se"],
        "apgr_locked_test_at_10pct_labels_traffic_best_case_judge": via_traffic["best_case"]["apgr"],
        "apgr_locked_test_at_10pct_labels_traffic_unguarded": via_traffic["exact_match"]["unguarded"]["apgr"],
        "apgr_locked_test_at_10pct_labels_traffic_unguarded_best_case_judge": via_traffic["best_case"]["unguarded"][
            "apgr"
        ],
        # `cascade.prompt_router = "default"`, nothing else set: the share escalated before generation
        "prompt_router_default_cloud_share_design": cut["design"]["cloud_share"],
        "prompt_router_default_cloud_share_locked": cut["locked"]["cloud_share"],
        "prompt_router_default_cut": cut,
        "locked_test": {
            "zero_shot": locked_cold,
            "labelled_tables": with_tables,
            "traffic": via_traffic,
            "labelled_share": LABELLED_SHARE,
            "seeds": list(label_seeds),
        },
        # the design subjects (every choice was made here)
        "apgr_design_nested_zero_shot": nested["pooled_apgr"],
        "apgr_design_nested_zero_shot_minus_length": nested["pooled_minus_length"],
        "apgr_design_nested_zero_shot_minus_length_se": nested["pooled_minus_length_se"],
        "design_nested": nested,
        "apgr_prompt_length_unseen": cold_start["recipes"]["prompt_length"]["apgr"],
        "apgr_at_10pct_labels": headline["apgr"],
        "apgr_at_10pct_labels_se": headline["apgr_se"],
        "apgr_at_10pct_labels_minus_cold": headline["minus_cold"],
        "apgr_at_10pct_labels_minus_cold_se": headline["minus_cold_se"],
        "apgr_at_10pct_labels_guarded": curves["shuffled"]["0.1"]["shipped_guarded"]["apgr"],
        "apgr_at_10pct_labels_guarded_minus_cold": curves["shuffled"]["0.1"]["shipped_guarded"]["minus_cold"],
        "apgr_at_10pct_labels_guarded_minus_cold_se": curves["shuffled"]["0.1"]["shipped_guarded"]["minus_cold_se"],
        "apgr_at_10pct_labels_guarded_1se_minus_cold": curves["shuffled"]["0.1"]["shipped_guarded_1se"]["minus_cold"],
        "apgr_at_10pct_labels_guarded_1se_minus_cold_se": (
            curves["shuffled"]["0.1"]["shipped_guarded_1se"]["minus_cold_se"]
        ),
        "apgr_at_10pct_labels_best_case_judge": best_case["apgr"],
        "apgr_at_10pct_labels_best_case_judge_se": best_case["apgr_se"],
        "labels_to_reach_0_60": labels_to_reach(curves["shuffled"], "shipped"),
        "targets": TARGETS,
        "zero_shot": cold_start,
        "simulation": {
            "seeds": list(seeds),
            "held_out_subject_share": 0.25,
            "checkpoints": list(checkpoints),
            "min_rest": min_rest,
            "settings": {name: t.__dict__ for name, t in settings.items()},
            "curves": curves,
        },
        "plot": str(png),
        "seconds": time.perf_counter() - start,
    }
    # None there means no checkpoint reached 0.60: a finding (as in --smoke's small tables), not a broken run, so
    # the figure is checked as a headline only when it is a number
    reached = ("labels_to_reach_0_60",) if report["labels_to_reach_0_60"] is not None else ()
    write_report(
        args.json,
        report,
        (
            "apgr_locked_test_zero_shot",
            "apgr_locked_test_zero_shot_se",
            "apgr_locked_test_length",
            "apgr_locked_test_at_10pct_labels",
            "apgr_locked_test_at_10pct_labels_se",
            "apgr_locked_test_at_10pct_labels_traffic",
            "apgr_design_nested_zero_shot",
            "apgr_at_10pct_labels",
            "apgr_at_10pct_labels_best_case_judge",
        )
        + reached,
    )


if __name__ == "__main__":
    main()
