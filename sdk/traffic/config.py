"""The [traffic] settings of `tandem serve`: the record, feedback, shadow sampling and the
background retrain, one validated dataclass whose fields declare the [traffic] settings
(sdk.protocol.config_fields; env variables TANDEM_TRAFFIC_<KEY>)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sdk.data_dir import data_path
from sdk.protocol.config_fields import at_least, setting
from sdk.traffic.record import TrafficConfig

JUDGES = ("exact_match",)  # or an http(s) base URL of an OpenAI-compatible judge


def default_path() -> str:
    """$TANDEM_DATA_DIR/traffic.sqlite3, else ~/.local/share/tandem/traffic.sqlite3."""
    return data_path("traffic.sqlite3")


@dataclass(frozen=True)
class TrafficSettings:
    record: bool = setting(  # the one switch
        False,
        "Keep a record of routed requests (SQLite): router features, tier, signals, cost, latency, labels; never text "
        "unless record_text.",
    )
    path: str | None = setting(  # None: default_path()
        None,
        "The record's SQLite file. With state_db set ([server]), the record is kept in that database, shared by the "
        "replicas, and path stays unset.",
        unset="$TANDEM_DATA_DIR/traffic.sqlite3, else ~/.local/share/tandem/traffic.sqlite3",
    )
    record_text: bool = setting(False, "Also keep prompt and answer text (privacy-flagged requests are never stored).")
    retention_days: float = setting(
        30.0, "Rows older than this are deleted (hourly).", check=at_least(0, inclusive=False)
    )
    max_mb: float = setting(512.0, "Largest record; past it the oldest rows are deleted.", check=at_least(1))
    embed: bool = setting(
        True,
        "Store a MiniLM embedding of each recorded prompt (what a router learns topics from; ~10-20 ms of CPU per "
        "request, off the request path).",
    )
    feedback_per_minute: float = setting(
        60.0,
        "POST /v1/feedback calls a minute per key (per client address without keys).",
        check=at_least(0, inclusive=False),
    )
    shadow_fraction: float = setting(
        0.0,
        "Share of locally answered requests also sent to the cloud in the background, both answers judged (never "
        "privacy-flagged ones).",
        check=at_least(0, high=1),
    )
    shadow_daily_cloud_tokens: int = setting(
        200_000, "Cloud tokens shadow calls may use per UTC day (reserved before each call).", check=at_least(0)
    )
    judge: str = setting(
        "exact_match",
        "How shadow answers are judged: exact_match (final answers compared, the cloud's as reference) or the base URL "
        "of an OpenAI-compatible judge.",
    )
    judge_model: str | None = setting(None, "The judge endpoint's model id.", unset="none (needed with a judge URL)")
    judge_api_key: str | None = setting(None, "Key presented to the judge endpoint.", unset="no key sent", secret=True)
    retrain: bool = setting(
        False,
        "Retrain the prompt router from the record in the background; swap it in when it beats the serving one on the "
        "newest labels.",
    )
    retrain_every_labels: int = setting(200, "New labels between two background retrains.", check=at_least(1))
    retrain_check_s: float = setting(
        60.0,
        "Seconds between the background retrain's checks for new labels (and, with state_db, for a router another "
        "replica swapped in).",
        check=at_least(1),
    )
    retrain_holdout_labels: int = setting(
        100, "The newest labels kept out of a retrain to compare the two routers.", check=at_least(10)
    )
    router_dir: str | None = setting(
        None,
        "Where retrained routers are written (latest.onnx is the newest swapped in).",
        unset="routers/ next to the record",
    )

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

    def record_config(self, target: str | None = None) -> TrafficConfig:
        """The record's settings; `target`: where it goes instead of record_path (the state database's URL)."""
        return TrafficConfig(target or self.record_path, self.record_text, self.retention_days, self.max_mb, self.embed)
