"""How to pick tokens and when to stop: `SamplingParams`, the one declaration of every sampling field.

A field a tier may default (temperature, top_p, ...) is declared once, on its SamplingParams line,
with `tunable(...)`: its range, the value that turns it off (OpenAI's default for OpenAI's own
fields), where a model file declares its default, what it does. Everything else is derived from
`TUNABLES`: the OpenAI request schema's field (sdk.protocol.openai_schema), the tier defaults and
their last resort (sdk.engine_common.sampling_defaults), the [local.sampling] / [cloud.sampling] settings
and their flags (sdk.settings), the tandem.v1 conversion (sdk.protocol.wire, sdk.serving.grpc.convert)
and the OpenAI-HTTP body (sdk.cloud.openai_wire). What stays hand-written is the .proto's field
and what the two samplers do with the value (local_runtime/ and cloud_engine/ sampler and logits
processors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sdk.protocol.errors import InvalidRequestError

MAX_TOP_LOGPROBS = 20  # OpenAI caps `top_logprobs` at 20; we do the same so clients get the same limits
MIN_SAMPLING_TEMPERATURE = 1e-5  # below it, sampling is greedy
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values: [-100, 100]
MAX_PENALTY = 2.0  # OpenAI's range for presence/frequency penalties: [-2, 2]


@dataclass(frozen=True, kw_only=True)
class Tunable:
    """What is known of a sampling field a tier may default. `name` and `type` come from the
    SamplingParams line that declares it."""

    doc: str  # what it does, one line: the request schema, the settings' help and `tandem config`
    off: float | int  # the value that changes nothing: OpenAI's default for its own fields
    low: float
    high: float = math.inf
    low_inclusive: bool = True
    note: str = ""  # said after the range when a value is refused
    openai: bool = False  # OpenAI's own field (its default is the last resort), else an extension (vLLM's)
    gguf_key: str | None = None  # the GGUF metadata key a model declares its default under
    in_generation_config: bool = False  # HF's generation_config.json may declare it (under this name)
    request_off: tuple[int, ...] = ()  # request values that also mean off (vLLM clients send top_k -1)
    sent_when_off: bool = True  # the OpenAI-HTTP body carries it at `off` (False: left out, for servers that refuse it)
    name: str = ""
    type: type = float

    def check(self, value: float | int) -> None:
        """InvalidRequestError naming the field when `value` is out of its range (NaN and inf included)."""
        above = value >= self.low if self.low_inclusive else value > self.low
        if math.isfinite(value) and above and value <= self.high:
            return
        if math.isfinite(self.high):
            interval = f"in {'[' if self.low_inclusive else '('}{self.low:g}, {self.high:g}]"
        else:
            interval = f"{'>=' if self.low_inclusive else '>'} {self.low:g}"
        note = f" ({self.note})" if self.note else ""
        raise InvalidRequestError(f"{self.name} must be {interval}{note}, got {value!r}", self.name)

    def from_request(self, value: float | int | None) -> float | int | None:
        return self.off if value is not None and value in self.request_off else value


def tunable(**facts: Any) -> Any:
    """A SamplingParams field a tier may default: None (unset) unless the request sets it."""
    return field(default=None, metadata={"tunable": Tunable(**facts)})


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the whole output, enforced token by token by the engine's grammar mask.

    kind "json_object": any JSON object; "json_schema": JSON valid against `schema` (JSON text);
    "lark": text in llguidance's Lark dialect `grammar` (tool calls: sdk.protocol.tool_formats).
    Whitespace between JSON tokens is bounded (sdk.engine_common.grammar.JSON_FORMAT), so a small
    model cannot pad it out."""

    kind: str
    schema: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if (
            self.kind not in ("json_object", "json_schema", "lark")
            or (self.kind == "json_schema") != (self.schema is not None)
            or (self.kind == "lark") != (self.grammar is not None)
        ):
            raise InvalidRequestError(
                f"unknown structured output {self.kind!r} (or its schema or grammar missing)", self.param
            )

    @property
    def param(self) -> str:
        """The request field a constraint of this kind comes from (errors name it)."""
        return "tools" if self.kind == "lark" else "response_format"


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. Validated on construction.

    Order of application (vLLM's): logit_bias and the min_tokens mask, then repetition,
    frequency and presence penalties (these change greedy picks too), then temperature,
    min_p, top_k, top_p. Logprobs and the confidence signals stay the model's own."""

    max_tokens: int = 16  # upper bound on generated tokens
    # Tunables. None: unset, so the engine that runs the request fills in its tier's default for the
    # model (sdk.engine_common.sampling_defaults); engines sample only with resolved values.
    temperature: float | None = tunable(
        doc="Softmax temperature (0: greedy)",
        off=1.0,
        low=0.0,
        high=2.0,
        openai=True,
        gguf_key="general.sampling.temp",
        in_generation_config=True,
    )
    top_p: float | None = tunable(
        doc="Nucleus mass kept",
        off=1.0,
        low=0.0,
        high=1.0,
        low_inclusive=False,
        openai=True,
        gguf_key="general.sampling.top_p",
        in_generation_config=True,
    )
    top_k: int | None = tunable(
        doc="Keep the k most likely tokens (0: off)",
        off=0,
        low=0,
        note="0 disables it",
        gguf_key="general.sampling.top_k",
        in_generation_config=True,
        request_off=(-1,),
        sent_when_off=False,
    )
    min_p: float | None = tunable(
        doc="Drop tokens below min_p x the top token's probability (0: off)",
        off=0.0,
        low=0.0,
        high=1.0,
        gguf_key="general.sampling.min_p",
        in_generation_config=True,
    )
    repetition_penalty: float | None = tunable(
        doc="Repetition penalty (HF/vLLM) over prompt and output tokens (1: off)",
        off=1.0,
        low=0.0,
        low_inclusive=False,
        gguf_key="general.sampling.penalty_repeat",
        in_generation_config=True,
    )
    presence_penalty: float | None = tunable(
        doc="Presence penalty (OpenAI): minus this for every token already generated",
        off=0.0,
        low=-MAX_PENALTY,
        high=MAX_PENALTY,
        openai=True,
    )
    frequency_penalty: float | None = tunable(
        doc="Frequency penalty (OpenAI): minus this x times generated",
        off=0.0,
        low=-MAX_PENALTY,
        high=MAX_PENALTY,
        openai=True,
    )
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit, [-100, 100]
    min_tokens: int = 0  # end-of-generation and stop_token_ids cannot be sampled before this many tokens
    seed: int | None = None  # per-request RNG seed for reproducible sampling
    stop: list[str] = field(default_factory=list)  # stop strings, never included in the output
    stop_token_ids: list[int] = field(default_factory=list)  # extra tokens that end generation
    ignore_eos: bool = False  # keep going past end-of-generation tokens
    # Stop an answer caught in an exact loop (sdk.engine_common.repetition.STOP_LOOP) with finish_reason
    # "length" and stop_reason "repetition". None: the tier's default (local on, cloud off).
    # Never under ignore_eos, which asks for every token.
    repetition_stop: bool | None = None
    # A structured answer about to run out of max_tokens (or context) takes its grammar's closing
    # path and ends valid (sdk.engine_common.grammar_closing). None: the tier's default (on).
    close_within_max_tokens: bool | None = None
    logprobs: int | None = None  # None: no logprobs; k >= 0: chosen token + k alternatives
    structured: StructuredOutput | None = None  # response_format: a grammar masks every step

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}", "max_tokens")
        for name, knob in TUNABLES.items():  # unset (None) is always allowed
            if getattr(self, name) is not None:
                knob.check(getattr(self, name))
        if self.temperature is not None and self.temperature < MIN_SAMPLING_TEMPERATURE:
            # vLLM's epsilon: dividing logits by, say, 1e-320 overflows them to inf and the softmax to NaN.
            self.temperature = 0.0
        if any(not math.isfinite(b) or abs(b) > MAX_LOGIT_BIAS for b in self.logit_bias.values()):
            raise InvalidRequestError(
                f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]", "logit_bias"
            )
        if any(token_id < 0 for token_id in self.logit_bias):
            raise InvalidRequestError("logit_bias keys must be token ids >= 0", "logit_bias")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens!r}", "min_tokens"
            )
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
            raise InvalidRequestError(
                f"{param} cannot be combined with response_format: the grammar decides where the output ends", param
            )

    @property
    def is_resolved(self) -> bool:
        """Every tunable set (the engine has applied its tier's defaults)."""
        return all(getattr(self, name) is not None for name in TUNABLES)

    @property
    def is_greedy(self) -> bool:
        """Whether sampling is argmax; samplers ask this first, so unresolved params fail here, loudly."""
        if not self.is_resolved:
            raise ValueError(
                "sampling with unset fields: the engine must fill in its defaults first "
                "(sdk.engine_common.sampling_defaults.SamplingDefaults.apply)"
            )
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def stops_loops(self) -> bool:
        """Whether the engine watches this request for loops (sdk.engine_common.repetition)."""
        return (
            bool(self.repetition_stop) and not self.ignore_eos and self.structured is None
        )  # JSON repeats legitimately

    @property
    def uses_token_history(self) -> bool:
        """The logits depend on the tokens so far (penalties, the min_tokens mask): speculative
        decoding drafts nothing for such a request."""
        return (
            self.repetition_penalty not in (None, 1.0)
            or bool(self.presence_penalty)
            or bool(self.frequency_penalty)
            or self.masks_end_tokens
        )

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


# The tunables, in declaration order, named and typed from their SamplingParams lines (the
# annotations are strings under `from __future__ import annotations`: "int | None" or "float | None").
TUNABLES: dict[str, Tunable] = {
    f.name: replace(f.metadata["tunable"], name=f.name, type=int if f.type.startswith("int") else float)
    for f in fields(SamplingParams)
    if "tunable" in f.metadata
}


@dataclass(frozen=True)
class SamplingDefaults:
    """One tier's resolved default for every tunable sampling field, and where each came from (the engine
    contract names it; sdk.engine_common.sampling_defaults resolves it for a model)."""

    values: dict[str, float | int]
    sources: dict[str, str]  # field -> "config:...", "model:...", "built-in: ...", "OpenAI's default"

    def apply(self, params: SamplingParams) -> SamplingParams:
        """`params` with every unset field filled in (the same object when nothing was unset)."""
        unset = {name: self.values[name] for name in TUNABLES if getattr(params, name) is None}
        return replace(params, **unset) if unset else params

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """{field: {"value": ..., "source": ...}}: what /v1/models and `tandem config show` report."""
        return {name: {"value": self.values[name], "source": self.sources[name]} for name in TUNABLES}
