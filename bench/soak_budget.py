"""The soak with budgets on (`python -m bench.soak --budget-usd-per-day X`): does the spend the
server persists add up, to the cent and below, to what each request cost?

The started `tandem serve` gets a config with cloud prices, a budgets file with a hard
`usd_per_day` for every key, and a spend ledger in a temporary folder. Every valid request
carries `user: soak-<index>`, so the ledger keeps one row per request beside the key's own
total. After the server has stopped (its ledger closed), the SQLite file is read back:

- drift: the key's persisted total less the sum of the per-request rows (target 0: one write
  each, none dropped or doubled);
- mismatched: completed requests whose persisted cost differs from the cost their response
  reported in `tandem.cost` (target 0);
- within the limit: the key's total <= the budget (the reservation bound; sdk.budgets.manager);
- what cancelled requests were billed (the client never sees their cost; the ledger does).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bench.soak_client import SoakResult
from bench.soak_workload import SoakRequest

PRICES = {"input_per_million": 1000.0, "output_per_million": 2000.0}  # high, so a soak reaches a small budget
TOLERANCE_USD = 1e-9  # float sums of a few thousand costs


def write_budget_config(folder: Path, usd_per_day: float) -> dict:
    """The server's config and budgets files in `folder`; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    budgets, spend, config = folder / "budgets.toml", folder / "spend.sqlite3", folder / "tandem.toml"
    budgets.write_text(f"[default]\nusd_per_day = {usd_per_day!r}\n")
    prices = ", ".join(f"{k} = {v!r}" for k, v in PRICES.items())
    config.write_text(
        f'[server]\nbudgets_file = "{budgets}"\nspend_path = "{spend}"\n\n[cascade.prices]\ncloud = {{ {prices} }}\n'
    )
    return {"config": str(config), "budgets_file": str(budgets), "spend_path": str(spend)}


def bill_per_request(requests: list[SoakRequest]) -> None:
    """Give every valid request a `user` of its own: the ledger then keeps its cost in a row."""
    for req in requests:
        if req.expect_status == 200:
            req.body["user"] = user_of(req.index)


def user_of(index: int) -> str:
    return f"soak-{index}"


def persisted_spend(spend_path: str) -> dict[str, float]:
    """USD per scope, summed over the day periods (a soak may cross UTC midnight)."""
    with sqlite3.connect(f"file:{spend_path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT scope, SUM(usd) FROM spend WHERE period LIKE 'day:%' GROUP BY scope").fetchall()
    return {scope: usd for scope, usd in rows}


def budget_report(
    spend_path: str, usd_per_day: float, requests: list[SoakRequest], results: list[SoakResult | None]
) -> dict:
    spend = persisted_spend(spend_path)
    keys = {scope: usd for scope, usd in spend.items() if scope.startswith("key:")}
    users = {scope.rpartition(":")[2]: usd for scope, usd in spend.items() if scope.startswith("user:")}
    key_total = sum(keys.values())
    per_request_total = sum(users.values())
    by_index = {r.index: r for r in results if r is not None}
    completed = [r for r in by_index.values() if r.outcome == "completed"]
    mismatched = [
        {"index": r.index, "response_usd": r.cost_usd, "persisted_usd": users.get(user_of(r.index))}
        for r in completed
        if r.cost_usd is not None and abs(users.get(user_of(r.index), 0.0) - r.cost_usd) > TOLERANCE_USD
    ]
    cancelled = [r for r in by_index.values() if r.outcome == "cancelled_by_client"]
    drift = key_total - per_request_total
    return {
        "usd_per_day": usd_per_day,
        "prices_cloud": PRICES,
        "spend_path": spend_path,
        "persisted_key_total_usd": key_total,
        "persisted_per_request_sum_usd": per_request_total,
        "drift_usd": drift,
        "responses_total_usd": sum(r.cost_usd or 0.0 for r in completed),
        "cancelled_billed_usd": sum(users.get(user_of(r.index), 0.0) for r in cancelled),
        "requests_with_a_row": len(users),
        "completed_without_cost_in_response": sum(r.cost_usd is None for r in completed),
        "mismatched_requests": len(mismatched),
        "mismatched_samples": mismatched[:10],
        "refused_by_budget": sum(r.outcome == "refused_by_budget" for r in by_index.values()),
        "kept_local_budget_exhausted": sum(r.degraded_reason == "budget_exhausted" for r in completed),
        "targets": {
            "no_drift": abs(drift) <= TOLERANCE_USD,
            "responses_match_ledger": not mismatched,
            "within_limit": key_total <= usd_per_day + TOLERANCE_USD,
        },
    }
