"""Build paged-attention batches by hand for model tests: a tiny stand-in for the runner.

Blocks come from a shuffled pool, so block tables are deliberately not contiguous.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from cloud_engine.attention_metadata import AttentionMetadata


def make_kv_caches(config, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
    """Zeroed (key, value) caches per layer, [num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(config.num_hidden_layers)
    ]


@dataclass
class StepBatch:
    """One flattened step: model inputs plus which sequence and position each row is."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    row_owners: list[tuple[object, int]]  # (sequence id, position) for every row of the batch


class PagedBatchBuilder:
    """Tracks each sequence's tokens, progress and blocks; `step` lays out one batch, decodes first."""

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0, device="cpu", decode_kernel=None):
        self.block_size = block_size
        self.device = device
        self.decode_kernel = decode_kernel
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.tokens: dict[object, list[int]] = {}
        self.num_computed: dict[object, int] = {}
        self.block_tables: dict[object, list[int]] = {}

    def add_sequence(self, seq_id, token_ids: list[int]) -> None:
        self.tokens[seq_id] = list(token_ids)
        self.num_computed[seq_id] = 0
        self.block_tables[seq_id] = []

    def step(self, num_new_tokens: dict[object, int]) -> StepBatch:
        """Schedule `num_new_tokens[seq]` next tokens of each sequence (1 = decode)."""
        order = sorted(num_new_tokens, key=lambda s: num_new_tokens[s] != 1)  # stable: decodes first
        bs = self.block_size
        ids, positions, slots, seq_lens, qsl, tables, owners = [], [], [], [], [0], [], []
        for seq in order:
            start = self.num_computed[seq]
            end = start + num_new_tokens[seq]
            if end > len(self.tokens[seq]):
                raise ValueError(f"sequence {seq} has only {len(self.tokens[seq])} tokens")
            table = self.block_tables[seq]
            while len(table) * bs < end:
                table.append(self.free_blocks.pop())
            for pos in range(start, end):
                ids.append(self.tokens[seq][pos])
                positions.append(pos)
                slots.append(table[pos // bs] * bs + pos % bs)
                owners.append((seq, pos))
            self.num_computed[seq] = end
            seq_lens.append(end)
            qsl.append(qsl[-1] + end - start)
            tables.append(list(table))
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=self.device)  # noqa: E731
        metadata = AttentionMetadata(
            slot_mapping=as_tensor(slots),
            block_tables=as_tensor(padded),
            seq_lens=as_tensor(seq_lens),
            query_start_loc=qsl,
            seq_lens_list=seq_lens,
            num_decodes=sum(1 for s in order if num_new_tokens[s] == 1),
            block_size=bs,
            decode_kernel=self.decode_kernel,
        )
        return StepBatch(as_tensor(ids), as_tensor(positions), metadata, owners)
