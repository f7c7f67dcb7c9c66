"""A traffic record's rows as a router learns from them (router.prompt_router.training.LabelledRows).

Per recorded request, in arrival order: its prompt-shape features (rows of another
shape_version are skipped: their numbers mean something else), its MiniLM embedding when it
was made by the embedder the router will run (NaN otherwise), and its labels: how right the
local (weak) and the cloud (strong) tier were, the mean over sources where several said
(feedback on the answer, a shadow judgment), NaN where none did. Escalations alone are no
label: they are the router's own decision.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from router.prompt_router.prompt_shape import NUM_SHAPE_FEATURES, SHAPE_VERSION
from router.prompt_router.training import LabelledRows
from sdk.state.declaration import named_rows
from sdk.traffic.store import from_blob
from sdk.traffic.stores import connect


@dataclass
class TrafficRows:
    rows: LabelledRows  # embedding rows are NaN where the record has none from this embedder
    ids: list[str]  # response ids, in arrival order
    labelled_at: np.ndarray  # [n] unix time of the newest label (NaN: unlabelled)
    num_skipped_shape: int  # rows recorded under another shape_version

    @property
    def num_labelled(self) -> int:
        return int((~np.isnan(self.rows.labels).all(1)).sum())


def load_traffic_rows(path: str | os.PathLike, embedder: str | None) -> TrafficRows:
    """Every row of the record at `path`; `embedder` (Embedder.fingerprint) picks which stored vectors count."""
    conn = connect(path, create=False)
    try:
        labels: dict[str, list[tuple]] = {}
        for label in named_rows(conn.execute("SELECT response_id, weak, strong, created_at FROM labels")):
            labels.setdefault(label["response_id"], []).append((label["weak"], label["strong"], label["created_at"]))
        shapes, vectors, tiers, ids, times = [], [], [], [], []
        skipped = 0
        query = "SELECT id, shape, shape_version, embedding, embedder FROM requests ORDER BY created_at"
        for row in named_rows(conn.execute(query)):
            if row["shape"] is None or row["shape_version"] != SHAPE_VERSION:
                skipped += 1
                continue
            shapes.append(from_blob(row["shape"]))
            embedding = row["embedding"]
            vectors.append(from_blob(embedding) if embedding is not None and row["embedder"] == embedder else None)
            said = labels.get(row["id"], [])
            tiers.append([_mean([s[0] for s in said]), _mean([s[1] for s in said])])
            times.append(max((s[2] for s in said), default=np.nan))
            ids.append(row["id"])
    finally:
        conn.close()
    width = next((len(v) for v in vectors if v is not None), 384)
    embedding = np.array([v if v is not None else np.full(width, np.nan) for v in vectors], np.float32).reshape(
        len(ids), width
    )
    rows = LabelledRows(
        np.array(shapes, np.float32).reshape(len(ids), NUM_SHAPE_FEATURES),
        np.array(tiers, np.float64).reshape(len(ids), 2),
        embedding,
    )
    return TrafficRows(rows, ids, np.array(times, np.float64), skipped)


def _mean(values) -> float:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else float("nan")
