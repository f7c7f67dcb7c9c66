"""The local engine drafting for another model (the device's model drafting the cloud's answer:
sdk.cascade.device_drafts). A drafting request is added with `hold_at` and held once its output reaches
that many tokens (the scheduler takes no step for it); the verifier's verdict then moves it on:

- `rewind`: its output becomes what the verifier kept of it plus the verifier's own tokens, its cells past
  the kept positions are dropped, its grammar and its stop trackers follow the new output, and it drafts on
  from there, held again at the next `hold_at`;
- `hold_further`: the verifier still agrees, so the hold is raised and it drafts on without stopping.

The engine calls these between its steps (sdk.engine_common.async_step_engine posts them to its thread)."""

from __future__ import annotations

from local_runtime.llama_backend import LlamaBackend
from local_runtime.request import Request
from local_runtime.scheduler import Scheduler
from sdk.engine_common.text_stream import TextStream
from sdk.engine_common.token_events import new_repetition_tracker


class Drafting:
    """Moves the engine's drafting requests on after each verdict (module docstring)."""

    def __init__(self, scheduler: Scheduler, backend: LlamaBackend):
        self.scheduler = scheduler
        self.backend = backend

    def rewind(self, request_id: str, keep: int, append: list[int], hold_at: int | None = None) -> bool:
        """The request's output becomes its first `keep` tokens and then `append`, held again once it reaches
        `hold_at`. False when the request is not here (finished or aborted); ValueError for a `keep` past its
        output, or appended tokens its grammar refuses."""
        request = self.scheduler.requests.get(request_id)
        if request is None:
            return False
        if not 0 <= keep <= request.num_output_tokens:
            raise ValueError(f"keep must be within the {request.num_output_tokens} output tokens, got {keep}")
        dropped = request.num_output_tokens - keep
        slot, kept = self.scheduler.rewind(request_id, keep, list(append), hold_at)
        if slot is not None:
            self.backend.drop_positions(slot, kept)
        if request.matcher is not None:
            request.matcher.rollback(dropped)
            for token_id in append:
                if not request.matcher.consume_token(token_id):
                    raise ValueError(f"token {token_id} breaks the request's grammar")
        self._replay_stop_trackers(request)
        return True

    def hold_further(self, request_id: str, hold_at: int) -> bool:
        """The hold raised to `hold_at`. Never lowered (tokens up to the old hold may be decoded already), so it
        is safe while the request decodes. False when the request is not here or drafts for nobody."""
        request = self.scheduler.requests.get(request_id)
        if request is None or request.hold_at is None:
            return False
        request.hold_at = max(request.hold_at, hold_at)
        return True

    def _replay_stop_trackers(self, request: Request) -> None:
        """Stop strings' text buffer and the loop tracker as if the output had always been what it is now."""
        request.text_stream = TextStream(request.params.stop)
        request.repetition = new_repetition_tracker(request.params)
        for token_id in request.output_token_ids:
            request.text_stream.push(self.backend.token_bytes(token_id))
            if request.repetition is not None:
                request.repetition.push(token_id)
