"""tandem.v1 messages <-> the engine's dataclasses, the servicer's half (the client's half is
sdk.protocol.wire.messages).

Server side, every check that can name a field raises InvalidRequestError with that field
(the proto's own name), so the client learns exactly what to fix; the checks that need the
model (token ids in range, context length) are left to the engine's own validation.
"""

from __future__ import annotations

from sdk.serving.grpc.errors import ModelNotFoundError
from sdk.serving.prompt_tokens import chat_prompt_tokens, text_prompt_tokens
from sdk.protocol.engine import (
    EngineProtocol,
    GenerationRequest,
    InvalidRequestError,
    SamplingParams,
    StructuredOutput,
    TokenEvent,
)
from sdk.protocol.openai_schema import MAX_STOP_STRINGS
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.sampling_params import TUNABLES

# -- server side: requests in --------------------------------------------------------------


async def generation_request(
    message: pb.GenerateRequest, engine: EngineProtocol, engine_request_id: str
) -> GenerationRequest:
    """The engine request for a GenerateRequest (the prompt rendered and tokenized off the event loop
    when large, sdk.serving.prompt_tokens; continuation appended)."""
    if message.model and message.model != engine.model_name:
        raise ModelNotFoundError(
            f"the model {message.model!r} is not served here; ListModels lists the served models", "model"
        )
    token_ids = await prompt_token_ids(message, engine) + list(message.continuation_token_ids)
    params = sampling_params(message, len(token_ids), engine.max_model_len)
    return GenerationRequest(
        engine_request_id,
        token_ids,
        params,
        priority=message.priority,
        num_continuation_tokens=len(message.continuation_token_ids),
    )


async def prompt_token_ids(message: pb.GenerateRequest, engine: EngineProtocol) -> list[int]:
    kind = message.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequestError("the request has no prompt; set one of messages, prompt_token_ids or text", "prompt")
    if kind == "messages":
        if not message.messages.messages:
            raise InvalidRequestError("messages must contain at least one message", "messages")
        return await chat_prompt_tokens(
            engine, [{"role": m.role, "content": m.content} for m in message.messages.messages]
        )
    if kind == "prompt_token_ids":
        if not message.prompt_token_ids.ids:
            raise InvalidRequestError("prompt_token_ids must contain at least one token id", "prompt_token_ids")
        return list(message.prompt_token_ids.ids)  # exactly the caller's tokens: no BOS added
    if not message.text:
        raise InvalidRequestError("text must not be empty", "text")
    # Raw text gets the model's BOS like any tokenizer call (as /v1/completions does).
    return await text_prompt_tokens(engine, message.text, add_special=True)


def sampling_params(message: pb.GenerateRequest, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
    """Engine parameters; unset fields take the defaults the .proto documents."""
    sampling = message.sampling
    if len(sampling.stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"stop accepts at most {MAX_STOP_STRINGS} strings, got {len(sampling.stop)}", "stop")
    if sampling.HasField("max_tokens"):
        max_tokens = sampling.max_tokens
    else:
        # What the context has left; at least 1 so that a prompt filling the whole context
        # gets the engine's own context-length error, which says how many tokens it has.
        max_tokens = max(1, max_model_len - num_prompt_tokens)
    return SamplingParams(  # validates every value, naming the field
        max_tokens=max_tokens,
        # Unset stays unset: the engine fills in its default for the model it serves (every tunable is
        # an `optional` field of the proto, under SamplingParams' name).
        **{name: getattr(sampling, name) if sampling.HasField(name) else None for name in TUNABLES},
        logit_bias=dict(sampling.logit_bias),
        min_tokens=sampling.min_tokens,
        seed=sampling.seed if sampling.HasField("seed") else None,
        stop=list(sampling.stop),
        stop_token_ids=list(sampling.stop_token_ids),
        ignore_eos=sampling.ignore_eos,
        repetition_stop=sampling.repetition_stop if sampling.HasField("repetition_stop") else None,
        close_within_max_tokens=sampling.close_within_max_tokens
        if sampling.HasField("close_within_max_tokens")
        else None,
        logprobs=sampling.top_logprobs or None,
        structured=structured_output(sampling),
    )


def structured_output(sampling: pb.SamplingParams) -> StructuredOutput | None:
    if not sampling.HasField("structured"):
        return None
    message = sampling.structured
    return StructuredOutput(
        message.kind,
        message.schema if message.HasField("schema") else None,  # validates the kind
        message.grammar if message.HasField("grammar") else None,
    )


# -- server side: events out ---------------------------------------------------------------


def response_from_event(event: TokenEvent, request_id: str) -> pb.GenerateResponse:
    """One token's response; the last also carries usage and the request's speculative stats."""
    response = pb.GenerateResponse(
        request_id=request_id,
        token_id=event.token_id,
        text=event.text,
        logprob=event.logprob,
        entropy=event.entropy,
        margin=event.margin,
        top_logprobs=[
            pb.TopLogprob(token_id=t.token_id, text=t.text, logprob=t.logprob, token_bytes=t.token_bytes)
            for t in event.top_logprobs
        ],
        token_bytes=event.token_bytes,
        finish_reason=event.finish_reason or "",
        stop_reason=event.stop_reason or "",
    )
    if event.finish_reason is not None:
        response.usage.prompt_tokens = event.num_prompt_tokens
        response.usage.completion_tokens = event.num_output_tokens
        response.speculative.SetInParent()  # present (zeros without speculation) on every final response
        response.speculative.draft_tokens = event.num_draft_tokens
        response.speculative.accepted_tokens = event.num_accepted_tokens
    return response
