"""What makes a report unfit to write: a headline figure missing, NaN, infinite or None, or failed
requests. A bench that cannot produce its headline figure exits non-zero instead of writing NaN
(a stale or broken bench then fails CI's smoke run instead of publishing garbage)."""

from __future__ import annotations

import math


def _bad_values(value, path: str) -> list[str]:
    """Paths under `value` that hold NaN, an infinity or None."""
    if value is None:
        return [f"{path} is None"]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{path} is {value}"]
    if isinstance(value, dict):
        return [problem for key, item in value.items() for problem in _bad_values(item, f"{path}.{key}")]
    if isinstance(value, (list, tuple)):
        return [problem for i, item in enumerate(value) for problem in _bad_values(item, f"{path}.{i}")]
    return []


def headline_problems(report: dict, headline_keys: tuple[str, ...]) -> list[str]:
    """Why the headline figures of `report` cannot be published (empty when they can).

    A report may also carry `failed_requests` (an int): any failed request is a problem, because a
    figure measured over the requests that happened to succeed is not the figure the bench names."""
    problems = [f"headline key {key!r} is missing" for key in headline_keys if key not in report]
    problems += [problem for key in headline_keys if key in report for problem in _bad_values(report[key], key)]
    failed = report.get("failed_requests", 0)
    if failed:
        problems.append(f"{failed} request(s) failed (failed_requests)")
    return problems
