"""Holding local tokens back from the client until the router may still change its mind.

Restart mode: the cloud answers the original request from scratch, so nothing the
client has already seen may be contradicted. Local tokens are therefore held back
until the decision point: until the request is committed local (`commit_local`), or
until `hold_tokens` tokens have passed the router without an escalation. At that
moment the held tokens are released, and from then on the request is committed
local: escalating would contradict what was sent, so `can_escalate` turns False and
`escalate()` refuses. `hold_tokens=None` holds the whole answer (non-streamed
requests, or a post-generation verifier that must be able to restart).

Continue mode: tokens are released as they come; an escalation hands the cloud the
released (accepted) prefix to continue after, so nothing is contradicted either.

Order of calls per local token: ask the router first (StreamingPolicy/Cascade.observe),
then `push` the token only if it did not escalate. A pushed token has passed the
router; the token that triggered an escalation is never pushed, released or part of
the continue prefix. Pick hold_tokens >= the streaming policy's K in restart mode,
or the decision at token K comes after the window closed.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.decision import HandoffMode
from sdk.protocol.engine import TokenEvent


@dataclass(frozen=True)
class HandoffPlan:
    """What the orchestrator needs to hand a request to the cloud."""

    mode: HandoffMode  # restart: answer the original request; continue: continue after the prefix
    prefix_token_ids: tuple[int, ...] | None  # continue: the local tokens the client has; restart: None
    prefix_text: str | None  # continue: their text (for a cloud model with another tokenizer); restart: None
    num_released_tokens: int  # local tokens the client has received (0 in restart mode)
    num_discarded_tokens: int  # held-back local tokens dropped, never seen by the client


class HoldBackBuffer:
    """Decides which local tokens may reach the client now (module docstring)."""

    def __init__(self, mode: HandoffMode | str, hold_tokens: int | None = None):
        try:
            self.mode = HandoffMode(mode)  # how an escalation hands off to the cloud
        except ValueError:
            raise ValueError(f"mode must be 'restart' or 'continue', got {mode!r}") from None
        if hold_tokens is not None and (
            isinstance(hold_tokens, bool) or not isinstance(hold_tokens, int) or hold_tokens < 0
        ):
            raise ValueError(
                f"hold_tokens must be None (hold until the decision) or an integer >= 0, got {hold_tokens!r}"
            )
        if self.mode is HandoffMode.CONTINUE and hold_tokens:
            raise ValueError(
                "continue mode releases tokens as they come; hold_tokens applies to restart mode only "
                "(leave it None or 0)"
            )
        self.hold_tokens = hold_tokens  # restart: tokens held before committing local; None: until the decision
        self._held: list[TokenEvent] = []
        self._released: list[TokenEvent] = []
        self._closed_by: str | None = None  # "escalate" or "commit_local" once the request is settled

    @property
    def num_held(self) -> int:
        """Local tokens generated but not yet released to the client."""
        return len(self._held)

    @property
    def released_events(self) -> tuple[TokenEvent, ...]:
        """Every event released to the client so far, in order."""
        return tuple(self._released)

    @property
    def can_escalate(self) -> bool:
        """Whether escalate() would succeed: restart mode only while the client has seen nothing."""
        if self._closed_by is not None:
            return False
        return self.mode is HandoffMode.CONTINUE or not self._released

    def push(self, event: TokenEvent) -> list[TokenEvent]:
        """Take a token that passed the router; returns the events safe to release now, in order."""
        if self._closed_by is not None:
            raise RuntimeError(f"the request was settled by {self._closed_by}(); no more local tokens")
        if self.mode is HandoffMode.CONTINUE or self._released:
            self._released.append(event)
            return [event]
        self._held.append(event)
        if self.hold_tokens is not None and len(self._held) >= self.hold_tokens:
            return self._release_held()  # the window passed without escalation: committed local
        return []

    def escalate(self) -> HandoffPlan:
        """Settle the request as escalated; RuntimeError when `can_escalate` is False."""
        if not self.can_escalate:
            if self._closed_by is not None:
                raise RuntimeError(f"the request was already settled by {self._closed_by}()")
            raise RuntimeError(
                f"restart mode committed local after {len(self._released)} tokens reached the client; "
                "a restart would contradict them. Keep the local answer, hold longer (hold_tokens), "
                "or use continue mode"
            )
        self._closed_by = "escalate"
        num_discarded = len(self._held)
        self._held = []
        if self.mode is HandoffMode.RESTART:
            return HandoffPlan(self.mode, None, None, 0, num_discarded)
        return HandoffPlan(
            mode=self.mode,
            prefix_token_ids=tuple(event.token_id for event in self._released),
            prefix_text="".join(event.text for event in self._released),
            num_released_tokens=len(self._released),
            num_discarded_tokens=0,
        )

    def commit_local(self) -> list[TokenEvent]:
        """Settle the request as local; returns the held events, now safe to release."""
        if self._closed_by == "escalate":
            raise RuntimeError("the request was already escalated; its local tokens were discarded")
        self._closed_by = "commit_local"
        return self._release_held()

    def _release_held(self) -> list[TokenEvent]:
        released_now, self._held = self._held, []
        self._released.extend(released_now)
        return released_now
