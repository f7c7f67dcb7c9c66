"""The local engine's synchronous core: `step()` is schedule -> run -> update.

Single-threaded by design: the async wrapper runs it on its own thread and is
the only caller. Every step is one `llama_decode` carrying each running
sequence's decode token plus prefill chunks, under the scheduler's token budget.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import numpy as np

from local_runtime.block_manager import BlockManager
from local_runtime.config import LocalEngineConfig
from local_runtime.drafting import Drafting
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from local_runtime.prefill_choice import open_prefill_context
from local_runtime.prefill_context import PrefillContext, PromptChunk
from local_runtime.request import Request, RequestStatus
from local_runtime.sampler import sample_batch
from local_runtime.scheduler import Scheduler
from sdk.engine_common.chat_template import render_chat
from sdk.engine_common.grammar import GrammarMasks
from sdk.protocol.engine import (
    ContextLengthError,
    EngineStats,
    GenerationRequest,
    TokenEvent,
    validate_generation_request,
)
from sdk.engine_common.model_files import model_name_for, resolve_model_path
from sdk.engine_common.sampling_defaults import resolve_sampling_defaults
from sdk.engine_common.token_events import check_stop, make_token_event
from sdk.engine_common.detokenize import detokenize
from sdk.protocol.vocabulary import vocabulary_fingerprint

logger = logging.getLogger("tandem.local")

# A prompt chunk shorter than this runs on the model's own weights even where a prefill copy is
# open: the copy's pass reads ~3x the bytes of a 4-bit file and moves the chunk's prefix twice, which
# a few rows do not win back, while in the main context they join a pass that is made anyway. Measured
# on an AVX2 EPYC with the F16 copy (the embedded model, after a 100-token prefix, alone): 8 tokens
# took 33 ms either way, 16 took 0.77x on the copy, 32 took 0.58x.
MIN_COPY_TOKENS = 16


class LocalEngine:
    """A GGUF model served with tandem's scheduler, block manager and sampler."""

    max_draft_tokens = 0  # verifies no drafts made outside (it drafts for the cloud: sdk.cascade.device_drafts)

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
                kv_cache_type=config.kv_cache_type,
                extra_buffer_types=config.extra_buffer_types,
                batch_invariant=config.batch_invariant and config.n_gpu_layers == 0,
                pad_single_decodes=config.strict_batch_invariance and config.n_gpu_layers == 0,
                kv_streams=config.kv_streams,
                scratch_sequence=config.may_prefill_on_copy and not config.kv_streams,
            )
        )
        self.prefill: PrefillContext | None = None
        try:  # whatever fails from here on, the contexts opened so far are closed
            self._set_up(config, path)
        except BaseException:
            self.close()
            raise

    def _set_up(self, config: LocalEngineConfig, path: str) -> None:
        self.max_model_len = config.max_model_len or min(self.backend.n_ctx_train, config.longest_sequence)
        if self.max_model_len > self.backend.n_ctx_train:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's trained context {self.backend.n_ctx_train}"
            )
        if self.max_model_len > self.backend.cells_per_slot:  # streams llama.cpp sized otherwise than asked
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the {self.backend.cells_per_slot} KV cells of a slot"
            )
        self.prefill, self.prefill_choice = open_prefill_context(self.backend, config, path, self.max_model_len)
        choice = self.prefill_choice
        route = f"through the {choice.kind} copy of the weights" if choice.kind else "on the model's own weights"
        logger.info("local prompts prefill %s: %s", route, choice.reason)
        self.block_manager = BlockManager(config.num_blocks, config.block_size)
        self.kv_bytes_per_cell = self.backend.kv_bytes_per_cell  # in kv_cache_type, for stats() and /health
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            cache_finished_prompts=config.cache_finished_prompts,
            max_cached_prompts=config.max_cached_prompts,
            slots_own_their_cells=config.kv_streams,
        )
        self.drafting = Drafting(self.scheduler, self.backend)  # drafting for another model (the cloud's)
        self.chat_template = self.backend.metadata("tokenizer.chat_template")
        self._bos_text = self.backend.special_token_text("bos")
        self._eos_text = self.backend.special_token_text("eos")
        self.max_token_bytes = self.backend.max_token_bytes()  # a text of B bytes is >= B / this tokens
        # For min_tokens: the ids that would end generation early and are masked until then.
        self._end_ids = np.array(
            [i for i in range(self.backend.n_vocab) if self.backend.is_end_of_generation(i)], dtype=np.int64
        )
        backend = self.backend  # structured requests' masks, over llama.cpp's token bytes
        self.grammar = GrammarMasks(
            lambda: [backend.token_bytes(i) for i in range(backend.n_vocab)],
            backend.eos_token_id,
            lambda text: backend.tokenize(text, add_special=False, parse_special=False),
        )
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
                f"come to at least {min_tokens} tokens. Please reduce the length of the messages.",
                "messages",
            )
        # The template writes its own special tokens; add BOS only if it did not.
        add_bos = self.backend.adds_bos and not (self._bos_text and prompt.startswith(self._bos_text))
        return self.backend.tokenize(prompt, add_special=add_bos, parse_special=True)

    @functools.cached_property
    def vocabulary_fingerprint(self) -> str:
        """sdk.protocol.vocabulary's fingerprint (computed on first use: ~0.1 s for 49k tokens)."""
        return vocabulary_fingerprint(self.backend.vocabulary())

    @property
    def vocab_size(self) -> int:
        return self.backend.n_vocab

    # -- requests --------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError/ContextLengthError for a request that can never run."""
        validate_generation_request(request, self.backend.n_vocab, self.max_model_len)

    def add_request(self, request: GenerationRequest, hold_at: int | None = None) -> None:
        self.validate(request)
        params = self.sampling_defaults.apply(request.params)  # the fields the request left out
        if params.repetition_stop is None:
            params = dataclasses.replace(params, repetition_stop=self.config.repetition_stop)
        if params.close_within_max_tokens is None:
            params = dataclasses.replace(params, close_within_max_tokens=self.config.close_within_max_tokens)
        matcher = (
            self.grammar.matcher(params.structured, request.continuation_token_ids, params.close_within_max_tokens)
            if params.structured is not None
            else None
        )  # 400 before scheduling
        engine_request = Request(request.request_id, list(request.prompt_token_ids), params, hold_at=hold_at)
        engine_request.matcher = matcher
        self.scheduler.add_request(engine_request)

    def rewind(self, request_id: str, keep: int, append: list[int], hold_at: int | None = None) -> bool:
        """A drafting request (added with `hold_at`) told what the verifier made of its draft
        (local_runtime.drafting.Drafting.rewind)."""
        return self.drafting.rewind(request_id, keep, append, hold_at)

    def hold_further(self, request_id: str, hold_at: int) -> bool:
        """A drafting request's hold raised: the verifier still agrees (local_runtime.drafting)."""
        return self.drafting.hold_further(request_id, hold_at)

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
        """Whether a step has work: drafting requests held for their verdict do not count (a rewind wakes them)."""
        return self.scheduler.num_schedulable > 0

    # -- the step --------------------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        """Schedule, run the step's tokens, sample. Between steps a running request's slot holds exactly
        the cells of positions [0, num_computed_tokens) in the main context; a step that raises restores
        that (or sends the request back to be recomputed) before the error goes on, so nothing a later
        request reuses, the prompt cache above all, claims cells the context lacks."""
        out = self.scheduler.schedule()
        for slot in out.cleared_slots:
            self.backend.clear_slot(slot)
        scheduled = [
            (self.scheduler.requests[request_id], num_new) for request_id, num_new in out.num_scheduled_tokens.items()
        ]
        try:
            for src_slot, dst_slot, num_tokens in out.prefix_copies:
                self.backend.share_prefix(src_slot, dst_slot, num_tokens)
            on_copy = self._prefill_on_copy(self._chunks_for_the_copy(scheduled))
            sampled_requests, logits = self._run_main(scheduled, on_copy)
        except BaseException:
            self._restore_after_failure([request for request, _ in scheduled])
            raise
        self.scheduler.on_step_done(out)
        return self._update(sampled_requests, logits)

    def _chunks_for_the_copy(self, scheduled: list[tuple[Request, int]]) -> list[PromptChunk]:
        """The prompt tokens this step runs on the prefill copy: each chunk of at least MIN_COPY_TOKENS,
        but the token whose logits pick the next token (it runs on the model's own weights, as every
        decode does, so the signals the cascade reads and its probes were fitted on come from them), while
        the copy's pool holds the chunks and their prefixes. The rest run in the main context."""
        if self.prefill is None:
            return []
        chunks, num_cells = [], 0
        for request, num_new in scheduled:
            start = request.num_computed_tokens
            num_copy = num_new - 1 if start + num_new == request.num_tokens else num_new
            if num_copy < MIN_COPY_TOKENS or num_cells + start + num_copy > self.prefill.n_cells:
                continue
            num_cells += start + num_copy
            token_ids = np.asarray(request.all_token_ids[start : start + num_copy], dtype=np.int32)
            chunks.append(PromptChunk(request.slot, start, token_ids))
        return chunks

    def _prefill_on_copy(self, chunks: list[PromptChunk]) -> dict[int, int]:
        """Run the chunks on the copy; slot -> tokens computed there. A failure there costs this step
        nothing: the copy is closed for good (with one warning), the slots it touched get their books'
        cells back, and their chunks run in the main context (or, for a slot whose cells were lost, the
        request goes back to be recomputed)."""
        if not chunks:
            return {}
        try:
            self.prefill.prefill(chunks)
        except Exception as exc:
            logger.warning(
                "the %s prefill copy failed (%s: %s); prompts prefill on the model's own weights from now on",
                self.prefill.kind,
                type(exc).__name__,
                exc,
            )
            self._close_prefill()
            slots = {chunk.slot for chunk in chunks}
            self._restore_after_failure([r for r in self.scheduler.running if r.slot in slots])
            return {}
        return {chunk.slot: len(chunk.token_ids) for chunk in chunks}

    def _run_main(
        self, scheduled: list[tuple[Request, int]], on_copy: dict[int, int]
    ) -> tuple[list[Request], np.ndarray]:
        """Decode, in the main context, each request's tokens the copy did not compute."""
        chunks = []
        for request, num_new in scheduled:
            if request.status != RequestStatus.RUNNING:
                continue  # sent back to be recomputed after the copy failed
            done = on_copy.get(request.slot, 0)
            if num_new > done:
                chunks.append((request, request.num_computed_tokens + done, num_new - done))
        if not chunks:
            return [], self._logits_buffer[:0]
        return self._run(chunks, self._logits_buffer)

    def _restore_after_failure(self, requests: list[Request]) -> None:
        """Give each request's slot back exactly the cells its books say it has, positions [0,
        num_computed_tokens): cells a failed decode or move left past them are dropped; a slot that
        lost some (a stream rewritten halfway) is freed and its request recomputed later."""
        for request in requests:
            if request.status != RequestStatus.RUNNING or request.slot is None:
                continue
            self.backend.drop_positions(request.slot, request.num_computed_tokens)
            if not self.slot_holds_its_cells(request.slot, request.num_computed_tokens):
                logger.warning("request %s lost KV cells in a failed step; it is recomputed", request.request_id)
                self.scheduler.preempt(request.request_id)

    def slot_holds_its_cells(self, slot: int, num_tokens: int) -> bool:
        """Whether the main context's `slot` holds the cells of positions [0, num_tokens) and no others
        (positions run unbroken in a slot, so the first and the last tell)."""
        if num_tokens == 0:
            return self.backend.slot_max_position(slot) == -1
        return self.backend.slot_min_position(slot) == 0 and self.backend.slot_max_position(slot) == num_tokens - 1

    def _close_prefill(self) -> None:
        if self.prefill is not None:
            self.prefill.close()
            self.prefill = None

    def _run(self, chunks: list[tuple[Request, int, int]], logits_out: np.ndarray) -> tuple[list[Request], np.ndarray]:
        """Flatten (request, first position, number of tokens) chunks into one batch and decode it in the
        main context; the requests whose prompt or output is then computed to the end sample."""
        n = sum(num_tokens for _, _, num_tokens in chunks)
        token_ids = np.empty(n, dtype=np.int32)
        positions = np.empty(n, dtype=np.int32)
        slots = np.empty(n, dtype=np.int32)
        want_logits = np.zeros(n, dtype=np.int8)
        sampled_requests = []
        i = 0
        if self.backend.config.kv_streams:  # slots in order: one ubatch for consecutive slots (LlamaBackend.decode)
            chunks = sorted(chunks, key=lambda chunk: chunk[0].slot)
        for request, start, num_tokens in chunks:
            token_ids[i : i + num_tokens] = request.all_token_ids[start : start + num_tokens]
            positions[i : i + num_tokens] = np.arange(start, start + num_tokens)
            slots[i : i + num_tokens] = request.slot
            if start + num_tokens == request.num_tokens:
                want_logits[i + num_tokens - 1] = 1
                sampled_requests.append(request)
            i += num_tokens
        logits = self.backend.decode(token_ids, positions, slots, want_logits, out=logits_out)
        return sampled_requests, logits

    def _update(self, requests: list[Request], logits: np.ndarray) -> list[TokenEvent]:
        """Sample the next token of every request that caught up, then check its stops."""
        if not requests:
            return []
        histories = [(r.prompt_token_ids, r.output_token_ids) for r in requests]
        allowed = [
            self.grammar.allowed(r.matcher, r.tokens_left(self.max_model_len)) if r.matcher is not None else None
            for r in requests
        ]
        drafting = [r.hold_at is not None for r in requests]  # a drafting request reports each token's q
        sampled = sample_batch(
            logits, [r.params for r in requests], [r.rng for r in requests], histories, self._end_ids, allowed, drafting
        )
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
                request,
                token.token_id,
                backend.token_bytes(token.token_id),
                backend.is_end_of_generation(token.token_id),
                self.max_model_len,
            )
            if status is not None:
                self.scheduler.finish_request(request.request_id, status)
            events.append(
                make_token_event(
                    request, token, text, backend.token_bytes, backend.token_text, forced=self.grammar.forces(mask)
                )
            )
        return events

    # -- status ----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        # Called from the event loop while the engine thread steps: iterate snapshots taken in one C call (atomic
        # under the GIL), never the live deque, which the step may change mid-iteration ("deque mutated").
        waiting = tuple(self.scheduler.waiting)
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(waiting),
            num_kv_blocks_total=self.block_manager.num_blocks,
            num_kv_blocks_used=self.block_manager.num_used_blocks - self.scheduler.num_cached_blocks,
            num_prompt_tokens_total=self.num_prompt_tokens_total,
            num_generation_tokens_total=self.num_generation_tokens_total,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            num_prefix_cache_hit_tokens_total=self.scheduler.num_prefix_cache_hit_tokens_total,
            num_prefix_cache_query_tokens_total=self.scheduler.num_prefix_cache_query_tokens_total,
            num_waiting_drafts=sum(1 for request in waiting if request.hold_at is not None),
            kv_cache_dtype=self.config.kv_cache_type,
            kv_cache_tokens_total=self.config.pool_tokens,
            kv_cache_bytes_total=self.config.pool_tokens * self.kv_bytes_per_cell,
        )

    def close(self) -> None:
        self._close_prefill()
        self.backend.close()
