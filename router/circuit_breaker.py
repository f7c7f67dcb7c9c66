"""Stop calling a cloud tier that keeps failing, and retry only what is safe to retry.

States: closed (calls go through) -> open after `failure_threshold` consecutive health
failures (calls are refused, the router answers locally) -> half-open once `cool_down_s`
has passed (one trial call goes through) -> closed if it succeeds, open again if not.
Rejected credentials (401/403) are different: waiting will not fix them, so the breaker
enters `auth_disabled` and stays there until `reset()` (the router was reconfigured).

Concurrency: every method is synchronous and holds a lock, so the breaker can be shared by
the coroutines of one event loop and by threads; the half-open trial is handed to exactly
one caller of `allow()`. `router.retry.retry_with_backoff` drives a breaker around calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import Enum

from router.failure_kinds import HEALTH_FAILURE_KINDS, FailureKind

logger = logging.getLogger("tandem.router")


class BreakerState(str, Enum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls refused until the cool-down ends
    HALF_OPEN = "half_open"  # one trial call allowed
    AUTH_DISABLED = "auth_disabled"  # credentials rejected; refused until reset()


class CircuitOpenError(Exception):
    """Raised instead of calling the cloud while the breaker refuses calls."""

    def __init__(self, state: BreakerState):
        super().__init__(f"the cloud tier is not being called: circuit breaker is {state.value}")
        self.state = state


class CircuitBreaker:
    """Tracks the cloud tier's health and decides whether the next call may go through."""

    def __init__(
        self,
        failure_threshold: int = 3,  # consecutive health failures that open the breaker
        cool_down_s: float = 30.0,  # how long it stays open before one trial call
        clock: Callable[[], float] = time.monotonic,  # injectable for tests
    ):
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        if not cool_down_s >= 0:
            raise ValueError(f"cool_down_s must be >= 0 seconds, got {cool_down_s}")
        self.failure_threshold = failure_threshold
        self.cool_down_s = cool_down_s
        self._clock = clock
        self._lock = threading.Lock()
        self._reset_locked()

    def _reset_locked(self) -> None:
        self._state = BreakerState.CLOSED
        self._num_consecutive_failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False
        self._trial_started_at = 0.0

    @property
    def state(self) -> BreakerState:
        """The current state; open turns half-open here once the cool-down has passed."""
        with self._lock:
            return self._current_state_locked()

    def _current_state_locked(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.cool_down_s:
            self._state = BreakerState.HALF_OPEN
            self._trial_in_flight = False
        return self._state

    @property
    def auth_disabled(self) -> bool:
        return self.state is BreakerState.AUTH_DISABLED

    @property
    def num_consecutive_failures(self) -> int:
        return self._num_consecutive_failures

    def allow(self) -> bool:
        """May a call go to the cloud now? In half-open, True for one caller only, who must
        then report the outcome (record_success, record_failure or record_abandoned)."""
        with self._lock:
            state = self._current_state_locked()
            if state is BreakerState.CLOSED:
                return True
            # A trial whose outcome never came (a caller that forgot) is given up after a
            # cool-down, so the breaker cannot stay half-open and refusing forever.
            now = self._clock()
            trial_lost = self._trial_in_flight and now - self._trial_started_at >= self.cool_down_s
            if state is BreakerState.HALF_OPEN and (not self._trial_in_flight or trial_lost):
                self._trial_in_flight = True
                self._trial_started_at = now
                return True
            return False

    def record_success(self) -> None:
        """A call succeeded: the tier is healthy (closes a half-open breaker)."""
        with self._lock:
            if self._current_state_locked() is not BreakerState.AUTH_DISABLED:
                self._reset_locked()

    def record_failure(self, kind: FailureKind) -> None:
        """A call failed with this kind; only health failures count towards opening.

        An invalid argument is the request's fault: it neither counts nor resets the count,
        and in half-open it frees the trial for another call, having shown nothing."""
        kind = FailureKind(kind)
        if kind is FailureKind.AUTH:
            self.record_auth_failure(None)
            return
        with self._lock:
            state = self._current_state_locked()
            if state is BreakerState.AUTH_DISABLED:
                return
            if kind not in HEALTH_FAILURE_KINDS:
                self._trial_in_flight = False
                return
            self._num_consecutive_failures += 1
            if state is BreakerState.HALF_OPEN or self._num_consecutive_failures >= self.failure_threshold:
                if state is not BreakerState.OPEN:
                    logger.warning(
                        "cloud tier failing (%d consecutive failures, last: %s): answering locally for %.0fs",
                        self._num_consecutive_failures,
                        kind.value,
                        self.cool_down_s,
                    )
                self._state = BreakerState.OPEN
                self._opened_at = self._clock()
                self._trial_in_flight = False

    def record_abandoned(self) -> None:
        """A call ended without an outcome (cancelled): frees the half-open trial."""
        with self._lock:
            self._trial_in_flight = False

    def record_auth_failure(self, status: int | str | None) -> None:
        """The cloud rejected the credentials (401/403): disable escalation until reset()."""
        with self._lock:
            if self._state is BreakerState.AUTH_DISABLED:
                return  # one log line per disablement, not one per request
            self._state = BreakerState.AUTH_DISABLED
            self._trial_in_flight = False
        # The status only: never the key, the headers or the request.
        logger.warning(
            "cloud escalation disabled: the cloud tier rejected the credentials (%s); "
            "fix the API key or its permissions and reconfigure the router to re-enable it",
            status if status is not None else "unauthenticated",
        )

    def reset(self) -> None:
        """Back to closed with no failures counted: call after reconfiguring the cloud tier."""
        with self._lock:
            self._reset_locked()
