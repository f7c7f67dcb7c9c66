"""The small contract every tandem engine satisfies, and the types that cross it.

The local runtime (llama.cpp) and the cloud engine (PyTorch) both implement
`EngineProtocol`; the OpenAI HTTP server, the gRPC service and the router only
ever talk to this protocol. Keep this module dependency-free (stdlib only) so
every layer can import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Protocol, Sequence

if TYPE_CHECKING:
    from sdk.protocol.sampling_defaults import SamplingDefaults

# OpenAI caps `top_logprobs` at 20; we do the same so clients get the same limits.
MAX_TOP_LOGPROBS = 20


class EngineError(Exception):
    """Base class for errors an engine reports to its callers."""


class InvalidRequestError(EngineError):
    """The request can never succeed as sent (HTTP 400, gRPC INVALID_ARGUMENT)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested completion do not fit in the model's context."""


class EngineOverloadedError(EngineError):
    """The engine's queue is full; retry later (HTTP 503 + Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineNotReadyError(EngineError):
    """The engine is still loading or is shutting down."""


class QuotaExceededError(EngineError):
    """The caller has spent what its budget allows this period: retrying will not help until it
    ends (HTTP 429 insufficient_quota with x-should-retry: false, gRPC RESOURCE_EXHAUSTED with
    `tandem-error-type: insufficient_quota` and no retry-after)."""


MIN_SAMPLING_TEMPERATURE = 1e-5  # below it, sampling is greedy


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the whole output, enforced token by token by the engine's grammar mask.

    kind "json_object": any JSON object; "json_schema": JSON valid against `schema` (JSON text);
    "lark": text in llguidance's Lark dialect `grammar` (tool calls: sdk.protocol.tool_formats).
    Whitespace between JSON tokens is bounded (sdk.protocol.grammar.JSON_FORMAT), so a small
    model cannot pad it out."""

    kind: str
    schema: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if (self.kind not in ("json_object", "json_schema", "lark") or (self.kind == "json_schema") != (self.schema is not None)
                or (self.kind == "lark") != (self.grammar is not None)):  # fmt: skip
            raise InvalidRequestError(f"unknown structured output {self.kind!r} (or its schema or grammar missing)", self.param)

    @property
    def param(self) -> str:
        """The request field a constraint of this kind comes from (errors name it)."""
        return "tools" if self.kind == "lark" else "response_format"


MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values: [-100, 100]
MAX_PENALTY = 2.0  # OpenAI's range for presence/frequency penalties: [-2, 2]


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. Validated on construction.

    Order of application (vLLM's): logit_bias and the min_tokens mask, then repetition,
    frequency and presence penalties (these change greedy picks too), then temperature,
    min_p, top_k, top_p. Logprobs and the confidence signals stay the model's own."""

    max_tokens: int = 16  # upper bound on generated tokens
    # None: unset, so the engine that runs the request fills in its tier's default for the model
    # (sdk.protocol.sampling_defaults); engines sample only with resolved values.
    temperature: float | None = None  # 0 means greedy
    top_p: float | None = None  # nucleus mass kept, (0, 1]
    top_k: int | None = None  # keep the k most likely tokens; 0 disables
    min_p: float | None = None  # drop tokens below min_p x the top token's probability, [0, 1]; 0 disables
    repetition_penalty: float | None = None  # HF/vLLM: prompt and output tokens' logits / p (> 0) or x p (< 0); 1 off
    presence_penalty: float | None = None  # OpenAI: minus this for every token already generated, [-2, 2]
    frequency_penalty: float | None = None  # OpenAI: minus this x times generated, [-2, 2]
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit, [-100, 100]
    min_tokens: int = 0  # end-of-generation and stop_token_ids cannot be sampled before this many tokens
    seed: int | None = None  # per-request RNG seed for reproducible sampling
    stop: list[str] = field(default_factory=list)  # stop strings, never included in the output
    stop_token_ids: list[int] = field(default_factory=list)  # extra tokens that end generation
    ignore_eos: bool = False  # keep going past end-of-generation tokens
    # Stop an answer caught in an exact loop (sdk.protocol.repetition.STOP_LOOP) with finish_reason
    # "length" and stop_reason "repetition". None: the tier's default (local on, cloud off).
    # Never under ignore_eos, which asks for every token.
    repetition_stop: bool | None = None
    # A structured answer about to run out of max_tokens (or context) takes its grammar's closing
    # path and ends valid (sdk.protocol.grammar_closing). None: the tier's default (on).
    close_within_max_tokens: bool | None = None
    logprobs: int | None = None  # None: no logprobs; k >= 0: chosen token + k alternatives
    structured: StructuredOutput | None = None  # response_format: a grammar masks every step

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}", "max_tokens")
        ranges = (  # name, low, high, low inclusive; unset (None) is always allowed
            ("temperature", 0.0, 2.0, True), ("top_p", 0.0, 1.0, False), ("min_p", 0.0, 1.0, True),
            ("repetition_penalty", 0.0, math.inf, False),
            ("presence_penalty", -MAX_PENALTY, MAX_PENALTY, True), ("frequency_penalty", -MAX_PENALTY, MAX_PENALTY, True),
        )  # fmt: skip
        for name, low, high, inclusive in ranges:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and (value >= low if inclusive else value > low) and value <= high):
                interval = f"{'[' if inclusive else '('}{low:g}, {high:g}]" if math.isfinite(high) else f"> {low:g}"
                raise InvalidRequestError(f"{name} must be {'in ' if math.isfinite(high) else ''}{interval}, got {value!r}", name)
        if self.temperature is not None and self.temperature < MIN_SAMPLING_TEMPERATURE:
            # vLLM's epsilon: dividing logits by, say, 1e-320 overflows them to inf and the softmax to NaN.
            self.temperature = 0.0
        if self.top_k is not None and self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k!r}", "top_k")
        if any(not math.isfinite(b) or abs(b) > MAX_LOGIT_BIAS for b in self.logit_bias.values()):
            raise InvalidRequestError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]", "logit_bias")
        if any(token_id < 0 for token_id in self.logit_bias):
            raise InvalidRequestError("logit_bias keys must be token ids >= 0", "logit_bias")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens!r}", "min_tokens")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs!r}", "top_logprobs"
            )
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequestError(f"seed must be an integer in [0, 2**63), got {self.seed!r}", "seed")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings", "stop")
        if self.structured is not None and (self.ignore_eos or self.min_tokens):
            # The grammar ends the output (it allows only the end token once the JSON is complete).
            param = "ignore_eos" if self.ignore_eos else "min_tokens"
            raise InvalidRequestError(f"{param} cannot be combined with response_format: the grammar decides where the output ends", param)

    @property
    def is_resolved(self) -> bool:
        """Every defaultable field set (the engine has applied its tier's defaults)."""
        return None not in (self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty,
                            self.presence_penalty, self.frequency_penalty)  # fmt: skip

    @property
    def is_greedy(self) -> bool:
        """Whether sampling is argmax; samplers ask this first, so unresolved params fail here, loudly."""
        if not self.is_resolved:
            raise ValueError("sampling with unset fields: the engine must fill in its defaults first "
                             "(sdk.protocol.sampling_defaults.SamplingDefaults.apply)")  # fmt: skip
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def stops_loops(self) -> bool:
        """Whether the engine watches this request for loops (sdk.protocol.repetition)."""
        return bool(self.repetition_stop) and not self.ignore_eos and self.structured is None  # JSON repeats legitimately

    @property
    def uses_token_history(self) -> bool:
        """The logits depend on the tokens so far (penalties, the min_tokens mask): speculative
        decoding drafts nothing for such a request."""
        return (self.repetition_penalty not in (None, 1.0) or bool(self.presence_penalty) or bool(self.frequency_penalty)
                or self.masks_end_tokens)  # fmt: skip

    @property
    def masks_end_tokens(self) -> bool:
        """min_tokens has ids to hold back: the end-of-generation ids (unless ignore_eos, under which
        they end nothing) and stop_token_ids. `ignore_eos` + `min_tokens` alone (how benchmark
        clients ask for a fixed length) changes no logit, so it costs no per-row logits copy."""
        return self.min_tokens > 0 and (not self.ignore_eos or bool(self.stop_token_ids))

    @property
    def changes_logits(self) -> bool:
        """Anything to apply to the raw logits before picking (greedy picks included)."""
        return self.uses_token_history or bool(self.logit_bias) or self.structured is not None


