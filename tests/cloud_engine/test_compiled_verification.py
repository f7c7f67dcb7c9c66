"""Verification steps through the compiled graph ([cloud] compile, cloud_engine.compiled_decode): a step
whose requests each add their last token and a draft runs as rows of one token each, the draft's rows
attending causally through their context lengths alone.

Float32 compiled verification must accept and emit exactly the tokens eager verification does, whatever
the drafts say; pad rows must write only the pad block; decode and verification buckets must share the
one graph compiled at warm-up (no recompile).
"""

from __future__ import annotations

import pytest
import torch

from sdk.protocol.drafts import OutsideDraft
from sdk.protocol.engine import GenerationRequest
from tests.cloud_engine.test_compiled_decode import caches
from tests.cloud_engine.test_spec_decode_greedy import build_varied_model, greedy, make_llm
from tests.cloud_engine.tiny_models import VOCAB_SIZE, random_tokens

N = 16  # tokens per answer
K = 3  # draft length
BACKENDS = ["auto", "torch"]  # the CPU kernel's op (tandem_cpu::write_and_attend), the portable op
SETTINGS = {"max_num_seqs": 4, "max_num_batched_tokens": 32, "max_model_len": 64}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # Varied greedy output (a default tiny model repeats its last token: every draft would be right).
    return build_varied_model(tmp_path_factory.mktemp("compiled-verify"), seed=0)


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request, model_dir):
    """(compiled, eager) float32 engines on the same weights and attention backend."""
    return tuple(
        make_llm(model_dir, compile=mode, attention_backend=request.param, **SETTINGS) for mode in ("on", "off")
    )


class StepLog:
    """Wraps a runner's execute to record, per step, whether it verified a draft and whether it ran compiled."""

    def __init__(self, runner):
        self.steps: list[tuple[bool, bool]] = []  # (verifies a draft, compiled)
        execute = runner.execute

        def recorded(batch):
            self.steps.append((sum(batch.num_logits) > len(batch.sampled_request_ids), batch.compiled_bucket > 0))
            return execute(batch)

        runner.execute = recorded
        self.restore = lambda: setattr(runner, "execute", execute)


def answer_together(llm, prompts: list[list[int]], drafter) -> dict[str, list[int]]:
    """Every prompt's greedy answer, decoding together; before each step `drafter(index, emitted)` may give a
    draft (the tokens after the emitted ones) to offer for that answer."""
    engine = llm.engine
    ids = [f"v{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(GenerationRequest(rid, prompt, greedy(N)))
    emitted: dict[str, list[int]] = {rid: [] for rid in ids}
    try:
        while engine.has_unfinished_requests():
            for index, rid in enumerate(ids):
                out = emitted[rid]
                draft = drafter(index, out) if out and len(out) < N - 1 else None
                if draft:
                    engine.offer_draft(OutsideDraft(rid, len(out), tuple(draft)))
            for event in engine.step():
                emitted[event.request_id].append(event.token_id)
    finally:
        engine.abort_all()
    return emitted


def test_compiled_verification_accepts_and_emits_what_eager_does(pair):
    compiled, eager = pair
    prompts = [random_tokens(5 + 4 * i, seed=40 + i) for i in range(4)]
    alone = {f"v{i}": eager.generate([p], greedy(N))[0].token_ids for i, p in enumerate(prompts)}

    def drafter(index: int, out: list[int]) -> list[int]:
        """Answer 0 drafted right, 1 wrong from its first token, 2 right for one token then wrong, 3 never."""
        right = alone[f"v{index}"][len(out) : len(out) + K]
        if index == 1:
            return [(t + 1) % VOCAB_SIZE for t in right]
        if index == 2:
            return [*right[:1], *((t + 1) % VOCAB_SIZE for t in right[1:])]
        return right if index == 0 else []

    logs = [StepLog(llm.engine.runner) for llm in pair]
    try:
        answers = [answer_together(llm, prompts, drafter) for llm in pair]
    finally:
        for log in logs:
            log.restore()
    assert answers[0] == answers[1] == alone
    verifying = [was_compiled for verifies, was_compiled in logs[0].steps if verifies]
    assert len(verifying) >= 3 and all(verifying[1:]), logs[0].steps  # the first may hold a prompt's last chunk
    assert not any(was_compiled for _, was_compiled in logs[1].steps)


def test_pad_rows_of_a_verification_step_write_only_the_pad_block(pair):
    """Three requests, each its last token and a 2-token draft: 9 rows staged in a bucket of 16."""
    compiled, eager = pair
    prompts = [random_tokens(n, seed=n) for n in (5, 9, 13)]
    batches, logits = [], []
    for llm in (compiled, eager):
        engine = llm.engine
        ids = [f"p{i}" for i in range(len(prompts))]
        for rid, prompt in zip(ids, prompts):
            engine.add_request(GenerationRequest(rid, prompt, greedy(N)))
        while any(engine.scheduler.requests[rid].num_output_tokens == 0 for rid in ids):
            engine.step()
        requests = engine.scheduler.requests
        for rid in ids:
            assert engine.kv_manager.allocate_slots(requests[rid], 3) is not None
        drafts = {rid: [(7 * i + 3) % VOCAB_SIZE, (11 * i + 5) % VOCAB_SIZE] for i, rid in enumerate(ids)}
        batches.append(engine.runner.prepare(dict.fromkeys(ids, 3), requests, engine.kv_manager.get_block_ids, drafts))
        before = caches(llm)
        logits.append(engine.runner.execute(batches[-1]))
        if llm is compiled:
            block = engine.kv_manager.block_size
            live = set(batches[0].attn_metadata.slot_mapping[:9].tolist())
            pad = set(range(engine.num_blocks * block, (engine.num_blocks + 1) * block))
            for old, new in zip(before, caches(llm)):
                changed = set((old != new).reshape(old.shape[0] * block, -1).any(dim=1).nonzero().flatten().tolist())
                assert changed - live <= pad, "a pad row wrote outside the pad block"
                assert live <= changed
        engine.abort_all()
    assert batches[0].compiled_bucket == 16 and not batches[1].compiled_bucket
    assert batches[0].num_logits == batches[1].num_logits == [3, 3, 3]
    assert logits[0].shape == logits[1].shape == (9, compiled.engine.vocab_size)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_decode_and_verification_share_the_graph_compiled_at_warm_up(model_dir):
    from torch._dynamo.utils import counters

    llm = make_llm(model_dir, compile="on", **SETTINGS)
    compiled_frames = counters["frames"]["ok"]
    prompts = [random_tokens(6 + i, seed=60 + i) for i in range(4)]
    for k in (1, 2, 4, 7):  # verification rows from 2 to 32: buckets 2 to 32
        answer_together(llm, prompts[: 1 + k % 4], lambda index, out: [1 + (index + j) % 7 for j in range(k)])
    assert counters["frames"]["ok"] == compiled_frames, "a verification bucket recompiled after warm-up"
