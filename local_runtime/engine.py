"""The local engine's synchronous core: `step()` is schedule -> run -> update.

Single-threaded by design: the async wrapper runs it on its own thread and is
the only caller. Every step is one `llama_decode` carrying each running
sequence's decode token plus prefill chunks, under the scheduler's token budget.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from local_runtime.block_manager import BlockManager
from local_runtime.config import LocalEngineConfig
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from local_runtime.prefill_context import open_prefill_context
from local_runtime.request import Request, RequestStatus
from local_runtime.sampler import sample_batch
from local_runtime.scheduler import Scheduler
from sdk.protocol.chat_template import render_chat
from sdk.protocol.grammar import GrammarMasks
from sdk.protocol.engine import (
    ContextLengthError,
    EngineStats,
    GenerationRequest,
    TokenEvent,
    validate_generation_request,
)
from sdk.protocol.model_files import model_name_for, resolve_model_path
from sdk.protocol.sampling_defaults import resolve_sampling_defaults
from sdk.protocol.token_events import check_stop, make_token_event
from sdk.protocol.detokenize import detokenize
from sdk.protocol.vocabulary import vocabulary_fingerprint



class LocalEngine:
    """A GGUF model served with tandem's scheduler, block manager and sampler."""

    def __init__(self, config: LocalEngineConfig):
        self.config = config
        path = resolve_model_path(config.model_path)
        self.model_name = config.model_name or model_name_for(config.model_path)
        self.sampling_defaults = resolve_sampling_defaults(config.sampling, path)
        self.backend = LlamaBackend(
            LlamaBackendConfig(
                model_path=path,
                n_ctx=config.pool_tokens,
                n_seq_max=config.max_num_seqs,
                n_batch=config.max_num_batched_tokens,
                n_threads=config.threads,
                n_gpu_layers=config.n_gpu_layers,
                flash_attn=config.flash_attn,
                extra_buffer_types=config.extra_buffer_types,
                batch_invariant=config.batch_invariant and config.n_gpu_layers == 0,
                pad_single_decodes=config.strict_batch_invariance and config.n_gpu_layers == 0,
                kv_streams=config.kv_streams,
                scratch_sequence=config.may_prefill_on_copy and not config.kv_streams,
            )
        )
        self.max_model_len = config.max_model_len or min(self.backend.n_ctx_train, config.longest_sequence)
        if self.max_model_len > self.backend.n_ctx_train:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's trained context {self.backend.n_ctx_train}")
        if self.max_model_len > self.backend.cells_per_slot:  # streams llama.cpp sized otherwise than asked
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the {self.backend.cells_per_slot} KV cells of a slot")
        self.prefill = open_prefill_context(self.backend, config, path, self.max_model_len)
        self.block_manager = BlockManager(config.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   cache_finished_prompts=config.cache_finished_prompts,
                                   max_cached_prompts=config.max_cached_prompts,
                                   slots_own_their_cells=config.kv_streams)
        self.chat_template = self.backend.metadata("tokenizer.chat_template")
        self._bos_text = self.backend.special_token_text("bos")
        self._eos_text = self.backend.special_token_text("eos")
        self.max_token_bytes = self.backend.max_token_bytes()  # a text of B bytes is >= B / this tokens
        # For min_tokens: the ids that would end generation early and are masked until then.
        self._end_ids = np.array([i for i in range(self.backend.n_vocab) if self.backend.is_end_of_generation(i)], dtype=np.int64)
        backend = self.backend  # structured requests' masks, over llama.cpp's token bytes
        self.grammar = GrammarMasks(lambda: [backend.token_bytes(i) for i in range(backend.n_vocab)], backend.eos_token_id,
                                    lambda text: backend.tokenize(text, add_special=False, parse_special=False))
        self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = 0
        # Each step's logits land here (one row per request that samples), not in a fresh array.
        self._logits_buffer = np.empty((config.max_num_seqs, self.backend.n_vocab), dtype=np.float32)

    # -- text in ---------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.backend.tokenize(text, add_special=add_special, parse_special=False)

    def detokenize(self, token_ids) -> str:
        return detokenize(token_ids, self.backend.n_vocab, self.backend.token_bytes)

    def apply_chat_template(self, messages) -> list[int]:
        prompt = render_chat(self.chat_template, messages, self._bos_text, self._eos_text)
        # llama.cpp's special-token pass grows faster than linearly in the text (a 1.5 MB body
        # of small messages took over 30 s): refuse what cannot fit before tokenizing it.
        min_tokens = len(prompt.encode("utf-8")) // self.max_token_bytes
        if min_tokens > self.max_model_len:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your messages "
                f"come to at least {min_tokens} tokens. Please reduce the length of the messages.", "messages",
            )  # fmt: skip
        # The template writes its own special tokens; add BOS only if it did not.
        add_bos = self.backend.adds_bos and not (self._bos_text and prompt.startswith(self._bos_text))
        return self.backend.tokenize(prompt, add_special=add_bos, parse_special=True)

    @functools.cached_property
    def vocabulary_fingerprint(self) -> str:
        """sdk.protocol.vocabulary's fingerprint (computed on first use: ~0.1 s for 49k tokens)."""
        return vocabulary_fingerprint(self.backend.vocabulary())

    # -- requests --------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError/ContextLengthError for a request that can never run."""
        validate_generation_request(request, self.backend.n_vocab, self.max_model_len)

    def add_request(self, request: GenerationRequest) -> None:
        self.validate(request)
        params = self.sampling_defaults.apply(request.params)  # the fields the request left out
        if params.repetition_stop is None:
            params = dataclasses.replace(params, repetition_stop=self.config.repetition_stop)
        if params.close_within_max_tokens is None:
            params = dataclasses.replace(params, close_within_max_tokens=self.config.close_within_max_tokens)
        matcher = self.grammar.matcher(params.structured, request.continuation_token_ids, params.close_within_max_tokens) if params.structured is not None else None  # 400 before scheduling
        engine_request = Request(request.request_id, list(request.prompt_token_ids), params)
        engine_request.matcher = matcher
        self.scheduler.add_request(engine_request)

    def abort_request(self, request_id: str) -> bool:
        """Free the request's slot and blocks now; False if it was not here."""
        return self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED) is not None

    def clear_prompt_cache(self) -> None:
        """Forget every finished prompt's cells now (local_runtime.prompt_cache)."""
        for slot in self.scheduler.clear_prompt_cache():
            self.backend.clear_slot(slot)

    def abort_all(self) -> None:
        for request_id in list(self.scheduler.requests):
            self.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # -- the step --------------------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        out = self.scheduler.schedule()
        for slot in out.cleared_slots:
            self.backend.clear_slot(slot)
        scheduled = [(self.scheduler.requests[request_id], num_new) for request_id, num_new in out.num_scheduled_tokens.items()]
        on_copy = self._prompts_for_the_copy(scheduled)
        prefix_sources = {}  # slot -> the main context's slot holding its prefix, for prompts run on the copy
        for src_slot, dst_slot, num_tokens in out.prefix_copies:
            if dst_slot in on_copy and self.backend.config.kv_streams:
                prefix_sources[dst_slot] = src_slot  # the copy loads the prefix from src; its stream is filled whole after
                if src_slot == dst_slot:
                    self.backend.share_prefix(src_slot, dst_slot, num_tokens)
            else:
                self.backend.share_prefix(src_slot, dst_slot, num_tokens)
        if not scheduled:
            return []
        if on_copy:  # the copy's rows first, then the main context's, in one logits buffer
            sampled_requests = self._run_on_copy([(r, n) for r, n in scheduled if r.slot in on_copy], prefix_sources)
            main = [(r, n) for r, n in scheduled if r.slot not in on_copy]
            if main:
                sampled_requests += self._run(main, self._logits_buffer[len(sampled_requests):])[0]
            logits = self._logits_buffer[: len(sampled_requests)]
        else:
            sampled_requests, logits = self._run(scheduled, self._logits_buffer)
        self.scheduler.on_step_done(out)
        return self._update(sampled_requests, logits)

    def _prompts_for_the_copy(self, scheduled: list[tuple[Request, int]]) -> set[int]:
        """Slots whose chunk this step runs on the prefill copy: every chunk of more than one token
        (a decode, or a prompt's last lone token, stays on the model's own weights), while the copy's
        pool holds them and their prefixes; the rest run in the main context as they would without it."""
        if self.prefill is None:
            return set()
        slots, cells = set(), 0
        for request, num_new in scheduled:
            need = request.num_computed_tokens + num_new
            if num_new > 1 and cells + need <= self.prefill.n_cells:
                slots.add(request.slot)
                cells += need
        return slots

    def _run_on_copy(self, scheduled: list[tuple[Request, int]], prefix_sources: dict[int, int]) -> list[Request]:
        """Prefill these chunks in the copy's context, then move their new cells to the main context;
        the sampled requests' logits are the head of the logits buffer."""
        try:
            for request, _ in scheduled:
                if request.num_computed_tokens:
                    self.prefill.load_prefix(request.slot, prefix_sources.get(request.slot, request.slot), request.num_computed_tokens)
            sampled, _ = self._run(scheduled, self._logits_buffer, self.prefill.backend)
        except BaseException:
            for request, _ in scheduled:
                self.prefill.backend.clear_slot(request.slot)
            raise
        for request, _ in scheduled:
            self.prefill.move_to_main(request.slot, request.num_computed_tokens)
        return sampled

    def _run(self, scheduled: list[tuple[Request, int]], logits_out: np.ndarray,
             backend: LlamaBackend | None = None) -> tuple[list[Request], np.ndarray]:
        """Flatten these chunks into one batch and decode it (in the main context unless `backend`)."""
        backend = backend or self.backend
        n = sum(num_new for _, num_new in scheduled)
        token_ids = np.empty(n, dtype=np.int32)
        positions = np.empty(n, dtype=np.int32)
        slots = np.empty(n, dtype=np.int32)
        want_logits = np.zeros(n, dtype=np.int8)
        sampled_requests = []
        i = 0
        if backend.config.kv_streams:  # slots in increasing order: one ubatch for consecutive slots (LlamaBackend.decode)
            scheduled = sorted(scheduled, key=lambda item: item[0].slot)
        for request, num_new in scheduled:
            start = request.num_computed_tokens
            token_ids[i : i + num_new] = request.all_token_ids[start : start + num_new]
            positions[i : i + num_new] = np.arange(start, start + num_new)
            slots[i : i + num_new] = request.slot
            if start + num_new == request.num_tokens:
                want_logits[i + num_new - 1] = 1
                sampled_requests.append(request)
            i += num_new
        logits = backend.decode(token_ids, positions, slots, want_logits, out=logits_out)
        return sampled_requests, logits

    def _update(self, requests: list[Request], logits: np.ndarray) -> list[TokenEvent]:
        """Sample the next token of every request that caught up, then check its stops."""
        if not requests:
            return []
        histories = [(r.prompt_token_ids, r.output_token_ids) for r in requests]
        allowed = [self.grammar.allowed(r.matcher, r.tokens_left(self.max_model_len)) if r.matcher is not None else None for r in requests]
        sampled = sample_batch(logits, [r.params for r in requests], [r.rng for r in requests], histories, self._end_ids, allowed)
        events = []
        backend = self.backend
        for request, token, mask in zip(requests, sampled, allowed):
            if not request.output_token_ids:
                self.num_prompt_tokens_total += request.num_prompt_tokens
            request.append_output_token(token.token_id)
            if request.matcher is not None:
                request.matcher.consume_token(token.token_id)
            self.num_generation_tokens_total += 1
            text, status = check_stop(
                request, token.token_id, backend.token_bytes(token.token_id),
                backend.is_end_of_generation(token.token_id), self.max_model_len,
            )
            if status is not None:
                self.scheduler.finish_request(request.request_id, status)
            events.append(make_token_event(request, token, text, backend.token_bytes, backend.token_text,
                                           forced=self.grammar.forces(mask)))  # fmt: skip
        return events

    # -- status ----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_kv_blocks_total=self.block_manager.num_blocks,
            num_kv_blocks_used=self.block_manager.num_used_blocks - self.scheduler.num_cached_blocks,
            num_prompt_tokens_total=self.num_prompt_tokens_total,
            num_generation_tokens_total=self.num_generation_tokens_total,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            num_prefix_cache_hit_tokens_total=self.scheduler.num_prefix_cache_hit_tokens_total,
            num_prefix_cache_query_tokens_total=self.scheduler.num_prefix_cache_query_tokens_total,
        )

    def close(self) -> None:
        if self.prefill is not None:
            self.prefill.close()
        self.backend.close()
