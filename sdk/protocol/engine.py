"""The small contract every tandem engine satisfies, and the types that cross it.

The local runtime (llama.cpp) and the cloud engine (PyTorch) both implement
`EngineProtocol`; the OpenAI HTTP server, the gRPC service and the router only
ever talk to this protocol. Keep this module dependency-free (stdlib only) so
every layer can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol, Sequence

# The errors and the sampling declaration live in their own modules; importing them from here still works.
from sdk.protocol.errors import (  # noqa: F401
    ContextLengthError,
    EngineError,
    EngineNotReadyError,
    EngineOverloadedError,
    InvalidRequestError,
    QuotaExceededError,
    StateUnavailableError,
)
from sdk.protocol.sampling_params import (  # noqa: F401
    MAX_LOGIT_BIAS,
    MAX_PENALTY,
    MAX_TOP_LOGPROBS,
    MIN_SAMPLING_TEMPERATURE,
    SamplingParams,
    SamplingDefaults,
    StructuredOutput,
)
from sdk.protocol.drafts import OutsideDraft


@dataclass(frozen=True)
class Caller:
    """Whose request this is, for a server that bills it (sdk.budgets.metered_engine); engines ignore it.

    `key_fingerprint`: the API key's id, its whole SHA-256 (None on a server without keys); `user`: the
    OpenAI `user` field. `bills_prompt`: False for the 2nd..nth choice of one request, whose
    prompt OpenAI's usage (and so the bill) counts once."""

    key_fingerprint: str | None = None
    user: str | None = None
    bills_prompt: bool = True


@dataclass
class GenerationRequest:
    """One prompt, already tokenized, to be continued by the engine."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0  # lower runs first and is preempted last (engines that support priority)
    # The last n prompt tokens are the start of the answer itself (a cascade hand-off: the cloud
    # continuing a local answer, the local model resuming or taking over): a structured request's
    # grammar consumes them before it masks the first new token.
    num_continuation_tokens: int = 0
    caller: Caller | None = None  # who is billed for it (servers with budgets); not sent over gRPC
    # The caller drafts for it (GenerateWithDrafts): the engine's own proposer leaves it alone, so every draft
    # token verified for it is the caller's (metered and billed to its key: sdk.budgets.metered_engine).
    drafted: bool = False

    @property
    def continuation_token_ids(self) -> list[int]:
        return (
            list(self.prompt_token_ids[len(self.prompt_token_ids) - self.num_continuation_tokens :])
            if self.num_continuation_tokens
            else []
        )


def validate_generation_request(request: GenerationRequest, vocab_size: int, max_model_len: int) -> None:
    """Raise InvalidRequestError/ContextLengthError for a request that can never run (nothing allocated yet)."""
    prompt = request.prompt_token_ids
    if not prompt:
        raise InvalidRequestError("the prompt is empty; send at least one token", "prompt")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})", "prompt")
    if request.params.logit_bias and max(request.params.logit_bias) >= vocab_size:
        raise InvalidRequestError(f"logit_bias keys must be token ids in [0, {vocab_size})", "logit_bias")
    if not 0 <= request.num_continuation_tokens < len(prompt):
        raise InvalidRequestError(
            "a continuation must leave at least one prompt token before it", "continuation_token_ids"
        )
    total = len(prompt) + request.params.max_tokens
    if total > max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{total} tokens ({len(prompt)} in the prompt, {request.params.max_tokens} for the completion). "
            "Please reduce the prompt or max_tokens.",
            "prompt" if len(prompt) >= max_model_len else "max_tokens",  # the one that has to change
        )


@dataclass
class TopLogprob:
    """One alternative the sampler considered at a position."""

    token_id: int
    text: str
    logprob: float
    token_bytes: bytes = b""  # raw bytes (a piece of a multi-byte character stays exact)


@dataclass
class TokenEvent:
    """One generated token, with the text it adds and the signals the router reads.

    `text` is the part of the output that became final with this token; it may be
    empty while bytes of a multi-byte character or a possible stop string are held back.
    """

    request_id: str
    token_id: int
    text: str
    logprob: float  # log-probability of the chosen token under the model's distribution
    entropy: float  # entropy (nats) of the distribution the token was sampled from
    margin: float  # top-1 minus top-2 probability
    top_logprobs: list[TopLogprob] = field(default_factory=list)
    token_bytes: bytes = b""  # raw bytes of the token (OpenAI's logprobs `bytes`)
    finish_reason: str | None = None  # set on the last event: "stop", "length" or "abort"
    # on the last event, why beyond finish_reason: "repetition" (a loop was stopped), "closed_within_max_tokens"
    stop_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_draft_tokens: int = 0  # speculative decoding, so far in this request: draft tokens verified
    num_accepted_tokens: int = 0  # ... and accepted by the target
    # A structured request's grammar allowed this token only: its logprob (the model's own) says
    # nothing about the model's confidence, so the cascade's confidence aggregate skips it.
    forced: bool = False
    # A drafting request's sampled token (LocalEngine.add_request with hold_at): the distribution it was
    # drawn from, (token ids, probabilities), which the verifying tier reads as the draft's q.
    draft_support: tuple[tuple[int, ...], tuple[float, ...]] | None = None


def output_tokens_after(event: TokenEvent, counted: int) -> int:
    """A request's completion tokens after `event`, `counted` before it: the engine's own count when it
    gives one, else one more. The one rule for what usage reports and what budgets bill."""
    return event.num_output_tokens or counted + 1


@dataclass
class EngineStats:
    """A snapshot for /metrics and status calls."""

    num_running: int
    num_waiting: int
    num_kv_blocks_total: int
    num_kv_blocks_used: int
    num_prompt_tokens_total: int
    num_generation_tokens_total: int
    num_preemptions_total: int
    num_prefix_cache_hit_tokens_total: int
    num_prefix_cache_query_tokens_total: int = 0  # tokens looked up in the prefix cache (hit rate = hits / queries)
    # speculative decoding (vLLM's spec_decode_* counters); zeros where the engine does not speculate
    num_spec_drafts_total: int = 0
    num_spec_draft_tokens_total: int = 0
    num_spec_accepted_tokens_total: int = 0
    spec_accepted_tokens_per_position: tuple[int, ...] = ()
    # requests stopped before their last token (client gone, cancelled, timed out): the engine noticed
    num_requests_aborted_total: int = 0
    # of num_waiting, requests drafting for the other tier (the local engine's: sdk.cascade.device_drafts)
    num_waiting_drafts: int = 0
    # Callers' drafts (GenerationRequest.drafted) per key fingerprint ("" without keys): draft tokens verified,
    # and accepted. Beside the engine-wide spec counters above, which count the engine's own drafts too.
    caller_draft_tokens_by_key: dict[str, int] = field(default_factory=dict)
    caller_accepted_tokens_by_key: dict[str, int] = field(default_factory=dict)
    # The KV pool: its element type as the engine's setting names it ("f16", "q8_0", "bfloat16", "int8"), the
    # tokens it holds and the bytes they take, scales included. "" and zeros where an engine does not say.
    kv_cache_dtype: str = ""
    kv_cache_tokens_total: int = 0
    kv_cache_bytes_total: int = 0

    @property
    def kv_usage(self) -> float:
        return self.num_kv_blocks_used / max(1, self.num_kv_blocks_total)

    @property
    def kv_tokens_per_gib(self) -> float:
        """Tokens the pool's element type fits in a GiB (the capacity a KV precision buys); 0 when unknown."""
        if not self.kv_cache_bytes_total:
            return 0.0
        return self.kv_cache_tokens_total * 2**30 / self.kv_cache_bytes_total


