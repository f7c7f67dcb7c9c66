"""A request's life inside any tandem engine, and the one table to OpenAI's `finish_reason`."""

from __future__ import annotations

import enum


class RequestStatus(enum.IntEnum):
    """Ordered so that `status >= FINISHED_STOPPED` means finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


# The one place finished states become OpenAI's `finish_reason`.
FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}
