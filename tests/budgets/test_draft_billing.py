"""A key's drafts cost it (issue 66): over GenerateWithDrafts, the draft tokens the engine verified for a key's
request are counted per key (EngineStats.caller_*_by_key, /metrics' tandem:spec_decode_caller_* counters) and
billed to it at the input price, and a drafted request reserves the most it may verify, so a budget that fits
the plain request can refuse the drafted one. On e22a9a3 only the emitted tokens were metered and billed."""

from __future__ import annotations

import pytest

from router.costs import TierPrices
from sdk.budgets.ledger import SpendLedger, key_scope
from sdk.budgets.manager import BudgetManager
from sdk.budgets.metered_engine import BudgetedEngine
from sdk.cloud.grpc_client import CloudClient, CloudQuotaExceededError
from sdk.openai_server.metrics import KEY_LABEL_DIGITS, ServerMetrics
from sdk.protocol.drafts import MAX_DRAFT_TOKENS, most_verified_draft_tokens
from sdk.protocol.engine import SamplingParams
from sdk.serving.api_keys import key_fingerprint
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, serve, wait_drained  # noqa: F401  (fixtures)
from tests.cloud_engine.tiny_models import random_tokens

KEY, OTHER = "sk-drafting-key-0123456789", "sk-drafting-other-0123456789"
PRICES = TierPrices(input_per_million=1000.0, output_per_million=2000.0)
N = 24  # tokens per answer
PROMPT = random_tokens(10, seed=21)
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.fixture
def ledger(tmp_path):
    opened = SpendLedger(tmp_path / "spend.sqlite3").start()
    yield opened
    opened.close()


def billed_engine(engine, tmp_path, ledger, budgets_text: str) -> BudgetedEngine:  # noqa: F811
    (tmp_path / "budgets.toml").write_text(budgets_text)
    budgets = BudgetManager(str(tmp_path / "budgets.toml"), ledger, prices_are_zero=False, cloud_only=True)
    return BudgetedEngine(engine, budgets, PRICES)


async def spent(ledger, key: str) -> float:
    await ledger.settled()
    return (await ledger.current(key_scope(key_fingerprint(key)), "day")).usd


async def test_verified_drafts_are_metered_and_billed_to_their_key(engine, serve, tmp_path, ledger):  # noqa: F811
    billed = billed_engine(engine, tmp_path, ledger, "[default]\nusd_per_day = 100.0\n")
    target = await serve(billed, api_keys=frozenset({KEY, OTHER}))
    mine, other = key_fingerprint(KEY), key_fingerprint(OTHER)
    before = billed.stats()
    async with CloudClient(target, api_key=KEY) as client:
        reference = [event.token_id async for event in client.generate(PROMPT, GREEDY, model="tiny")]
        plain = await spent(ledger, KEY)
        assert plain == pytest.approx(PRICES.cost(len(PROMPT), N))  # no drafts: no draft tokens billed
        call = client.generate_with_drafts(PROMPT, GREEDY, model="tiny")
        tokens, last = [], None
        async for event in call:
            tokens.append(event.token_id)
            last = event
            if len(tokens) < N - 1:  # right drafts: how many land before the cloud goes past them is timing's
                call.offer(len(tokens), reference[len(tokens) : len(tokens) + 4])
    assert tokens == reference
    verified, accepted = last.num_draft_tokens, last.num_accepted_tokens
    assert verified > 0 and accepted <= verified
    assert await wait_drained(engine)
    # Billed: the prompt, the answer, and every verified draft token at the input price.
    assert await spent(ledger, KEY) - plain == pytest.approx(PRICES.cost(len(PROMPT) + verified, N))
    assert await spent(ledger, OTHER) == 0
    # Metered per key, beside the engine-wide counters.
    stats = billed.stats()
    assert stats.caller_draft_tokens_by_key[mine] - before.caller_draft_tokens_by_key.get(mine, 0) == verified
    assert stats.caller_accepted_tokens_by_key[mine] - before.caller_accepted_tokens_by_key.get(mine, 0) == accepted
    assert other not in stats.caller_draft_tokens_by_key
    exposition = ServerMetrics(billed).render()[0].decode()
    label = f'key="{mine[:KEY_LABEL_DIGITS]}"'
    assert (
        f"tandem:spec_decode_caller_draft_tokens_total{{{label}}} {float(stats.caller_draft_tokens_by_key[mine])}"
        in (exposition)
    )
    assert f"tandem:spec_decode_caller_accepted_tokens_total{{{label}}}" in exposition


async def test_a_drafted_request_reserves_the_most_it_may_verify(engine, serve, tmp_path, ledger):  # noqa: F811
    """A budget of 1.5 plain requests: the plain request fits, the drafted one (whose largest cost counts the
    most draft tokens it may have verified) does not, and is refused before the engine sees it."""
    plain_cost = PRICES.cost(len(PROMPT), N)
    drafted_cost = PRICES.cost(len(PROMPT) + most_verified_draft_tokens(N, MAX_DRAFT_TOKENS), N)
    assert drafted_cost > 1.5 * plain_cost
    billed = billed_engine(engine, tmp_path, ledger, f"[default]\nusd_per_day = {1.5 * plain_cost!r}\n")
    target = await serve(billed, api_keys=frozenset({KEY}))
    async with CloudClient(target, api_key=KEY) as client:
        with pytest.raises(CloudQuotaExceededError, match="usd_per_day"):
            [event async for event in client.generate_with_drafts(PROMPT, GREEDY, model="tiny")]
        assert len([event async for event in client.generate(PROMPT, GREEDY, model="tiny")]) == N
    assert await spent(ledger, KEY) == pytest.approx(plain_cost)
    assert await wait_drained(engine)
