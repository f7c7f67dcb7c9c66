"""A traffic record as a routing table (router.eval_tables' RoutingExample rows), for
`tandem calibrate --from-traffic`: the requests whose two tiers were both judged (shadow
samples), each labelled right when its judged score is at least 0.5, with the columns a
router can be read from (router_score: the prompt router's need for the cloud; confidence:
the cascade's) and the token counts calibrate prices. The prompt is the response id: the
record keeps no text unless told to."""

from __future__ import annotations

import os

from router.eval_tables import RoutingExample
from router.evaluation.inputs import LoadedTable
from sdk.traffic.stores import connect, described

QUERY = """
SELECT r.id, avg(l.weak), avg(l.strong), r.router_score, r.confidence, r.local_prompt_tokens, r.local_completion_tokens,
       r.cloud_prompt_tokens, r.cloud_completion_tokens
FROM requests r JOIN labels l ON l.response_id = r.id
GROUP BY r.id HAVING count(l.weak) > 0 AND count(l.strong) > 0
ORDER BY r.created_at
"""
COLUMNS = (
    "router_score",
    "confidence",
    "local_prompt_tokens",
    "local_completion_tokens",
    "cloud_prompt_tokens",
    "cloud_completion_tokens",
)


def traffic_table(path: str | os.PathLike) -> LoadedTable:
    conn = connect(path, create=False)
    try:
        rows = conn.execute(QUERY).fetchall()
    finally:
        conn.close()
    examples = [
        RoutingExample(
            response_id,
            weak >= 0.5,
            strong >= 0.5,
            "traffic",
            {name: value for name, value in zip(COLUMNS, rest) if value is not None},
        )
        for response_id, weak, strong, *rest in rows
    ]
    if not examples:
        raise ValueError(
            f"{described(path)}: no request there has both tiers judged (shadow samples); calibrating needs them "
            "([traffic] shadow_fraction > 0, or a table from `tandem eval --live`)"
        )
    return LoadedTable(examples, 0, [f"traffic:{described(path)}"])
