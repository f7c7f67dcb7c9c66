"""Drafting with a smaller model that shares the target's tokenizer.

The draft runs on the same engine code as the target (model classes, ModelRunner, paged
attention) with its own paged KV cache and block tables. Per request it keeps the tokens its
KV holds; before each proposal it catches up with the target's accepted tokens (a prefill
on first sight, then usually the one or two tokens the last verification added), rolls back
whatever the target rejected (the common prefix of what it computed and what the target
kept), and then decodes k tokens one batched forward at a time, every drafting request
together. Greedy requests draft with argmax; sampled requests draw from the draft's own
distribution under the request's temperature/top-k/top-p and return it as q for exact
rejection sampling. `draft:PATH@N` keeps only the model's first N layers: a layer-skip draft
made from the target itself when no smaller model with its tokenizer exists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from cloud_engine.block_manager import KVCacheManager
from cloud_engine.kernels import select_decode_kernel
from cloud_engine.kv_cache import allocate_kv_caches
from cloud_engine.loader import load_model
from cloud_engine.model_runner import ModelRunner
from cloud_engine.request import Request
from cloud_engine.sampler import make_generator, processed_probs
from cloud_engine.spec_decode.config import SpeculativeConfig

logger = logging.getLogger(__name__)
_TOKENIZER_CHECK_IDS = 4096  # ids compared between the draft's and the target's vocabularies


class DraftModelError(ValueError):
    """The draft model cannot draft for this target."""


@dataclass
class DraftSequence:
    """A request as the draft model sees it (duck-types Request for the runner and block manager)."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0
    block_hashes: list = field(default_factory=list)
    generator: torch.Generator | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelProposer:
    """Drafts with a smaller model (its own runner, KV pool and per-request sequences); q for sampled requests."""

    def __init__(self, engine, spec: SpeculativeConfig):
        loaded = load_model(spec.draft_model, dtype=engine.dtype, device=engine.device)
        check_same_tokenizer(loaded, engine)
        model, config = loaded.model, loaded.config
        if spec.draft_num_layers is not None:
            if spec.draft_num_layers > config.num_hidden_layers:
                raise DraftModelError(
                    f"draft_num_layers {spec.draft_num_layers} > the draft's {config.num_hidden_layers} layers"
                )
            model.model.layers = model.model.layers[: spec.draft_num_layers]
        if engine.int8_weights:  # the target's weight type: [cloud] weight_dtype sizes both models
            model.quantize_weights()
        else:
            model.pack_for_cpu()
        model.warm_up_packed(engine.config.max_num_batched_tokens, engine.config.max_logit_rows)
        self.device, self.block_size = engine.device, engine.config.block_size
        num_layers = len(model.model.layers)
        # As many blocks as the target's pool: the draft holds at most the same tokens. In the target's KV element
        # type: the target's block count was sized by it (an int8 pool holds ~2-4x the blocks of the same bytes).
        caches = allocate_kv_caches(
            num_layers,
            engine.num_blocks,
            self.block_size,
            config.num_key_value_heads,
            config.head_dim,
            engine.kv_dtype,
            engine.device,
        )
        model.bind_kv_caches(caches)
        kernel = select_decode_kernel(
            engine.config.attention_backend,
            engine.device,
            engine.dtype,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.runner = ModelRunner(model, self.block_size, engine.device, kernel)
        self.kv = KVCacheManager(engine.num_blocks, self.block_size, enable_prefix_caching=False)
        self.vocab_size = engine.vocab_size
        self._seqs: dict[str, DraftSequence] = {}
        logger.info("draft model %s: %d layers, %d KV blocks", loaded.name, num_layers, engine.num_blocks)

    def propose(
        self, requests: list[Request], num_tokens: dict[str, int]
    ) -> dict[str, tuple[list[int], torch.Tensor | None]]:
        seqs = {r.request_id: self._sync(r) for r in requests if num_tokens.get(r.request_id, 0) > 0}
        by_id = {r.request_id: r for r in requests}
        drafts: dict[str, list[int]] = {rid: [] for rid in seqs}
        probs: dict[str, list[torch.Tensor]] = {rid: [] for rid in seqs}
        active = dict(seqs)
        for step in range(max((num_tokens[rid] for rid in seqs), default=0)):
            scheduled = {}
            for rid, seq in list(active.items()):
                if len(drafts[rid]) >= num_tokens[rid]:
                    del active[rid]
                    continue
                num_new = seq.num_tokens - seq.num_computed_tokens
                if self.kv.allocate_slots(seq, num_new) is None:  # draft pool full: this request drafts less
                    del active[rid]
                    continue
                scheduled[rid] = num_new
            if not scheduled:
                break
            batch = self.runner.prepare(scheduled, active, self.kv.get_block_ids)
            logits = self.runner.execute(batch)
            for row, rid in enumerate(batch.sampled_request_ids):
                seq, params = active[rid], by_id[rid].params
                seq.num_computed_tokens = seq.num_tokens
                if params.is_greedy:
                    token = int(logits[row].argmax())
                else:
                    q = processed_probs(logits[row], params)
                    token = int(torch.multinomial(q, 1, generator=seq.generator)[0])
                    probs[rid].append(q)
                drafts[rid].append(token)
                seq.all_token_ids.append(token)  # its KV is computed on the next round (if any)
        result = {}
        for rid, draft in drafts.items():
            if draft:
                result[rid] = (draft, torch.stack(probs[rid]) if probs[rid] else None)
        return result

    def _sync(self, request: Request) -> DraftSequence:
        """The request's draft sequence caught up with the target's tokens: KV of tokens the
        target did not keep is dropped (their slots are rewritten), blocks past them freed."""
        seq = self._seqs.get(request.request_id)
        target = request.all_token_ids
        if seq is None:
            seed = request.params.seed
            generator = make_generator(None if seed is None else (seed + 1) % 2**63, self.device)
            seq = self._seqs[request.request_id] = DraftSequence(
                request.request_id, list(target), 0, generator=generator
            )
            return seq
        # At least the last token is recomputed: its logits give the first draft token (the draft
        # may already hold all of the target's tokens when the scheduler cut its last draft short).
        keep = min(common_prefix_len(seq.all_token_ids[: seq.num_computed_tokens], target), len(target) - 1)
        seq.num_computed_tokens = keep
        seq.all_token_ids = list(target)
        self.kv.free_excess_blocks(seq, seq.num_tokens)
        return seq

    def free(self, request_id: str) -> None:
        if self._seqs.pop(request_id, None) is not None:
            self.kv.free(request_id)

    @property
    def num_used_blocks(self) -> int:
        return self.kv.num_used_blocks


def check_same_tokenizer(draft, engine) -> None:
    """Draft tokens are target token ids: the vocabularies must be the same."""
    if draft.config.vocab_size != engine.vocab_size:
        raise DraftModelError(
            f"the draft model's vocabulary has {draft.config.vocab_size} tokens, the target's "
            f"{engine.vocab_size}; a draft model must share the target's tokenizer"
        )
    ids = list(range(min(_TOKENIZER_CHECK_IDS, engine.vocab_size)))
    if draft.tokenizer.convert_ids_to_tokens(ids) != engine.tokenizer.convert_ids_to_tokens(ids):
        raise DraftModelError(
            "the draft model's tokenizer differs from the target's (same size, other tokens); "
            "a draft model must share the target's tokenizer"
        )
