"""bench.router_learning's figures of the shipped prompt router's cut: what `cascade.prompt_router =
"default"` escalates before generation with nothing else set (the shipped router file, the
cascade's default threshold, the cascade's own pre-generation policy), on the design tables and
on the locked subjects, and at a few other thresholds.

The cut was not tuned: the score is the share of the design tables' prompts the router ranks lower
(router.prompt_router.score_scale), so a threshold t sends the top t of them to the cloud, and the
default threshold is the cascade's (0.5). On the design tables the share is t by construction (up
to prompts of one length, which share one score); on the locked subjects it is what it is (more:
professional law, long prompts, is close to half of them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.eval_tables import RoutingExample
from router.pre_generation import PromptRouterPolicy, RequestContext
from router.prompt_router.scorer import load_scorer
from sdk.cascade.config import CascadeConfig

THRESHOLDS = (0.1, 0.2, 0.3, 0.5)


def routed(escalated: np.ndarray, examples: Sequence[RoutingExample]) -> dict:
    """The cloud share of a routing and what it buys: accuracy of the answers given, and the share of
    the weak-to-strong gap it recovers."""
    weak = np.array([e.weak_correct for e in examples], float)
    strong = np.array([e.strong_correct for e in examples], float)
    accuracy = float(np.where(escalated, strong, weak).mean())
    gap = strong.mean() - weak.mean()
    return {
        "cloud_share": float(np.mean(escalated)),
        "accuracy": accuracy,
        "weak_accuracy": float(weak.mean()),
        "strong_accuracy": float(strong.mean()),
        "recovered_gap": float((accuracy - weak.mean()) / gap) if gap else float("nan"),
        "num_prompts": len(examples),
    }


def default_cut(tables: dict[str, Sequence[RoutingExample]]) -> dict:
    """{"threshold": the default, name: {figures at the default}, "by_threshold": {t: {name: figures}}}
    for each table set in `tables`, each prompt put through PromptRouterPolicy as a request is."""
    scorer = load_scorer()  # the shipped file, as `cascade.prompt_router = "default"` loads it
    default = CascadeConfig().default_threshold  # model "auto" with prompt_router_threshold unset
    scores = {name: scorer.score([e.prompt for e in examples]) for name, examples in tables.items()}
    by_threshold = {}
    for threshold in sorted({*THRESHOLDS, default}):
        entry = {}
        for name, examples in tables.items():
            by_prompt = dict(zip((e.prompt for e in examples), scores[name]))
            policy = PromptRouterPolicy(by_prompt.__getitem__, threshold)
            escalated = np.array([policy.decide(RequestContext(e.prompt)) is not None for e in examples])
            entry[name] = routed(escalated, examples)
        by_threshold[f"{threshold:g}"] = entry
    return {
        "threshold": default,
        **by_threshold[f"{default:g}"],
        "by_threshold": by_threshold,
        "router": "the shipped router/prompt_router/default_router.onnx",
        "score_scale_reference": scorer.metadata["score_scale"]["reference"],
    }
