"""Random workloads over random small configs: the books balance after every step and everything drains.

Prompts share long prefixes so that prefix-cache hits, twins and evictions are
common; pools are tiny so preemption is too. The Driver
(see conftest) checks the KV cells read and written by every chunk, the reference
counts, the free queue and the cache map after every step and abort.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cloud_engine.scheduler import SchedulerOutput
from sdk.protocol.request_status import RequestStatus
from tests.cloud_engine.conftest import Driver, make_request, make_scheduler


@st.composite
def configs(draw) -> dict:
    block_size = draw(st.sampled_from([1, 2, 4]))
    num_blocks = draw(st.integers(3, 24))
    pool_tokens = num_blocks * block_size
    max_model_len = draw(st.integers(max(2, pool_tokens // 2), pool_tokens))  # long requests: pool pressure
    chunking = draw(st.booleans())
    min_budget = max_model_len if not chunking else 1
    return dict(
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunking,
        max_num_batched_tokens=draw(st.integers(min_budget, max(min_budget, 24))),
        max_num_seqs=draw(st.integers(1, 4)),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 6])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        enable_prefix_caching=draw(st.booleans()),
    )


# Two shared documents: a prompt is a prefix of one of them plus a short tail of its own.
DOCUMENTS = [[7, 3, 9, 1, 4, 4, 8, 2] * 5, [5, 6, 5, 6, 0, 1, 2, 3] * 5]
prompts = st.builds(
    lambda doc, n, tail: DOCUMENTS[doc][:n] + tail,
    st.integers(0, 1),
    st.integers(0, 40),
    st.lists(st.integers(0, 2), min_size=1, max_size=6),
)

adds = st.tuples(st.just("add"), prompts, st.integers(1, 12), st.integers(0, 2))
ops = st.lists(
    st.one_of(
        adds,
        adds,
        st.tuples(st.just("step"), st.integers(1, 3)),
        st.tuples(st.just("abort"), st.integers(0, 100)),
        st.tuples(st.just("preempt"), st.integers(0, 100)),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), first_adds=st.lists(adds, min_size=1, max_size=8), later_ops=ops)
def test_random_workloads_never_leak_or_double_free_and_always_drain(config, first_adds, later_ops):
    workload = first_adds + later_ops
    d = Driver(make_scheduler(**config))
    s, max_model_len = d.s, config["max_model_len"]
    for i, op in enumerate(workload):
        if op[0] == "add":
            _, prompt, max_tokens, priority = op
            d.add(make_request(f"q{i}", prompt[:max_model_len], max_tokens, priority=priority, arrival_time=float(i)))
        elif op[0] == "step":
            for _ in range(op[1]):
                d.step()
        elif op[0] == "abort" and s.requests:
            ids = sorted(s.requests)
            d.abort(ids[op[1] % len(ids)])
        elif op[0] == "preempt" and s.running:
            # What the scheduler does when a running request cannot grow, at an arbitrary moment:
            # mid-prefill, mid-decode, right after a prefix hit.
            s._preempt(s.running[op[1] % len(s.running)], SchedulerOutput())
            d.check_state()
    d.run()
    d.assert_drained()
    for r in d.all_requests.values():
        if r.status == RequestStatus.FINISHED_LENGTH:
            assert r.num_output_tokens == r.params.max_tokens or r.num_tokens == max_model_len + 1
    if d.preempted:
        event("preempted by the scheduler")
    if s.kv_cache_manager.num_prefix_cache_hits_total:
        event("prefix cache hit")
    if s.kv_cache_manager.pool.num_evictions_total:
        event("cached block evicted")
