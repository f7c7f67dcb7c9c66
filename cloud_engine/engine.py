"""The cloud engine's synchronous core: `step()` is schedule -> run -> update.

Single-threaded by design: `AsyncCloudEngine` runs it on its own thread, and the offline
`LLM` calls it in a loop. Each step is one forward pass over a flattened batch of every
running request's decode token plus prefill chunks, under the scheduler's token budget.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import torch

from cloud_engine.block_manager import KVCacheManager
from cloud_engine.compiled_decode import CompiledDecode, resolve_compile
from cloud_engine.precompiled_decode import artifact_path, load_precompiled, precompile
from cloud_engine.config import CloudEngineConfig
from cloud_engine.host_memory import keep_freed_memory_in_heap
from cloud_engine.host_threads import limit_host_threads_for_gpu
from cloud_engine.kernels import select_decode_kernel
from cloud_engine.device import resolve_device, resolve_dtype, resolve_max_model_len
from cloud_engine.kv_cache import allocate_kv_caches, bytes_per_block, kv_budget_bytes, num_blocks_for_budget
from cloud_engine.kv_quant import resolve_kv_cache_dtype
from cloud_engine.model.int8_linear import resolve_weight_dtype
from cloud_engine.loader import load_model
from cloud_engine.loader.tokenizer import encode_prompt, tokenizer_vocabulary
from cloud_engine.model_runner import ModelRunner
from cloud_engine.request import Request
from cloud_engine.sampler import make_generator, sample_batch
from cloud_engine.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from sdk.protocol.drafts import OutsideDraft
from cloud_engine.spec_decode.speculator import Speculator
from cloud_engine.prefill_pacing import PrefillPacer, step_shape
from cloud_engine.token_bytes import build_token_bytes
from sdk.protocol.engine import (
    EngineStats,
    GenerationRequest,
    InvalidRequestError,
    TokenEvent,
    validate_generation_request,
)
from sdk.engine_common.detokenize import detokenize
from sdk.engine_common.grammar import GrammarMasks
from sdk.protocol.request_status import RequestStatus
from sdk.engine_common.sampling_defaults import resolve_sampling_defaults
from sdk.engine_common.token_events import check_stop, make_token_event
from sdk.protocol.vocabulary import vocabulary_fingerprint

logger = logging.getLogger(__name__)


class CloudEngine:
    """A PyTorch model served with tandem's paged KV cache, scheduler and sampler."""

    def __init__(self, config: CloudEngineConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, self.dtype)  # refused before the model loads
        self.int8_weights = resolve_weight_dtype(config.weight_dtype, self.device, self.dtype)  # so is this
        if self.device.type == "cpu":
            keep_freed_memory_in_heap()
        limit_host_threads_for_gpu(self.device)
        loaded = load_model(config.model, dtype=self.dtype, device=self.device)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.chat_template = loaded.chat_template
        self.model_name = config.model_name or loaded.name
        self.sampling_defaults = resolve_sampling_defaults(config.sampling, loaded.source)
        self.eos_token_ids = set(loaded.eos_token_ids)
        self._end_ids = sorted(self.eos_token_ids)  # masked until a request's min_tokens
        self.loaded = loaded
        # Faster linears: int8 weights where asked for, else oneDNN-packed ones (0 where packing does not apply: not
        # bf16 on CPU).
        num_packed = 0 if self.int8_weights else loaded.model.pack_for_cpu()
        if self.int8_weights:
            logger.info("cloud engine: %d linear layers hold int8 weights", loaded.model.quantize_weights())
        loaded.model.warm_up_packed(config.max_num_batched_tokens, config.max_logit_rows)  # memory flat from here
        self.vocab_size = self.model_config.vocab_size
        self.max_draft_tokens = config.max_draft_tokens  # of one draft, verified in a step (an outside one: its door)
        self._token_bytes = build_token_bytes(self.tokenizer)
        # The longest text one token stands for, special tokens' names included (sdk.serving.prompt_tokens).
        added = [len(text.encode("utf-8")) for text in self.tokenizer.get_added_vocab()]
        self.max_token_bytes = max([1, *added, *(len(piece) for piece in self._token_bytes)])
        # Structured requests' masks over the logits' width (ids past the tokenizer: never allowed).
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else min(self.eos_token_ids)
        self.grammar = GrammarMasks(
            lambda: [self.token_bytes(i) for i in range(self.vocab_size)],
            eos,
            lambda text: self.tokenize(text, add_special=False),
        )

        mc = self.model_config
        block_bytes = bytes_per_block(
            mc.num_hidden_layers, config.block_size, mc.num_key_value_heads, mc.head_dim, self.kv_dtype
        )
        self.num_blocks = num_blocks_for_budget(kv_budget_bytes(config, self.device), block_bytes)
        self.kv_block_bytes = block_bytes  # for stats(): the pool's bytes and tokens per GiB
        self.max_model_len = resolve_max_model_len(config, mc, self.num_blocks)
        decode_kernel = select_decode_kernel(
            config.attention_backend,
            self.device,
            self.dtype,
            mc.num_attention_heads,
            mc.num_key_value_heads,
            mc.head_dim,
        )
        self.attention_backend = "cpu-kernel" if decode_kernel is not None else "torch"
        self.compiled, compile_reason = resolve_compile(config.compile, self.device, num_packed > 0, decode_kernel)
        # auto on CPU may find the step compiled ahead of time (cloud_engine.precompiled_decode), or have it made
        # (precompile): not for packed weights, which cannot be saved.
        self._precompilable = (
            config.compile == "auto" and not self.compiled and self.device.type == "cpu" and num_packed == 0
        )
        may_load = self._precompilable and artifact_path(self).exists()
        if self._precompilable and not may_load:
            compile_reason += "; no precompiled decode step for these settings (`tandem cloud precompile` makes one)"
        caches = allocate_kv_caches(
            mc.num_hidden_layers,
            # the compiled step's pad rows write the extra block
            self.num_blocks + (1 if self.compiled or self._precompilable else 0),
            config.block_size,
            mc.num_key_value_heads,
            mc.head_dim,
            self.kv_dtype,
            self.device,
        )
        loaded.model.bind_kv_caches(caches)
        self._native_decode, self._num_packed = decode_kernel is not None, num_packed
        compiled_decode = self._new_compiled_decode() if self.compiled or may_load else None
        if self.compiled:
            started = time.perf_counter()
            compiled_decode.warm_up()
            compile_reason += f"; compiled in {time.perf_counter() - started:.1f} s"
        elif may_load:
            self.compiled, why = load_precompiled(self, compiled_decode)
            compile_reason = why if self.compiled else f"{compile_reason}; {why}"
            compiled_decode = compiled_decode if self.compiled else None
        self.runner = ModelRunner(loaded.model, config.block_size, self.device, decode_kernel, compiled_decode)
        self.kv_manager = KVCacheManager(
            self.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.kv_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            policy=config.scheduling_policy,
            max_draft_tokens=config.max_draft_tokens,
        )
        target_ms = config.step_time_target_ms if config.enable_chunked_prefill else None
        max_ms = config.step_time_max_ms
        self.pacer = (
            PrefillPacer(target_ms / 1000.0, max_ms / 1000.0 if max_ms else None, config.slow_step_share)
            if target_ms
            else None
        )
        self._generators: dict[str, torch.Generator] = {}
        # Drafts, their verification and counters (cloud_engine.spec_decode.speculator); built last: a
        # draft model's proposer reads this engine's tokenizer and device.
        self.speculator = Speculator(self, config.speculative, self.max_model_len, self.grammar, self.eos_token_ids)
        self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = 0
        logger.info(
            "cloud engine: %s on %s (%s, %s attention, %d packed linears, decode steps %s: %s), "
            "%d KV blocks of %d in %s",
            self.model_name,
            self.device,
            self.dtype,
            self.attention_backend,
            num_packed,
            "compiled" if self.compiled else "eager",
            compile_reason,
            self.num_blocks,
            config.block_size,
            self.kv_dtype,
        )

    def _new_compiled_decode(self) -> CompiledDecode:
        """The compiled step's buffers and graph over this engine's model and pool (its pad block: the last one)."""
        return CompiledDecode(
            self.loaded.model,
            self.config.max_sampled_rows,
            max_blocks_per_seq=-(-self.max_model_len // self.config.block_size),
            pad_block=self.num_blocks,
            block_size=self.config.block_size,
            native_attention=self._native_decode,
            packed_linears=self._num_packed > 0,
            device=self.device,
        )

    def precompile(self) -> tuple[str, float]:
        """Compile the decode step ahead of time and save it where later starts with compile = auto load it
        (cloud_engine.precompiled_decode); returns (path, seconds). For an engine built with compile = auto."""
        if not self._precompilable:
            raise ValueError(
                "precompiling needs compile = auto on CPU with plain or int8 weights (oneDNN-packed bf16 weights "
                "cannot be saved: use compile = on there)"
            )
        compiled = self.runner.compiled_decode or self._new_compiled_decode()
        path, seconds = precompile(self, compiled)
        return str(path), seconds

    @functools.cached_property
    def vocabulary_fingerprint(self) -> str:
        """sdk.protocol.vocabulary's fingerprint of the tokenizer (computed on first use)."""
        return vocabulary_fingerprint(tokenizer_vocabulary(self.tokenizer))

    # -- text in ---------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Raw text (special-token text stays plain, as for any user prompt); BOS only with add_special."""
        loaded = self.loaded
        return encode_prompt(
            loaded.tokenizer, text, add_special and loaded.add_bos, loaded.bos_token_id, parse_special=False
        )

    def apply_chat_template(self, messages) -> list[int]:
        if not self.chat_template:
            raise InvalidRequestError(
                f"model {self.model_name!r} has no chat template; use /v1/completions", "messages"
            )
        return self.loaded.encode_chat(messages)

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else b""

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def detokenize(self, token_ids) -> str:
        return detokenize(token_ids, self.vocab_size, self.token_bytes)

    # -- requests --------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError/ContextLengthError for a request that can never run."""
        validate_generation_request(request, self.vocab_size, self.max_model_len)

    def add_request(self, request: GenerationRequest) -> None:
        self.validate(request)
        if request.request_id in self.scheduler.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in the engine", "request_id")
        params = self.sampling_defaults.apply(request.params)  # the fields the request left out
        if params.close_within_max_tokens is None:
            params = dataclasses.replace(params, close_within_max_tokens=self.config.close_within_max_tokens)
        matcher = (
            self.grammar.matcher(params.structured, request.continuation_token_ids, params.close_within_max_tokens)
            if params.structured is not None
            else None
        )  # 400 before scheduling
        self._generators[request.request_id] = make_generator(params.seed, self.device)
        self.scheduler.add_request(
            Request(
                request.request_id,
                list(request.prompt_token_ids),
                params,
                priority=request.priority,
                matcher=matcher,
                outside_drafts=request.drafted,  # its caller drafts: the verified drafts are the caller's alone
            )
        )

    def offer_draft(self, draft: OutsideDraft) -> str | None:
        """A draft another model made for a running request (cloud_engine.spec_decode.outside_drafts),
        verified in the next step; None when taken, else why not. ValueError for a malformed one, or one
        longer than max_draft_tokens (the gRPC door refuses those first, naming the setting)."""
        draft.check(self.vocab_size, max_tokens=self.max_draft_tokens)
        request = self.scheduler.requests.get(draft.request_id)
        if request is None:
            return "unknown_request"
        return self.speculator.offer(request, draft)

    def abort_request(self, request_id: str) -> bool:
        """Free the request's blocks now; False if it was not here."""
        found = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED) is not None
        self._forget(request_id)
        return found

    def _forget(self, request_id: str) -> None:
        """Drop a finished request's per-request state beyond the scheduler's."""
        self._generators.pop(request_id, None)
        self.speculator.free(request_id)

    def abort_all(self) -> None:
        for request_id in list(self.scheduler.requests):
            self.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- the step --------------------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        started = time.perf_counter()
        pacer = self.pacer
        allowance = pacer.allowance(self.scheduler.num_decoding()) if pacer else None
        scheduler_output = self.scheduler.schedule(allowance)
        if not scheduler_output.num_scheduled_tokens:
            return []
        shape = step_shape(scheduler_output, self.scheduler.requests) if pacer else None
        try:
            return self._step(scheduler_output)
        finally:
            if pacer is not None:
                pacer.record(shape, time.perf_counter() - started, allowance)

    def _step(self, scheduler_output: SchedulerOutput) -> list[TokenEvent]:
        requests = self.scheduler.requests
        batch = self.runner.prepare(
            scheduler_output.num_scheduled_tokens,
            requests,
            self.kv_manager.get_block_ids,
            scheduler_output.scheduled_spec_token_ids,
        )
        logits = self.runner.execute(batch)
        sampled_requests = [requests[rid] for rid in batch.sampled_request_ids]
        tokens = self._sample(logits, batch.num_logits, sampled_requests, scheduler_output) if sampled_requests else []
        runner_output = ModelRunnerOutput(
            sampled_token_ids={r.request_id: [t.token_id for t in ts] for r, ts in zip(sampled_requests, tokens)}
        )
        self.scheduler.update_from_output(scheduler_output, runner_output)
        events = self._finish_tokens(sampled_requests, tokens)
        self.speculator.propose(self.scheduler.running)
        return events

    def _sample(
        self, logits: torch.Tensor, num_logits: list[int], requests: list[Request], out: SchedulerOutput
    ) -> list[list]:
        """Per sampled request, its new tokens (SampledToken): one sampled token, or a verified
        draft's accepted prefix and the target's own token, cut at a token-level stop."""
        if len(logits) == len(requests):  # no drafts this step: one batched sampling pass
            picked = sample_batch(
                logits,
                [r.params for r in requests],
                [self._generators[r.request_id] for r in requests],
                [(r.prompt_token_ids, r.output_token_ids) for r in requests],
                self._end_ids,
                [self._allowed(r) for r in requests],
            )
            return [[token] for token in picked]
        results, offset = [], 0
        for request, rows in zip(requests, num_logits):
            rid, own = request.request_id, logits[offset : offset + rows]
            offset += rows
            generator = self._generators[rid]
            if rows == 1:
                results.append(
                    sample_batch(
                        own,
                        [request.params],
                        [generator],
                        [(request.prompt_token_ids, request.output_token_ids)],
                        self._end_ids,
                        [self._allowed(request)],
                    )
                )
                continue
            results.append(self.speculator.verify(request, own, out.scheduled_spec_token_ids[rid], generator))
        return results

    def _allowed(self, request: Request) -> torch.Tensor | None:
        """A structured request's mask for its next token."""
        if request.matcher is None:
            return None
        mask = self.grammar.allowed(request.matcher, request.tokens_left(self.max_model_len))
        request.forced = [self.grammar.forces(mask)]  # for this step's event
        return torch.from_numpy(mask).to(self.device)

    def _finish_tokens(self, requests: list[Request], tokens: list[list]) -> list[TokenEvent]:
        """Check each new token's stop conditions, in order, and build its event."""
        events = []
        for request, new_tokens in zip(requests, tokens):
            first = request.num_output_tokens - len(new_tokens)  # the tokens are already appended
            for index, token in enumerate(new_tokens):
                count = first + index + 1
                if count == 1:
                    self.num_prompt_tokens_total += request.num_prompt_tokens
                self.num_generation_tokens_total += 1
                if request.matcher is not None:
                    request.matcher.consume_token(token.token_id)
                text, status = check_stop(
                    request,
                    token.token_id,
                    self.token_bytes(token.token_id),
                    token.token_id in self.eos_token_ids,
                    self.max_model_len,
                    num_output_tokens=count,
                )
                if status is not None:
                    request.truncate_output(count)  # a stop string inside an accepted run: nothing after it
                    self.scheduler.finish_request(request.request_id, status)
                    self._forget(request.request_id)
                events.append(
                    make_token_event(
                        request,
                        token,
                        text,
                        self.token_bytes,
                        self.token_text,
                        num_output_tokens=count,
                        forced=index < len(request.forced) and request.forced[index],
                    )
                )
                if status is not None:
                    break
        return events

    # -- status ----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        spec = self.speculator.stats
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_kv_blocks_total=self.num_blocks,
            num_kv_blocks_used=self.kv_manager.num_used_blocks,
            num_prompt_tokens_total=self.num_prompt_tokens_total,
            num_generation_tokens_total=self.num_generation_tokens_total,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            num_prefix_cache_hit_tokens_total=self.kv_manager.num_prefix_cache_hits_total,
            num_prefix_cache_query_tokens_total=self.kv_manager.num_prefix_cache_queries_total,
            num_spec_drafts_total=spec.num_drafts,
            num_spec_draft_tokens_total=spec.num_draft_tokens,
            num_spec_accepted_tokens_total=spec.num_accepted_tokens,
            spec_accepted_tokens_per_position=tuple(spec.accepted_per_position),
            kv_cache_dtype=str(self.kv_dtype).removeprefix("torch."),
            kv_cache_tokens_total=self.num_blocks * self.config.block_size,
            kv_cache_bytes_total=self.num_blocks * self.kv_block_bytes,
        )

    def close(self) -> None:
        self.abort_all()
