"""`tandem serve`'s cascade with budgets in the shared books while the state database cannot be asked (its
connection silent: a frozen proxy): model `auto` keeps its local answer, degraded, instead of failing when it
escalates (before, the budget's reservation raised StateUnavailableError after local tokens had gone out);
model `cloud` is refused with 503 before anything is answered. The real cascade: SmolLM2 on the device, the
tiny cloud engine over gRPC."""

from __future__ import annotations

import pytest

from sdk.budgets.manager import BudgetManager
from sdk.budgets.postgres_ledger import PostgresSpendLedger
from sdk.cascade.types import collect
from sdk.protocol.engine import StateUnavailableError
from sdk.state.database import StateDatabase
from tests.cloud_engine.grpc_helpers import long_tiny_dir, serve  # noqa: F401  (fixtures)
from tests.sdk.test_cascade import GREEDY, QUESTION, cloud_engine, local_engine, make_runner, recording  # noqa: F401
from tests.state.db_proxy import DatabaseProxy

pytestmark = pytest.mark.slow

PRICES = {"cloud": {"input_per_million": 1000.0, "output_per_million": 2000.0}}
KEY_ID = "a" * 64


@pytest.mark.parametrize("streamed", [True, False])
async def test_auto_keeps_its_local_answer_when_the_books_cannot_be_asked(
    make_runner,  # noqa: F811
    recording,  # noqa: F811
    postgres_server,
    state_db_url,
    tmp_path,
    streamed,
):
    # continue: the local tokens stream out as they come, and the escalation at the first judgement (k = 2,
    # a threshold no answer reaches) comes after some were sent.
    (tmp_path / "budgets.toml").write_text("[default]\nusd_per_day = 100.0\n")
    with DatabaseProxy(postgres_server.port) as proxy:
        db = await StateDatabase(proxy.url_for(state_db_url), lease_s=30.0, timeout_s=0.5).open()
        try:
            budgets = BudgetManager(str(tmp_path / "budgets.toml"), PostgresSpendLedger(db), False)
            runner = await make_runner(prices=PRICES, handoff="continue", min_tokens_k=2, budgets=budgets)
            proxy.freeze()
            answer = await collect(
                runner.generate(QUESTION, GREEDY, model="auto:0.999", key_fingerprint=KEY_ID, streamed=streamed)
            )
            assert answer.text and set(answer.tiers) == {"local"} and answer.finish_reason == "length"
            assert (answer.routing.tier, answer.routing.degraded_reason) == ("local", "state_database_unavailable")
            assert answer.routing.escalated and not recording.received  # it wanted the cloud; nothing was spent
            with pytest.raises(StateUnavailableError):  # model cloud: refused before anything is answered
                await collect(runner.generate(QUESTION, GREEDY, model="cloud", key_fingerprint=KEY_ID))
            proxy.thaw()
        finally:
            await db.close()
