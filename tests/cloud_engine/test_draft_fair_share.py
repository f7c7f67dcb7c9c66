"""A draft takes what the running requests' own tokens leave over (issue 66): at most its request's fair share
of the step, max(max_draft_tokens + 1, budget / running requests) tokens, and only free KV blocks, so a long
draft (a hostile caller's) neither starves another request's token nor preempts it. On e22a9a3 a 40-token draft
took 31 of a 32-token step and had the other key's running request preempted for its blocks."""

from __future__ import annotations

from cloud_engine.request import Request
from cloud_engine.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from sdk.protocol.drafts import MAX_DRAFT_TOKENS
from tests.cloud_engine.conftest import BS, FAKE_TOKEN_BASE, make_requests, make_scheduler, runner_output_for

BUDGET = 32
LONG_DRAFT = list(range(1000, 1040))  # 40 tokens: longer than any share of a 32-token step


def decoding(scheduler: Scheduler, *requests: Request) -> None:
    """Admit and prefill `requests` (each then has its first token and one token to compute)."""
    for request in requests:
        scheduler.add_request(request)
    for _ in range(8):
        if all(r.num_output_tokens for r in requests):
            break
        out = scheduler.schedule()
        scheduler.update_from_output(out, runner_output_for(scheduler, out))
    assert all(r.num_output_tokens and r.num_computed_tokens == r.num_tokens - 1 for r in requests)


def test_a_long_draft_takes_its_fair_share_and_leaves_the_others_their_tokens():
    s = make_scheduler(max_num_batched_tokens=BUDGET, max_num_seqs=4, num_blocks=128)
    attacker, *others = make_requests(4, 6, 40)
    decoding(s, attacker, *others)
    attacker.spec_token_ids = list(LONG_DRAFT)
    out = s.schedule()
    share = max(MAX_DRAFT_TOKENS + 1, BUDGET // 4)
    assert out.num_scheduled_tokens[attacker.request_id] == share
    assert out.scheduled_spec_token_ids[attacker.request_id] == LONG_DRAFT[: share - 1]
    assert all(out.num_scheduled_tokens[r.request_id] == 1 for r in others)  # every other request decodes
    assert out.total_num_scheduled_tokens <= BUDGET


def test_the_fair_share_grows_with_fewer_running_requests():
    s = make_scheduler(max_num_batched_tokens=BUDGET, max_model_len=64, num_blocks=128, max_draft_tokens=4)
    (alone,) = make_requests(1, 6, 50)
    decoding(s, alone)
    alone.spec_token_ids = list(LONG_DRAFT)
    out = s.schedule()
    assert len(out.scheduled_spec_token_ids[alone.request_id]) == BUDGET - 1  # the whole step is its share
    s2 = make_scheduler(max_num_batched_tokens=BUDGET, max_model_len=64, num_blocks=128, max_draft_tokens=4)
    requests = make_requests(4, 6, 50)
    decoding(s2, *requests)
    requests[0].spec_token_ids = list(LONG_DRAFT)
    out = s2.schedule()
    assert len(out.scheduled_spec_token_ids[requests[0].request_id]) == BUDGET // 4 - 1  # 8 rows: 7 draft tokens


def test_a_draft_never_preempts_another_request():
    """16 blocks of 4 slots, 13 of them held by two requests of 24 prompt tokens: the attacker's draft needs more
    than is free. The attacker arrived first, so the other request is the one a preemption would pick."""
    s = make_scheduler(max_num_batched_tokens=BUDGET, max_model_len=64, num_blocks=16)
    attacker, victim = make_requests(2, 24, 30)
    decoding(s, attacker, victim)
    kv = s.kv_cache_manager
    victim_needs = kv.num_blocks_for(victim.num_tokens) - len(kv.get_block_ids(victim.request_id))
    # What the attacker can have without anyone's blocks once the victim has its own token's.
    slots_left = (len(kv.get_block_ids(attacker.request_id)) + kv.num_free_blocks - victim_needs) * BS
    slots_left -= attacker.num_computed_tokens + 1
    assert 0 < slots_left < MAX_DRAFT_TOKENS  # the pool is the bound here, not the fair share
    attacker.spec_token_ids = list(LONG_DRAFT)
    out = s.schedule()
    assert out.preempted_ids == [] and victim in s.running and victim.num_preemptions == 0
    assert out.num_scheduled_tokens[victim.request_id] == 1  # its own token, with its block, comes first
    spec = out.scheduled_spec_token_ids.get(attacker.request_id, [])
    # The draft got what was free after every running request's own token: no more, and no one's blocks.
    assert spec == LONG_DRAFT[:slots_left] and kv.num_free_blocks == 0
    s.update_from_output(out, runner_output_for_draft(s, out))
    s.kv_cache_manager.check_invariants()


def runner_output_for_draft(scheduler: Scheduler, out: SchedulerOutput) -> ModelRunnerOutput:
    """The runner's answer with every draft rejected: each request that caught up samples its own token only."""
    sampled = {}
    for rid, n in out.num_scheduled_tokens.items():
        request = scheduler.requests[rid]
        if request.num_computed_tokens + n == request.num_tokens + len(out.scheduled_spec_token_ids.get(rid, [])):
            sampled[rid] = [FAKE_TOKEN_BASE + request.num_output_tokens]
    return ModelRunnerOutput(sampled)