class EngineProtocol(Protocol):
    """What the OpenAI server, the gRPC service and the router need from an engine.

    Engines subclass it: the facts and capabilities below have the defaults of an engine that
    does not know them (or has not loaded yet); the servers read them as declared, never probing
    an engine with getattr. Serving layers over an engine (sdk.serving.engine_wrapper) forward them."""

    model_name: str  # the id clients put in `model`
    max_model_len: int  # prompt + completion tokens one request may use

    @property
    def is_ready(self) -> bool: ...

    # -- facts about the loaded model (defaults: not known, or not loaded yet) ------------------

    @property
    def chat_template(self) -> str | None:
        """The model's own Jinja chat template (its text tells the tool-call format)."""
        return None

    @property
    def vocabulary_fingerprint(self) -> str:
        """sdk.protocol.vocabulary's fingerprint of the vocabulary ("" when not known); the first read
        may pass over the whole vocabulary: read it off the event loop."""
        return ""

    @property
    def max_token_bytes(self) -> int | None:
        """The longest text one token stands for (sdk.serving.prompt_tokens bounds a prompt with it)."""
        return None

    @property
    def sampling_defaults(self) -> SamplingDefaults | None:
        """What the engine fills in for unset sampling fields (the model card shows them)."""
        return None

    @property
    def model_path(self) -> str | None:
        """The GGUF file the engine runs, when it runs one (a confidence probe checks its fingerprint)."""
        return None

    @property
    def vocab_size(self) -> int | None:
        """The model's token ids are 0..vocab_size - 1 (None while loading, or not known)."""
        return None

    # -- drafts another model makes for a request (GenerateWithDrafts; sdk.protocol.drafts) ----------

    @property
    def max_draft_tokens(self) -> int:
        """The most tokens of one outside draft the engine verifies; 0: it verifies none (the default)."""
        return 0

    def offer_draft(self, draft: OutsideDraft) -> None:
        """Hand a draft to the engine, to verify in a step of its request; never waits (engines whose
        max_draft_tokens is above 0). A draft the engine cannot use is dropped: the request decodes alone."""
        raise InvalidRequestError("this engine verifies no drafts (its max_draft_tokens is 0): call Generate")

    def num_drafts_waiting(self, request_id: str) -> int:
        """Drafts offered for a request that the engine has not taken yet (the door bounds them)."""
        return 0

    # -- serving state (sdk.openai_server.drain, sdk.budgets.metered_engine) --------------------

    @property
    def draining(self) -> bool:
        """True once the server was told to drain: out of rotation, finishing what it has."""
        return False

    @property
    def bills_callers(self) -> bool:
        """True when the engine bills each request to its `caller` (a server with budgets)."""
        return False

    async def soft_warning(self, caller: Caller) -> str | None:
        """The soft-budget warning for a caller about to be billed (engines that bill callers)."""
        return None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of token ids as answers render them (sdk.engine_common.detokenize); InvalidRequestError
        names an id outside the vocabulary."""
        ...

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Render chat messages with the model's own template and tokenize them.

        Raises InvalidRequestError when the model has no chat template.
        """
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Stream the request's tokens; the last event carries `finish_reason`."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks at once; a no-op when it is gone."""
        ...

    def stats(self) -> EngineStats: ...
