"""LlamaBackend.decode's logits rows: one copy of every requested row, in batch order, into the
caller's reused buffer or a fresh array, equal to llama.cpp's per-row answer."""

from __future__ import annotations

import numpy as np
import pytest

from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from sdk.engine_common.model_files import resolve_model_path


@pytest.fixture(scope="module")
def backend():
    b = LlamaBackend(LlamaBackendConfig(resolve_model_path(None), n_ctx=512, n_seq_max=4, n_batch=64, n_threads=2))
    yield b
    b.close()


def mixed_batch():
    """Three sequences interleaved so that the requested rows are not in slot order."""
    rng = np.random.default_rng(3)
    slots = np.array([2, 0, 2, 1, 0, 2, 1], dtype=np.int32)
    positions = np.array([0, 0, 1, 0, 1, 2, 1], dtype=np.int32)
    want = np.array([0, 0, 0, 0, 1, 1, 1], dtype=np.int8)  # the last token of slots 0, 2, 1
    return rng.integers(100, 20000, len(slots)).astype(np.int32), positions, slots, want


def test_logits_rows_follow_the_batch_order_and_match_llama_per_row(backend):
    for slot in range(4):
        backend.clear_slot(slot)
    tokens, positions, slots, want = mixed_batch()
    got = backend.decode(tokens, positions, slots, want).copy()
    per_row = np.stack(
        [
            np.ctypeslib.as_array(backend._lib.llama_get_logits_ith(backend.ctx, int(i)), shape=(backend.n_vocab,))
            for i in np.flatnonzero(want)
        ]
    )
    np.testing.assert_array_equal(got, per_row)
    assert len({row.argmax() for row in got}) > 1 or not np.array_equal(
        got[0], got[1]
    )  # distinct rows, not one repeated


def test_a_reused_buffer_gets_the_same_rows_and_a_fresh_array_is_its_own(backend):
    tokens, positions, slots, want = mixed_batch()
    for slot in range(4):
        backend.clear_slot(slot)
    fresh = backend.decode(tokens, positions, slots, want)
    buffer = np.full((4, backend.n_vocab), np.nan, dtype=np.float32)
    for slot in range(4):
        backend.clear_slot(slot)
    into = backend.decode(tokens, positions, slots, want, out=buffer)
    assert np.shares_memory(into, buffer) and into.shape == (3, backend.n_vocab)
    np.testing.assert_array_equal(into, fresh)
    assert np.isnan(buffer[3]).all()  # only the head rows are written
    too_small = np.empty((2, backend.n_vocab), dtype=np.float32)
    for slot in range(4):
        backend.clear_slot(slot)
    assert not np.shares_memory(backend.decode(tokens, positions, slots, want, out=too_small), too_small)