@dataclass(frozen=True)
class Caller:
    """Whose request this is, for a server that bills it (sdk.budgets.metered_engine); engines ignore it.

    `key_fingerprint`: the API key's fingerprint (None on a server without keys); `user`: the
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

    @property
    def continuation_token_ids(self) -> list[int]:
        return list(self.prompt_token_ids[len(self.prompt_token_ids) - self.num_continuation_tokens:]) if self.num_continuation_tokens else []


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
        raise InvalidRequestError("a continuation must leave at least one prompt token before it", "continuation_token_ids")
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
    stop_reason: str | None = None  # on the last event, why beyond finish_reason: "repetition" (a loop was stopped), "closed_within_max_tokens"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_draft_tokens: int = 0  # speculative decoding, so far in this request: draft tokens verified
    num_accepted_tokens: int = 0  # ... and accepted by the target
    # A structured request's grammar allowed this token only: its logprob (the model's own) says
    # nothing about the model's confidence, so the cascade's confidence aggregate skips it.
    forced: bool = False


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

    @property
    def kv_usage(self) -> float:
        return self.num_kv_blocks_used / max(1, self.num_kv_blocks_total)


class EngineProtocol(Protocol):
    """What the OpenAI server, the gRPC service and the router need from an engine.

    Engines subclass it: the facts and capabilities below have the defaults of an engine that
    does not know them (or has not loaded yet); the servers read them as declared, never probing
    an engine with getattr. Serving layers over an engine (sdk.protocol.engine_wrapper) forward them."""

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
        """The longest text one token stands for (sdk.protocol.prompt_tokens bounds a prompt with it)."""
        return None

    @property
    def sampling_defaults(self) -> SamplingDefaults | None:
        """What the engine fills in for unset sampling fields (the model card shows them)."""
        return None

    @property
    def model_path(self) -> str | None:
        """The GGUF file the engine runs, when it runs one (a confidence probe checks its fingerprint)."""
        return None

    # -- serving state (sdk.openai_server.drain, sdk.budgets.metered_engine) --------------------

    @property
    def draining(self) -> bool:
        """True once the server was told to drain: out of rotation, finishing what it has."""
        return False

    @property
    def bills_callers(self) -> bool:
        """True when the engine bills each request to its `caller` (a server with budgets)."""
        return False

    def soft_warning(self, caller: Caller) -> str | None:
        """The soft-budget warning for a caller about to be billed (engines that bill callers)."""
        return None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of token ids as answers render them (sdk.protocol.detokenize); InvalidRequestError
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
