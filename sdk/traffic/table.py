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
from sdk.state.declaration import named_rows
from sdk.state.tables.traffic import REQUESTS
from sdk.traffic.stores import connect, described

COLUMNS = (  # a request's columns a routing example carries
    "router_score",
    "confidence",
    "local_prompt_tokens",
    "local_completion_tokens",
    "cloud_prompt_tokens",
    "cloud_completion_tokens",
)
QUERY = f"""
SELECT r.id, avg(l.weak) AS weak, avg(l.strong) AS strong, {REQUESTS.select_list(COLUMNS, prefix="r.")}
FROM requests r JOIN labels l ON l.response_id = r.id
GROUP BY r.id HAVING count(l.weak) > 0 AND count(l.strong) > 0
ORDER BY r.created_at
"""


def traffic_table(path: str | os.PathLike) -> LoadedTable:
    conn = connect(path, create=False)
    try:
        rows = list(named_rows(conn.execute(QUERY)))
    finally:
        conn.close()
    examples = [
        RoutingExample(
            row["id"],
            row["weak"] >= 0.5,
            row["strong"] >= 0.5,
            "traffic",
            {name: row[name] for name in COLUMNS if row[name] is not None},
        )
        for row in rows
    ]
    if not examples:
        raise ValueError(
            f"{described(path)}: no request there has both tiers judged (shadow samples); calibrating needs them "
            "([traffic] shadow_fraction > 0, or a table from `tandem eval --live`)"
        )
    return LoadedTable(examples, 0, [f"traffic:{described(path)}"])
