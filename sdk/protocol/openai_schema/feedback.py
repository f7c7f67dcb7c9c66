"""POST /v1/feedback (a tandem extension): how right a routed answer was, from the app that got it.

A score in [0, 1] or thumbs up (1) / down (0), for a response id the same API key received.
It labels the tier that answered (the traffic record keeps one label per response: a repeat
replaces it). Unknown fields are refused by name, like every other tandem body."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str  # the `id` of the chat.completion (or of its chunks) being judged
    score: float | int | None = None  # 0 (wrong or useless) .. 1 (right)
    thumbs: Literal["up", "down"] | None = None  # or this: up = 1, down = 0

    @model_validator(mode="after")
    def _one_verdict(self) -> FeedbackRequest:
        if not self.id.strip():
            raise ValueError("id must name a response (the `id` of a chat.completion)")
        if (self.score is None) == (self.thumbs is None):
            raise ValueError("send exactly one of score (0..1) and thumbs (up/down)")
        if self.score is not None and (
            isinstance(self.score, bool) or not math.isfinite(self.score) or not 0 <= self.score <= 1
        ):
            raise ValueError(f"score must be a number in [0, 1], got {self.score!r}")
        return self

    @property
    def value(self) -> float:
        return float(self.score) if self.score is not None else (1.0 if self.thumbs == "up" else 0.0)


class FeedbackResponse(BaseModel):
    object: Literal["feedback"] = "feedback"
    id: str
    score: float
    recorded: bool  # False: the response was privacy-flagged, so nothing about it is stored
    tier: str | None = None  # the tier the label went to (local or cloud)
    reason: str | None = None  # why it was not recorded
