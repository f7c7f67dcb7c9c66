"""The [traffic] settings of `tandem serve`: the record, feedback, shadow sampling and the
background retrain, one validated dataclass (sdk.settings feeds it from the field table)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sdk.traffic.record import TrafficConfig

JUDGES = ("exact_match",)  # or an http(s) base URL of an OpenAI-compatible judge


def default_path() -> str:
    """$TANDEM_DATA_DIR/traffic.sqlite3, else ~/.local/share/tandem/traffic.sqlite3."""
    root = os.environ.get("TANDEM_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".local", "share", "tandem")
    return str(Path(root) / "traffic.sqlite3")


@dataclass(frozen=True)
class TrafficSettings:
    record: bool = False  # the one switch: keep a record of routed requests
    path: str | None = None  # the SQLite file; None: default_path()
    record_text: bool = False
    retention_days: float = 30.0
    max_mb: float = 512.0
    embed: bool = True
    feedback_per_minute: float = 60.0  # POST /v1/feedback per key (per address without keys)
    shadow_fraction: float = 0.0  # share of locally answered requests also sent to the cloud and judged
    shadow_daily_cloud_tokens: int = 200_000  # the shadow calls' cloud tokens per UTC day, at most
    judge: str = "exact_match"  # or the base URL of an OpenAI-compatible judge (https://host/v1)
    judge_model: str | None = None  # the judge endpoint's model id
    judge_api_key: str | None = None
    retrain: bool = False  # retrain the prompt router in the background and swap it in when it does better
    retrain_every_labels: int = 200  # new labels between two retrains
    retrain_holdout_labels: int = 100  # the newest labels, kept out of training to compare old and new
    router_dir: str | None = None  # where retrained routers are written; None: next to the record

    def __post_init__(self):
        if not 0.0 <= self.shadow_fraction <= 1.0:
            raise ValueError(f"shadow_fraction must be in [0, 1], got {self.shadow_fraction}")
        if self.shadow_daily_cloud_tokens < 0 or not self.feedback_per_minute > 0:
            raise ValueError("shadow_daily_cloud_tokens must be >= 0 and feedback_per_minute > 0")
        if self.retrain_every_labels < 1 or self.retrain_holdout_labels < 10:
            raise ValueError("retrain_every_labels must be >= 1 and retrain_holdout_labels >= 10")
        if not self.record and (self.shadow_fraction > 0 or self.retrain or self.record_text):
            raise ValueError("shadow_fraction, retrain and record_text need record = true (they live in the record)")
        if self.judge not in JUDGES:
            parts = urlsplit(self.judge)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"judge must be one of {JUDGES} or an http(s):// base URL, got {self.judge!r}")
            if not self.judge_model:
                raise ValueError("an OpenAI-compatible judge needs judge_model (the model id to ask)")
        self.record_config()  # its own checks

    @property
    def record_path(self) -> str:
        return self.path or default_path()

    @property
    def routers_dir(self) -> str:
        return self.router_dir or str(Path(self.record_path).parent / "routers")

    def record_config(self) -> TrafficConfig:
        return TrafficConfig(self.record_path, self.record_text, self.retention_days, self.max_mb, self.embed)
