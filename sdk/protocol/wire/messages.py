"""The client half of tandem.v1's conversion: the engine's SamplingParams and a prompt ->
GenerateRequest, GenerateResponse -> CloudTokenEvent. The servicer's half (requests in, events
out, with its checks) is sdk.serving.grpc.convert. Every tunable SamplingParams declares is an
`optional` field of the proto under the same name, so both halves carry them by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sdk.protocol.cloud_backend import CloudTokenEvent, Prompt
from sdk.protocol.engine import InvalidRequestError, SamplingParams, TopLogprob
from sdk.protocol.sampling_params import TUNABLES
from sdk.protocol.wire import tandem_pb2 as pb


def request_message(
    prompt: Prompt,
    params: SamplingParams | None,
    *,
    request_id: str = "",
    model: str = "",
    continuation_token_ids: Sequence[int] = (),
    priority: int = 0,
) -> pb.GenerateRequest:
    """A GenerateRequest: text, token ids or chat messages, with the engine's SamplingParams."""
    message = pb.GenerateRequest(
        request_id=request_id, model=model, continuation_token_ids=list(continuation_token_ids), priority=priority
    )
    if isinstance(prompt, str):
        message.text = prompt
    elif prompt and all(isinstance(m, Mapping) for m in prompt):
        for m in prompt:
            if not isinstance(m.get("content"), str):
                raise InvalidRequestError("each message needs a role and a string content", "messages")
            message.messages.messages.add(role=str(m.get("role", "")), content=m["content"])
    else:
        message.prompt_token_ids.SetInParent()  # set even when empty, so the server names the empty field
        message.prompt_token_ids.ids.extend(int(t) for t in prompt)
    if params is not None:
        message.sampling.CopyFrom(sampling_message(params))
    return message


def sampling_message(params: SamplingParams) -> pb.SamplingParams:
    message = pb.SamplingParams(
        max_tokens=params.max_tokens,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        top_logprobs=params.logprobs or 0,
    )
    for name in (
        *TUNABLES,
        "seed",
        "repetition_stop",
        "close_within_max_tokens",
    ):  # unset: the server's default for its model
        if getattr(params, name) is not None:
            setattr(message, name, getattr(params, name))
    message.logit_bias.update(params.logit_bias)
    message.min_tokens = params.min_tokens
    if params.structured is not None:
        message.structured.kind = params.structured.kind
        if params.structured.schema is not None:
            message.structured.schema = params.structured.schema
        if params.structured.grammar is not None:
            message.structured.grammar = params.structured.grammar
    return message


def event_from_response(response: pb.GenerateResponse, num_output_tokens: int) -> CloudTokenEvent:
    """The event for a response; `num_output_tokens` counts this one (the server sends totals only at the end)."""
    last = bool(response.finish_reason)
    return CloudTokenEvent(
        request_id=response.request_id,
        token_id=response.token_id,
        text=response.text,
        logprob=response.logprob,
        entropy=response.entropy,
        margin=response.margin,
        top_logprobs=[TopLogprob(t.token_id, t.text, t.logprob, t.token_bytes) for t in response.top_logprobs],
        token_bytes=response.token_bytes,
        finish_reason=response.finish_reason or None,
        stop_reason=response.stop_reason or None,
        num_prompt_tokens=response.usage.prompt_tokens if last else 0,
        num_output_tokens=response.usage.completion_tokens if last else num_output_tokens,
        num_draft_tokens=response.speculative.draft_tokens,
        num_accepted_tokens=response.speculative.accepted_tokens,
    )
