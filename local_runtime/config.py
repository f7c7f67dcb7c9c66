"""Configuration of the local engine: one validated dataclass. The fields that are settings ([local] in
the TOML file, TANDEM_* variables, `tandem serve` options) declare them here (sdk.protocol.config_fields),
with env variables TANDEM_LOCAL_<KEY> unless named."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from local_runtime.llama_backend import KV_CACHE_GGML_TYPES
from local_runtime.prefill_weights import PREFILL_WEIGHTS
from sdk.protocol.config_fields import at_least, one_of, setting
from sdk.engine_common.sampling_defaults import check_sampling_config

KV_LAYOUTS = ("auto", "streams", "unified")
# llama.cpp's KV cell types (llama-server's -ctk / -ctv), as tandem offers them: both K and V take the one type.
KV_CACHE_TYPES = tuple(KV_CACHE_GGML_TYPES)
# The context limit when the model's own is larger: long enough for chat, and one such request
# still leaves most of an 8k-cell pool for others.
DEFAULT_MAX_MODEL_LEN = 4096
# A [local] key left unset takes the dataclass default below (tandem config show prints it).
_ENGINE_DEFAULT = {"optional": True, "unset": "the engine's default"}


@dataclass
class LocalEngineConfig:
    """Everything that sizes and shapes the on-device engine."""

    model_path: str | None = setting(
        None,
        "GGUF file of the on-device model.",
        key="model",
        env="TANDEM_MODEL",
        unset="the embedded SmolLM2-135M-Instruct",
    )
    model_name: str | None = setting(
        None, "The id clients send as `model`.", env="TANDEM_MODEL_NAME", unset="derived from the model file"
    )
    kv_cache_tokens: int = setting(
        8192, "KV cells shared by all sequences.", env="TANDEM_KV_CACHE_TOKENS", check=at_least(1), **_ENGINE_DEFAULT
    )
    block_size: int = 16  # KV cells per block, the unit of admission and prefix sharing
    max_num_seqs: int = setting(  # llama.cpp sequence slots
        16, "Sequences decoded together.", env="TANDEM_MAX_NUM_SEQS", check=at_least(1), **_ENGINE_DEFAULT
    )
    max_num_batched_tokens: int = setting(  # decodes + prefill chunks
        512, "Token budget of one step.", env="TANDEM_MAX_NUM_BATCHED_TOKENS", check=at_least(1), **_ENGINE_DEFAULT
    )
    max_model_len: int | None = setting(
        None,
        "Prompt + completion limit per request.",
        env="TANDEM_MAX_MODEL_LEN",
        check=at_least(1),
        optional=True,
        unset="min(train context, KV pool, 4096)",
    )
    max_waiting: int = setting(
        256, "Queued requests beyond this get 503.", env="TANDEM_MAX_WAITING", check=at_least(0), **_ENGINE_DEFAULT
    )
    n_threads: int | None = setting(
        None, "CPU threads for llama.cpp.", key="threads", env="TANDEM_THREADS", check=at_least(1), unset="all cores"
    )
    n_gpu_layers: int = setting(
        0,
        "Layers offloaded when llama.cpp has a GPU backend.",
        env="TANDEM_N_GPU_LAYERS",
        check=at_least(0),
        **_ENGINE_DEFAULT,
    )
    flash_attn: bool = setting(
        True,
        "llama.cpp's flash attention (also on CPU); a quantized kv_cache_type and batch_invariant need it.",
        optional=True,
        unset="on",
    )
    # Both K and V in one type, as llama-server's `-ctk T -ctv T`. q8_0 stores 34 bytes per 32 values
    # (1.88x the cells of f16 in the same memory), q4_0 18 bytes (3.56x); what each costs in answers is
    # measured by bench.kv_precision (docs/local-engine.md "KV cache precision"). llama.cpp reads a
    # quantized V only inside its flash-attention kernel, so that combination is refused without it.
    kv_cache_type: str = setting(
        "f16",
        "Type of the KV cells (K and V): f16, q8_0 (1.88x the tokens per byte) or q4_0 (3.56x); quantized types "
        "need flash_attn.",
        check=one_of(*KV_CACHE_TYPES),
        **_ENGINE_DEFAULT,
    )
    # llama.cpp's repacked CPU weight layouts where a tensor type has one (Q4_0, Q4_K, IQ4_NL, ...):
    # faster matmuls, but a row's result then depends on how many rows share the call, so they
    # need batch_invariant off (tests/local_runtime/test_extra_buffer_types.py).
    extra_buffer_types: bool = setting(
        False,
        "llama.cpp's repacked CPU weight layouts for the tensor types that have one (Q4_0, Q4_K, IQ4_NL, ...; "
        "llama-server's default); needs batch_invariant off.",
        optional=True,
        unset="off",
    )
    # Opt-in, as in vLLM and SGLang: a sequence's numbers then do not depend on what shares its batch
    # (prefill in ubatches of at most 63 tokens, llama.cpp's per-row attention kernel), which costs
    # lone prompts llama.cpp's own prefill speed (docs/local-engine.md "Batch invariance").
    batch_invariant: bool = setting(
        False,
        "A sequence's numbers do not depend on what shares its batch (prefill in ubatches of at most 63 tokens: "
        "slower prompts; as vLLM's and SGLang's, opt-in).",
        optional=True,
        unset="off",
    )
    # How llama.cpp lays the cells out. "streams": each sequence slot gets kv_cache_tokens /
    # max_num_seqs cells of its own (llama-server's layout with -np), so a decode attends over its
    # own cells only: an 8-sequence decode step is ~10% faster than in one pool (bench/results/
    # local_kv_layout.json), but every slot must fit max_model_len. "unified": one pool whose cells
    # any sequence may use (long contexts in little memory). "auto": streams when every slot fits
    # max_model_len, else unified; batch_invariant always uses unified (its guarantee is shown there).
    kv_layout: str = setting(
        "auto",
        "KV cells per sequence (streams: kv_cache_tokens / max_num_seqs each, as llama-server -np; decode steps of "
        "several sequences ~10% faster; every slot must fit max_model_len), one shared pool (unified: long contexts in "
        "little memory), or auto.",
        check=one_of(*KV_LAYOUTS),
        optional=True,
        unset="auto: streams when every slot fits max_model_len, else unified",
    )
    # Prompts prefill through a 16-bit copy of the weights where llama.cpp has no GEMM kernel for the
    # model's own type (local_runtime.prefill_weights): "bf16", "f16", "off", or "auto": the copy that
    # prefills fastest on this machine, where it beats the model's own weights by a margin and fits the
    # memory bound, as measured on first use (local_runtime.prefill_choice). The copy is cached on disk
    # and costs 2 bytes a weight of memory; decoding stays on the quantized weights.
    prefill_weights: str = setting(
        "auto",
        "Prompts prefill through a 16-bit copy of the model's quantized weights (made once, cached under "
        "~/.cache/tandem; 2 bytes a weight of memory; decoding stays quantized): bf16, f16, off, or auto.",
        check=one_of(*PREFILL_WEIGHTS),
        optional=True,
        unset="auto: the faster copy where it measured >= 1.25x the model's own weights on this machine and fits 1/8 "
        "of memory, else off",
    )
    strict_batch_invariance: bool = False  # also pad lone decodes so they never change kernel (~40% slower at c=1)
    # A finished request's slot keeps its cells (local_runtime.prompt_cache) until the slot or its
    # blocks are needed, so the next prompt with the same prefix (a chat's next turn, or just the
    # chat template's head) copies them, as llama-server's prompt cache does. None: on unless
    # batch_invariant, because llama.cpp then places later cells around the cached ones and its
    # attention sums a sequence's cells in cell order, so a repeated seeded request can sample differently.
    cache_finished_prompts: bool | None = setting(
        None,
        "A finished request's slot keeps its KV cells until needed, so the next prompt with the same prefix (a chat's "
        "next turn) reuses them (5-10x faster first tokens on later turns); later cells then land around cached ones, "
        "so repeated seeded requests may sample differently (see batch invariance).",
        unset="on unless batch_invariant",
    )
    # How many finished prompts stay cached. Every cached cell widens the KV view each decode
    # walks (llama.cpp's unified pool): an 8-client decode step slows by a few percent with
    # cached prompts nobody reuses (bench.prompt_cache --overhead); a chat's next turn needs only its own.
    max_cached_prompts: int = setting(
        2,
        "Finished prompts kept cached at most (each widens the KV view every decode walks).",
        check=at_least(0),
        **_ENGINE_DEFAULT,
    )
    repetition_stop: bool = setting(  # for requests that leave repetition_stop unset (sdk.engine_common.repetition)
        True,
        "Stop answers caught in an exact loop (finish_reason length, stop_reason repetition) unless a request sends "
        "repetition_stop false.",
        optional=True,
        unset="on",
    )
    close_within_max_tokens: bool = setting(  # for requests that leave it unset (sdk.engine_common.grammar_closing)
        True,
        "A structured answer about to reach max_tokens takes its grammar's closing path and ends valid (stop_reason "
        "closed_within_max_tokens) unless a request sends close_within_max_tokens false.",
        optional=True,
        unset="on",
    )
    sampling: dict = field(
        default_factory=dict
    )  # defaults for fields a request leaves out (sdk.engine_common.sampling_defaults)

    def __post_init__(self) -> None:
        if self.cache_finished_prompts is None:
            self.cache_finished_prompts = not self.batch_invariant
        checks = [
            (self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}"),
            (
                self.kv_cache_tokens >= self.block_size,
                f"kv_cache_tokens ({self.kv_cache_tokens}) must hold at least one block of {self.block_size}",
            ),
            (self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
            (
                self.max_num_batched_tokens >= self.max_num_seqs,
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}) so every running sequence can decode each step",
            ),
            (self.max_waiting >= 0, f"max_waiting must be >= 0, got {self.max_waiting}"),
            (self.max_cached_prompts >= 0, f"max_cached_prompts must be >= 0, got {self.max_cached_prompts}"),
            (
                self.max_model_len is None or 1 <= self.max_model_len <= self.pool_tokens,
                f"max_model_len ({self.max_model_len}) must fit the KV pool ({self.pool_tokens} tokens)",
            ),
            (self.max_num_batched_tokens >= 2, "max_num_batched_tokens must be >= 2"),
            (
                not self.batch_invariant or self.flash_attn,
                "batch_invariant needs flash_attn (only its per-row kernel is invariant)",
            ),
            (not self.strict_batch_invariance or self.batch_invariant, "strict_batch_invariance needs batch_invariant"),
            (
                not (self.extra_buffer_types and self.batch_invariant),
                "extra_buffer_types needs batch_invariant off: llama.cpp's repacked kernels give a sequence other "
                "logits depending on what shares its batch; set batch_invariant = false to trade that guarantee "
                "for them",
            ),
            (self.n_threads is None or self.n_threads >= 1, f"n_threads must be >= 1, got {self.n_threads}"),
            (
                self.kv_cache_type in KV_CACHE_TYPES,
                f"kv_cache_type must be one of {', '.join(KV_CACHE_TYPES)}, got {self.kv_cache_type!r}",
            ),
            (
                self.kv_cache_type == "f16" or self.flash_attn,
                f"kv_cache_type {self.kv_cache_type!r} needs flash_attn (llama.cpp reads a quantized V cache only in "
                "its flash-attention kernel); set flash_attn = true or kv_cache_type = 'f16'",
            ),
            (
                self.prefill_weights in PREFILL_WEIGHTS,
                f"prefill_weights must be one of {', '.join(PREFILL_WEIGHTS)}, got {self.prefill_weights!r}",
            ),
            (
                not (self.batch_invariant and self.prefill_weights in ("bf16", "f16")),
                "prefill_weights needs batch_invariant off (prompts and decodes would run on different kernels)",
            ),
            (
                not (self.n_gpu_layers and self.prefill_weights in ("bf16", "f16")),
                "prefill_weights is for CPU prefill; with n_gpu_layers set, leave it at auto or off",
            ),
            (self.kv_layout in KV_LAYOUTS, f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {self.kv_layout!r}"),
            (
                not (self.kv_layout == "streams" and self.batch_invariant),
                "kv_layout 'streams' needs batch_invariant off (batch-invariant mode runs on the unified pool)",
            ),
            (
                self.kv_layout != "streams" or self.cells_per_slot >= self.longest_sequence,
                f"kv_layout 'streams' gives each of the {self.max_num_seqs} sequences {self.cells_per_slot} KV cells, "
                f"fewer than max_model_len ({self.longest_sequence}): raise kv_cache_tokens to "
                f"{self.max_num_seqs * self.longest_sequence}, lower max_model_len or max_num_seqs, or use 'unified'",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        check_sampling_config(self.sampling)

    @property
    def pool_tokens(self) -> int:
        """KV cells the engine asks llama.cpp for: whole blocks of kv_cache_tokens."""
        return self.num_blocks * self.block_size

    @property
    def cells_per_slot(self) -> int:
        """KV cells each sequence slot gets in the streams layout."""
        return self.pool_tokens // max(1, self.max_num_seqs)

    @property
    def longest_sequence(self) -> int:
        """max_model_len, or its default before the model's trained context is known: min(pool, 4096).
        The engine's max_model_len is this, lowered to the trained context when unset."""
        return self.max_model_len or min(self.pool_tokens, DEFAULT_MAX_MODEL_LEN)

    @property
    def kv_streams(self) -> bool:
        """Whether the context gets one KV stream per sequence slot (kv_layout resolved)."""
        if self.kv_layout == "auto":
            return not self.batch_invariant and self.cells_per_slot >= self.longest_sequence
        return self.kv_layout == "streams"

    @property
    def may_prefill_on_copy(self) -> bool:
        """Whether prefill_weights can apply (the model and CPU then decide: LocalEngine)."""
        return self.prefill_weights != "off" and not self.batch_invariant and not self.n_gpu_layers

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    @property
    def threads(self) -> int:
        return self.n_threads or os.cpu_count() or 1
