"""Turns a SchedulerOutput into one forward pass: flattened tokens, positions and attention metadata.

A step whose every token samples goes to the compiled decode graph where [cloud] compile turned it
on (cloud_engine.compiled_decode): a decode step (each request adds one token), or one verifying
drafts (a request adds its last token and its draft, each of them sampled), or a mix of the two.
Each of those tokens becomes a row of its own, with its request's block table and the context up to
and including itself, so a draft's tokens attend causally without a mask of their own: the step
writes every row's K/V before any row reads (tandem_cpu::write_and_attend, tandem::paged_decode_attention).

Decode requests (one new token) go first, then prefill chunks, which is the order the
attention layer expects (it batches the decode group in one call). Only the last token
of a request that catches up with its tokens gets logits: that is the row it samples from.
A request verifying a speculative draft runs its last token + the draft as one chunk and
gets logits for all of them (draft + 1 rows: one per draft position, plus the bonus).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cloud_engine.attention_metadata import AttentionMetadata, DecodeMetadata
from cloud_engine.request import Request


@dataclass
class BatchInputs:
    """One step's flattened batch, ready for the model."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    attn_metadata: AttentionMetadata | DecodeMetadata
    logits_rows: torch.Tensor  # [num_logits] int64: batch rows whose logits are computed
    sampled_request_ids: list[str]  # requests that sample, in the order of their logits rows
    num_logits: list[int]  # rows per sampled request (1, or draft length + 1)
    compiled_bucket: int = 0  # > 0: a compiled step staged in that many rows (live ones first, each sampled)


class ModelRunner:
    """Owns the model and its bound KV caches; one `execute` per engine step."""

    def __init__(self, model, block_size: int, device: torch.device, decode_kernel=None, compiled_decode=None):
        self.model = model
        self.block_size = block_size
        self.device = device
        self.decode_kernel = decode_kernel  # native decode attention, or None for the portable path
        self.compiled_decode = compiled_decode  # a CompiledDecode, or None: every step eager

    def prepare(
        self,
        num_scheduled_tokens: dict[str, int],
        requests: dict[str, Request],
        block_ids_of,
        spec_token_ids: dict[str, list[int]] | None = None,
    ) -> BatchInputs:
        """Build the batch for the scheduled requests; `block_ids_of(request_id)` gives a request's
        block table, `spec_token_ids` the drafts scheduled after some requests' last token."""
        spec_token_ids = spec_token_ids or {}
        order = sorted(num_scheduled_tokens, key=lambda rid: num_scheduled_tokens[rid] != 1)  # stable: decodes first
        num_decodes = sum(1 for rid in order if num_scheduled_tokens[rid] == 1)
        bs = self.block_size
        token_chunks, position_chunks, slot_chunks = [], [], []
        query_start_loc, seq_lens, tables = [0], [], []
        logits_rows, sampled_ids, num_logits = [], [], []
        for rid in order:
            request = requests[rid]
            num_new = num_scheduled_tokens[rid]
            start = request.num_computed_tokens
            end = start + num_new
            table = np.asarray(block_ids_of(rid), dtype=np.int64)
            positions = np.arange(start, end, dtype=np.int64)
            spec = spec_token_ids.get(rid, ())
            tokens = request.all_token_ids
            token_chunks.append(tokens[start:end] if end <= len(tokens) else [*tokens[start:], *spec][: end - start])
            position_chunks.append(positions)
            slot_chunks.append(table[positions // bs] * bs + positions % bs)
            tables.append(table)
            seq_lens.append(end)
            query_start_loc.append(query_start_loc[-1] + num_new)
            if end == request.num_tokens + len(spec):
                logits_rows.extend(range(query_start_loc[-1] - 1 - len(spec), query_start_loc[-1]))
                sampled_ids.append(rid)
                num_logits.append(len(spec) + 1)
        block_tables = _padded_tables(tables)
        num_tokens = query_start_loc[-1]
        compiled = self.compiled_decode
        # Every token samples (decodes and whole verifications, no prompt chunk): the compiled graph's rows.
        if (
            compiled is not None
            and len(sampled_ids) == len(order)
            and sum(num_logits) == num_tokens <= compiled.max_rows
        ):
            positions = np.concatenate(position_chunks)
            bucket = compiled.stage(
                np.fromiter((t for chunk in token_chunks for t in chunk), dtype=np.int64, count=num_tokens),
                positions,
                np.concatenate(slot_chunks),
                np.repeat(block_tables, np.diff(query_start_loc), axis=0),  # each row its request's table
                positions + 1,  # each row's context: up to and including itself
            )
            input_ids, positions, slot_mapping, staged_tables, staged_lens = compiled.views(bucket)
            return BatchInputs(
                input_ids=input_ids,
                positions=positions,
                attn_metadata=DecodeMetadata(slot_mapping, staged_tables, staged_lens, compiled.native_attention),
                logits_rows=positions[:0],  # every live row samples: the first num_tokens of the bucket
                sampled_request_ids=sampled_ids,
                num_logits=num_logits,
                compiled_bucket=bucket,
            )
        to_device = lambda array: torch.from_numpy(array).to(self.device, non_blocking=True)  # noqa: E731
        metadata = AttentionMetadata(
            slot_mapping=to_device(np.concatenate(slot_chunks)),
            block_tables=to_device(block_tables),
            seq_lens=to_device(np.asarray(seq_lens, dtype=np.int64)),
            query_start_loc=query_start_loc,
            seq_lens_list=seq_lens,
            num_decodes=num_decodes,
            block_size=bs,
            decode_kernel=self.decode_kernel,
        )
        return BatchInputs(
            input_ids=to_device(np.fromiter((t for chunk in token_chunks for t in chunk), dtype=np.int64)),
            positions=to_device(np.concatenate(position_chunks)),
            attn_metadata=metadata,
            logits_rows=to_device(np.asarray(logits_rows, dtype=np.int64)),
            sampled_request_ids=sampled_ids,
            num_logits=num_logits,
        )

    @torch.inference_mode()
    def execute(self, batch: BatchInputs) -> torch.Tensor:
        """Run the model; float32 logits [num_sampled, vocab] for the sampled rows (maybe zero rows)."""
        if batch.compiled_bucket:
            return self.compiled_decode.forward(batch.compiled_bucket)[: sum(batch.num_logits)]  # a view: no copy
        hidden = self.model(batch.input_ids, batch.positions, batch.attn_metadata)
        if not batch.sampled_request_ids:
            return hidden.new_empty((0, 0), dtype=torch.float32)
        return self.model.compute_logits(hidden[batch.logits_rows]).float()


def _padded_tables(tables: list[np.ndarray]) -> np.ndarray:
    """Block tables as one int64 array [num_seqs, longest], shorter rows padded with block 0."""
    padded = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int64)
    for row, table in enumerate(tables):
        padded[row, : len(table)] = table
    return padded
