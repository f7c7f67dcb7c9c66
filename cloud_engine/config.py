"""Configuration of the cloud engine: one validated dataclass. The fields that are settings ([cloud] in
the TOML file, TANDEM_CLOUD_<KEY> variables, `tandem cloud serve` options) declare them here
(sdk.protocol.config_fields)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cloud_engine.spec_decode.config import SpeculativeConfig
from sdk.protocol.config_fields import at_least, one_of, setting
from sdk.protocol.drafts import MAX_DRAFT_TOKENS
from sdk.engine_common.sampling_defaults import check_sampling_config

ATTENTION_BACKENDS = ("auto", "torch", "cpu-kernel")  # cloud_engine.kernels.BACKENDS
COMPILE_MODES = ("auto", "on", "off")  # cloud_engine.compiled_decode.resolve_compile
DTYPES = ("auto", "float32", "bfloat16", "float16")
# [cloud] kv_cache_dtype: auto (the engine's dtype), a named one (vLLM's names where they mean the same), or int8
# (cloud_engine.kv_quant).
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "int8")
# [cloud] weight_dtype: auto (the engine's dtype) or int8 (weight-only, a scale per output channel:
# cloud_engine.model.int8_linear).
WEIGHT_DTYPES = ("auto", "int8")
DEVICES = ("auto", "cpu", "cuda")
POLICIES = ("fcfs", "priority")
# A [cloud] key left unset takes the dataclass default below (tandem config show prints it).
_ENGINE_DEFAULT = {"optional": True, "unset": "the engine's default"}


@dataclass
class CloudEngineConfig:
    """Everything that sizes and shapes the PyTorch engine."""

    model: str | None = setting(
        None,
        "The cloud engine's model (tandem serve's embedded tier, tandem cloud serve): HF directory or GGUF file.",
        unset="the embedded SmolLM2-135M-Instruct",
    )
    model_name: str | None = setting(  # the id served as `model`; derived from the source when None
        None,
        "Model id sent to the cloud server (and served by the embedded engine).",
        unset="the server's default model",
    )
    # Weights and KV cache; auto: bfloat16 on CUDA and on CPUs with native bf16, else float32.
    dtype: str = setting("auto", "Cloud engine dtype: auto, float32, bfloat16, float16.")
    device: str = setting("auto", "Cloud engine device: auto, cpu, cuda or cuda:N.")  # auto: cuda when available
    block_size: int = 16  # KV slots per block: the unit of allocation and prefix caching
    kv_cache_gb: float | None = setting(  # None: kv_cache_memory_fraction of free memory
        None,
        "Cloud engine KV cache budget in GB.",
        check=at_least(0, inclusive=False),
        unset="a fraction of free memory",
    )
    # auto: the engine's dtype. int8: 8-bit values with a float16 scale per token and K/V head (cloud_engine.kv_quant),
    # 1.94x the tokens per byte of bfloat16 at head_dim 64; what it costs in answers: bench.kv_precision.
    kv_cache_dtype: str = setting(
        "auto",
        "Cloud engine KV cache element type: auto (the engine's dtype) or int8 (8 bits and a scale per token and "
        "head: ~1.9x the tokens per GB of bfloat16).",
        check=one_of(*KV_CACHE_DTYPES),
        **_ENGINE_DEFAULT,
    )
    weight_dtype: str = setting(
        "auto",
        "Cloud engine linear weights: auto (the engine's dtype) or int8 (weight-only, a scale per output channel, "
        "activations in the engine's dtype; CPU only).",
        check=one_of(*WEIGHT_DTYPES),
        **_ENGINE_DEFAULT,
    )
    kv_cache_memory_fraction: float | None = (
        None  # of free device memory after loading; None: 0.9 on CUDA, 0.05 of RAM on CPU
    )
    max_num_seqs: int = setting(32, "Cloud engine: requests in one step.", check=at_least(1), **_ENGINE_DEFAULT)
    max_num_batched_tokens: int = setting(  # decodes + prefill chunks
        512, "Cloud engine: token budget of one step.", check=at_least(1), **_ENGINE_DEFAULT
    )
    max_model_len: int | None = setting(
        None, "Cloud engine: prompt + completion limit.", check=at_least(1), unset="min(model's own, KV pool, 8192)"
    )
    enable_chunked_prefill: bool = True  # split long prompts across steps, beside running decodes
    long_prefill_token_threshold: int = 0  # > 0 caps one request's prefill chunk per step
    # Chunked prefill sized so a step beside running decodes takes about this long (measured
    # costs, cloud_engine.prefill_pacing); None: chunks fill the token budget.
    step_time_target_ms: float | None = None
    step_time_max_ms: float | None = None  # a share of steps may run this long to prefill more (None: the target)
    slow_step_share: float = 0.05  # of the steps with decodes, at most this share run past the target
    enable_prefix_caching: bool = True  # reuse full KV blocks of identical prefixes
    scheduling_policy: str = "fcfs"  # fcfs, or priority (lower GenerationRequest.priority first)
    max_waiting: int = setting(
        1024,
        "Cloud engine: queued requests beyond this are refused (HTTP 503, gRPC RESOURCE_EXHAUSTED).",
        check=at_least(0),
        **_ENGINE_DEFAULT,
    )
    attention_backend: str = "auto"  # decode attention: auto (CPU kernel where it builds), torch (portable), cpu-kernel
    compile: str = setting(
        "auto",
        "Cloud engine: run decode-only steps as one compiled graph (torch.compile): auto (the step `tandem cloud "
        "precompile` saved for these settings where there is one, else eager: compiling at start costs more than it "
        "saves on the CPUs measured; the reason is logged), on (compiled at every start), off.",
        check=one_of(*COMPILE_MODES),
    )
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)  # off unless asked for
    max_draft_tokens: int = setting(
        MAX_DRAFT_TOKENS,
        "Cloud engine: the most tokens of one draft it verifies in a step. A longer draft from a GenerateWithDrafts "
        "caller is INVALID_ARGUMENT; its own proposer's (num_speculative_tokens) must fit too.",
        check=at_least(1, high=64),
        **_ENGINE_DEFAULT,
    )
    sampling: dict = field(
        default_factory=dict
    )  # defaults for fields a request leaves out (sdk.engine_common.sampling_defaults)
    close_within_max_tokens: bool = setting(  # for requests that leave it unset (sdk.engine_common.grammar_closing)
        True,
        "The cloud engine's (tandem serve's embedded tier, tandem cloud serve): a structured answer about to reach "
        "max_tokens takes its grammar's closing path and ends valid unless a request sends close_within_max_tokens "
        "false.",
        optional=True,
        unset="on",
    )

    def __post_init__(self) -> None:
        checks = [
            (self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"),
            (
                self.kv_cache_dtype in KV_CACHE_DTYPES,
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
                + (
                    " (tandem's 8-bit cache is int8 with a scale per token and head: the CPU kernels have no fp8 "
                    "path, and vLLM's CPU build refuses an fp8 cache too)"
                    if str(self.kv_cache_dtype).startswith("fp8")
                    else ""
                ),
            ),
            (
                self.weight_dtype in WEIGHT_DTYPES,
                f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {self.weight_dtype!r}",
            ),
            (
                self.device in DEVICES or self.device.startswith("cuda:"),
                f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}",
            ),
            (self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}"),
            (self.kv_cache_gb is None or self.kv_cache_gb > 0, f"kv_cache_gb must be > 0, got {self.kv_cache_gb}"),
            (
                self.kv_cache_memory_fraction is None or 0 < self.kv_cache_memory_fraction <= 1,
                f"kv_cache_memory_fraction must be in (0, 1], got {self.kv_cache_memory_fraction}",
            ),
            (self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
            (
                self.max_num_batched_tokens >= self.max_num_seqs,
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}) so every running request can decode each step",
            ),
            (
                self.max_model_len is None or self.max_model_len >= 1,
                f"max_model_len must be >= 1, got {self.max_model_len}",
            ),
            (
                self.long_prefill_token_threshold >= 0,
                f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}",
            ),
            (
                self.scheduling_policy in POLICIES,
                f"scheduling_policy must be one of {', '.join(POLICIES)}, got {self.scheduling_policy!r}",
            ),
            (
                self.attention_backend in ATTENTION_BACKENDS,
                f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}",
            ),
            (
                self.step_time_target_ms is None or self.step_time_target_ms > 0,
                f"step_time_target_ms must be > 0, got {self.step_time_target_ms}",
            ),
            (
                self.step_time_max_ms is None
                or (self.step_time_target_ms is not None and self.step_time_max_ms >= self.step_time_target_ms),
                f"step_time_max_ms ({self.step_time_max_ms}) needs step_time_target_ms set and must be >= it "
                f"(got {self.step_time_target_ms})",
            ),
            (0.0 <= self.slow_step_share <= 1.0, f"slow_step_share must be in [0, 1], got {self.slow_step_share}"),
            (
                self.compile in COMPILE_MODES,
                f"compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}",
            ),
            (self.max_waiting >= 0, f"max_waiting must be >= 0, got {self.max_waiting}"),
            (1 <= self.max_draft_tokens <= 64, f"max_draft_tokens must be in [1, 64], got {self.max_draft_tokens}"),
            (
                not self.speculative.enabled or self.speculative.num_speculative_tokens <= self.max_draft_tokens,
                f"num_speculative_tokens ({self.speculative.num_speculative_tokens}) must be <= max_draft_tokens "
                f"({self.max_draft_tokens}): raise max_draft_tokens or draft fewer",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        check_sampling_config(self.sampling)

    @property
    def max_sampled_rows(self) -> int:
        """Tokens one step samples at most (the compiled step's rows): a request's last token and its longest
        draft (its own proposal or an outside one), within the step's token budget."""
        return min(self.max_num_batched_tokens, self.max_num_seqs * (1 + self.max_draft_tokens))

    @property
    def max_logit_rows(self) -> int:
        """Rows the LM head sees in one step at most: one per request, plus its draft when speculating."""
        per_request = 1 + (self.speculative.num_speculative_tokens if self.speculative.enabled else 0)
        return min(self.max_num_batched_tokens, self.max_num_seqs * per_request)
