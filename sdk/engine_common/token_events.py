"""What both engines do after sampling a token: check its stop conditions and build its event.

Shared so that the local and cloud tiers stop at exactly the same places and report
the same fields; the engines differ only in how they map a token id to bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from sdk.protocol.engine import SamplingParams, TokenEvent, TopLogprob
from sdk.engine_common.grammar_closing import CLOSED_WITHIN_MAX_TOKENS
from sdk.engine_common.repetition import STOP_LOOP, RepetitionTracker
from sdk.protocol.request_status import RequestStatus
from sdk.engine_common.text_stream import TextStream


class GeneratingRequest(Protocol):
    request_id: str
    params: SamplingParams
    text_stream: TextStream
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_tokens: int
    repetition: RepetitionTracker | None  # set when params.stops_loops (see new_repetition_tracker)
    stop_reason: str | None  # "repetition" once a loop stopped the request
    matcher: object | None  # a structured request's sdk.engine_common.grammar_closing.StructuredState
    num_draft_tokens: int  # speculative decoding's totals so far (zero without it)
    num_accepted_tokens: int


def new_repetition_tracker(params: SamplingParams) -> RepetitionTracker | None:
    """What a request keeps for check_stop's loop test: a tracker when the request stops loops."""
    return RepetitionTracker() if params.stops_loops else None


@dataclass
class SampledToken:
    """What a sampler returns per row: the chosen token and the signals of the distribution it came from."""

    token_id: int
    logprob: float
    entropy: float
    margin: float
    top_ids: list[int]  # alternatives, most likely first
    top_logprobs: list[float]
    # A sampled token's distribution, when asked for (a drafting request's): (token ids, probabilities).
    support: tuple[tuple[int, ...], tuple[float, ...]] | None = None


def check_stop(
    request: GeneratingRequest,
    token_id: int,
    token_bytes: bytes,
    is_end_of_generation: bool,
    max_model_len: int,
    num_output_tokens: int | None = None,
) -> tuple[str, RequestStatus | None]:
    """The text this (already appended) token makes final, and the finished status if it ends the request.

    `num_output_tokens`: the request's output length as of this token, when later tokens are
    already appended too (a speculative run checks its tokens one by one)."""
    params = request.params
    if num_output_tokens is None:
        num_output_tokens = request.num_output_tokens
    if (not params.ignore_eos and is_end_of_generation) or token_id in params.stop_token_ids:
        if request.matcher is not None and request.matcher.closed:
            request.stop_reason = CLOSED_WITHIN_MAX_TOKENS  # complete, but tandem chose how it closed
        return request.text_stream.flush(), RequestStatus.FINISHED_STOPPED
    text = request.text_stream.push(token_bytes)
    if request.text_stream.stopped:
        return text, RequestStatus.FINISHED_STOPPED
    if num_output_tokens >= params.max_tokens or request.num_prompt_tokens + num_output_tokens >= max_model_len:
        return text + request.text_stream.flush(), RequestStatus.FINISHED_LENGTH
    if request.repetition is not None:
        request.repetition.push(token_id)
        if request.repetition.loop(STOP_LOOP) is not None:
            # "length": the answer was cut short, as at max_tokens; stop_reason says why.
            request.stop_reason = "repetition"
            return text + request.text_stream.flush(), RequestStatus.FINISHED_LENGTH
    return text, None


def make_token_event(
    request: GeneratingRequest,
    token: SampledToken,
    text: str,
    token_bytes: Callable[[int], bytes],
    token_text: Callable[[int], str],
    num_output_tokens: int | None = None,
    forced: bool = False,
) -> TokenEvent:
    """The event for a sampled token, after `check_stop` (so finish_reason is final); `forced`:
    the request's grammar allowed no other token."""
    return TokenEvent(
        request_id=request.request_id,
        token_id=token.token_id,
        text=text,
        logprob=token.logprob,
        entropy=token.entropy,
        margin=token.margin,
        top_logprobs=[
            TopLogprob(i, token_text(i), lp, token_bytes(i)) for i, lp in zip(token.top_ids, token.top_logprobs)
        ],
        token_bytes=token_bytes(token.token_id),
        finish_reason=request.finish_reason,
        stop_reason=request.stop_reason,
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=request.num_output_tokens if num_output_tokens is None else num_output_tokens,
        num_draft_tokens=request.num_draft_tokens,  # speculative totals (zero without speculation)
        num_accepted_tokens=request.num_accepted_tokens,
        forced=forced,
        draft_support=token.support,
    )
