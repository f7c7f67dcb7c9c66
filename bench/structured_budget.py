"""bench.structured's budget sweep (issue 41): do structured answers close within max_tokens?

Every schema case (constrained, as bench.structured asks it) and every free json_object prompt
(structured_cases.LOOSE_JSON_PROMPTS) at max_tokens 24, 48 and 96, with the closing path on (the
default) and off (the grammar alone, OpenAI's behaviour). An answer is valid when it ends with
finish_reason "stop" and parses (and fits its schema). `validity_under_budget` counts only the
requests where a valid answer fits: the grammar's shortest completion from the start, plus the end
token, within max_tokens (sdk.engine_common.grammar_closing's own walk measures it); the others are
listed, and each must end at "length" rather than claim completeness.

Cost: each closing-plan search is timed inside the engine (ClosingPaths.seconds): p50/p99 in
microseconds per search, and their sum as a share of the closing-on run's wall time; beside it,
seconds per output token with closing on and off (a ratio inside this machine's noise says
little: the share is the figure to read).
"""

from __future__ import annotations

import json
import statistics

from bench.structured_answers import fits, schema_prompt
from bench.structured_cases import LOOSE_JSON_PROMPTS
from sdk.protocol.engine import StructuredOutput

BUDGETS = (24, 48, 96)


def _jobs(schema_cases, prompts, max_tokens: int, closes: bool) -> tuple[list[tuple], list[tuple]]:
    jobs, meta = [], []
    for i, (name, request, schema) in enumerate(schema_cases):
        jobs.append(
            (schema_prompt(request, schema), StructuredOutput("json_schema", json.dumps(schema)), i, max_tokens, closes)
        )
        meta.append((name, schema))
    for i, prompt in enumerate(prompts):
        jobs.append(
            ([{"role": "user", "content": prompt}], StructuredOutput("json_object"), 100 + i, max_tokens, closes)
        )
        meta.append((f"loose-{i}", {"type": "object"}))
    return jobs, meta


def shortest_tokens(grammar, structured: StructuredOutput) -> int | None:
    """Tokens of the grammar's shortest completion from the start, by the closing walk (None: not found)."""
    state = grammar.matcher(structured)
    plan = grammar.closing_paths.find(state.matcher, state.scan)
    return None if plan is None else len(plan)


def budget_sweep(tier, grammar, schema_cases, prompts=LOOSE_JSON_PROMPTS, budgets=BUDGETS) -> dict:
    """Validity per budget with closing on and off, over the requests a valid answer fits."""
    out: dict = {"budgets": {}, "seconds_per_token": {"on": [], "off": []}}
    search_seconds: list[float] = []
    wall_on = 0.0
    for max_tokens in budgets:
        row: dict = {}
        for closes in (True, False):
            jobs, meta = _jobs(schema_cases, prompts, max_tokens, closes)
            before = len(grammar.closing_paths.seconds) if grammar.closing_paths is not None else 0
            answers, seconds = tier.run(jobs)
            if closes:
                search_seconds += list(grammar.closing_paths.seconds)[before:]
                wall_on += seconds
            out["seconds_per_token"]["on" if closes else "off"].append(seconds / max(1, sum(n for _, _, n in answers)))
            cases = []
            for (name, schema), job, (text, finish, num_tokens) in zip(meta, jobs, answers):
                need = shortest_tokens(grammar, job[1])
                cases.append(
                    {
                        "case": name,
                        "fits": need is not None and need + 1 <= max_tokens,
                        "shortest_tokens": need,
                        "valid": fits(text, finish, schema, free=False),
                        "finish_reason": finish,
                        "tokens": num_tokens,
                        "text": text,
                    }
                )
            fitting = [c for c in cases if c["fits"]]
            row["on" if closes else "off"] = {
                "validity": sum(c["valid"] for c in fitting) / max(1, len(fitting)),
                "num_fitting": len(fitting),
                "unfit_claimed_complete": sum(
                    c["finish_reason"] == "stop" and not c["valid"] for c in cases if not c["fits"]
                ),
                "failures": [c for c in fitting if not c["valid"]],
            }
        out["budgets"][str(max_tokens)] = row
    on = [row["on"] for row in out["budgets"].values()]
    out["validity_under_budget"] = sum(r["validity"] * r["num_fitting"] for r in on) / max(
        1, sum(r["num_fitting"] for r in on)
    )
    off = [row["off"] for row in out["budgets"].values()]
    out["validity_under_budget_closing_off"] = sum(r["validity"] * r["num_fitting"] for r in off) / max(
        1, sum(r["num_fitting"] for r in off)
    )
    micros = sorted(s * 1e6 for s in search_seconds)
    out["closing_search_us"] = {
        "p50": statistics.median(micros) if micros else None,
        "p99": micros[min(len(micros) - 1, int(0.99 * len(micros)))] if micros else None,
        "count": len(micros),
    }
    out["closing_search_share_of_wall"] = sum(search_seconds) / wall_on if wall_on else None
    spt = out["seconds_per_token"]
    out["step_cost_ratio_closing_on_vs_off"] = statistics.median(spt["on"]) / statistics.median(spt["off"])
    return out
