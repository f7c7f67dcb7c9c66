"""The budgets file, the spend ledger and the decisions (sdk.budgets), without a server: each decision
against both ledgers, this process's (SQLite + memory) and the state database replicas share."""

from __future__ import annotations

import os
import time

import pytest

from sdk.budgets.config import BudgetConfigError, load_budgets, parse_budgets
from sdk.budgets.ledger import SpendLedger, key_scope, periods, user_scope
from sdk.budgets.manager import BudgetManager
from sdk.serving.api_keys import key_fingerprint

ABC = key_fingerprint("sk-budget-abc")  # a key's id: [keys.<id>] below names it by its first 16 digits

BUDGETS = f"""
[default]
usd_per_day = 1.0
soft_usd_per_day = 0.5
cloud_share_per_month = 0.5

[per_user]
usd_per_day = 0.2

[keys.{ABC[:16]}]
usd_per_month = 10.0
"""


class Clock:
    def __init__(self, now: float = 1_790_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def manager(tmp_path, text: str = BUDGETS, prices_are_zero: bool = False, clock=None, ledger=None):
    path = tmp_path / "budgets.toml"
    path.write_text(text)
    clock = clock or Clock()
    ledger = ledger or SpendLedger(tmp_path / "spend.sqlite3", clock=clock).start()
    return BudgetManager(str(path), ledger, prices_are_zero, clock=clock), ledger, path


def test_the_file_is_checked_name_by_name(tmp_path):
    config = parse_budgets({"default": {"usd_per_day": 1, "soft_cloud_share_per_day": 0.2}})
    assert [limit.name for limit in config.default.limits] == [
        "usd_per_day",
        "soft_cloud_share_per_day",
    ] and config.uses_usd
    for document, message in (
        ({"default": {"usd_per_week": 1}}, "unknown limit"),
        ({"default": {"usd_per_day": -1}}, ">= 0"),
        ({"default": {"cloud_share_per_day": 1.5}}, r"\[0, 1\]"),
        ({"defaults": {}}, "unknown section"),
        ({"default": {"usd_per_day": True}}, ">= 0"),
        ({"keys": []}, "one table per key"),
    ):
        with pytest.raises(BudgetConfigError, match=message):
            parse_budgets(document)
    (tmp_path / "bad.toml").write_text("[default\n")
    with pytest.raises(BudgetConfigError, match="not valid TOML"):
        load_budgets(tmp_path / "bad.toml")


def test_usd_budgets_refuse_to_start_with_zero_prices(tmp_path):
    with pytest.raises(BudgetConfigError, match="prices are 0"):
        manager(tmp_path, prices_are_zero=True)
    share_only, ledger, _ = manager(tmp_path, "[default]\ncloud_share_per_day = 0.3\n", prices_are_zero=True)
    assert share_only.config.active
    ledger.close()


async def test_soft_then_hard_per_key_and_per_user(tmp_path, open_ledger):
    clock = Clock()  # default: 1 USD a day hard, 0.5 soft, cloud share 0.5 a month; users 0.2 a day
    budgets, ledger, _ = manager(tmp_path, clock=clock, ledger=open_ledger(clock))
    assert not (await budgets.verdict("k1", None)).exhausted
    budgets.record("k1", "alice", usd=0.15, cloud_tokens=10, total_tokens=100)
    await ledger.settled()
    assert (await budgets.verdict("k1", "alice")) == (await budgets.verdict("k1", None)) and not (
        await budgets.verdict("k1", "alice")
    ).hard
    budgets.record("k1", "alice", usd=0.1, cloud_tokens=10, total_tokens=100)  # alice: 0.25 of her 0.2
    await ledger.settled()
    assert [(b.scope, b.limit.name) for b in (await budgets.verdict("k1", "alice")).hard] == [("user", "usd_per_day")]
    assert (
        not (await budgets.verdict("k1", "bob")).hard and not (await budgets.verdict("k1", None)).hard
    )  # the key itself: 0.25 of 1
    budgets.record("k1", None, usd=0.3, cloud_tokens=0, total_tokens=1000)  # key: 0.55 -> soft
    await ledger.settled()
    verdict = await budgets.verdict("k1", None)
    assert [b.limit.name for b in verdict.soft] == ["soft_usd_per_day"] and not verdict.hard
    budgets.record("k1", None, usd=0.5, cloud_tokens=0, total_tokens=0)  # key: 1.05 -> hard
    await ledger.settled()
    [breach] = (await budgets.verdict("k1", None)).hard
    assert breach.describe() == "key budget usd_per_day reached (1.0500 USD of 1 this day, UTC)"
    budgets.record("k1", None, usd=0.0, cloud_tokens=2000, total_tokens=2000)  # share 2020/3200 of the month
    await ledger.settled()
    assert {b.limit.name for b in (await budgets.verdict("k1", None)).hard} == {"usd_per_day", "cloud_share_per_month"}
    budgets.record(ABC, None, usd=5.0, cloud_tokens=100, total_tokens=100)
    await ledger.settled()
    assert not (await budgets.verdict(ABC, None)).hard  # its own limits replace the default: 10 USD a month


async def test_cloud_share_needs_tokens_and_periods_roll_over(tmp_path, open_ledger):
    clock = Clock()
    budgets, ledger, _ = manager(
        tmp_path, "[default]\ncloud_share_per_day = 0.5\n", clock=clock, ledger=open_ledger(clock)
    )
    assert not (await budgets.verdict("k", None)).hard  # no tokens yet: no share to be over
    budgets.record("k", None, usd=0.0, cloud_tokens=60, total_tokens=100)
    await ledger.settled()
    assert (await budgets.verdict("k", None)).hard[0].spent == pytest.approx(0.6)
    clock.now += 86400  # a new UTC day
    assert not (await budgets.verdict("k", None)).hard


def test_spend_survives_a_restart(tmp_path):
    clock = Clock()
    budgets, ledger, _ = manager(tmp_path, clock=clock)
    for _ in range(7):
        budgets.record("k1", "u", usd=0.125, cloud_tokens=10, total_tokens=20)
    ledger.flush()
    ledger.close()
    again = SpendLedger(tmp_path / "spend.sqlite3", clock=clock).start()
    for scope in (key_scope("k1"), user_scope("k1", "u")):
        for period in ("day", "month"):
            spend = again.spend(scope, period)
            assert (spend.usd, spend.cloud_tokens, spend.total_tokens, spend.requests) == (0.875, 70, 140, 7)
    assert set(periods(clock.now)) == {"day", "month"}
    again.close()


async def test_the_file_is_reloaded_when_it_changes_and_a_bad_edit_keeps_the_old(tmp_path, open_ledger):
    clock = Clock()
    budgets, ledger, path = manager(tmp_path, "[default]\nusd_per_day = 1.0\n", clock=clock, ledger=open_ledger(clock))
    budgets.record("k", None, usd=2.0, cloud_tokens=0, total_tokens=0)
    await ledger.settled()
    assert (await budgets.verdict("k", None)).hard
    path.write_text("[default]\nusd_per_day = 5.0\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    clock.now += 3.0
    assert not (await budgets.verdict("k", None)).hard and budgets.counts.reloads == 1
    path.write_text("[default]\nusd_per_day = -5.0\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    clock.now += 3.0
    assert not (await budgets.verdict("k", None)).hard and budgets.counts.failed_reloads == 1  # still 5 USD
    assert (await budgets.status("k", None))["scopes"][0]["limits"][0] | {} == {
        "limit": "usd_per_day",
        "period": "day",
        "value": 5.0,
        "spent": 2.0,
        "remaining": 3.0,
        "exhausted": False,
        "requests": 1,
    }


def test_tandem_serve_refuses_usd_budgets_without_prices_before_loading_anything(tmp_path):
    from typer.testing import CliRunner

    from sdk.cli.app import app

    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[default]\nusd_per_day = 1.0\n")
    result = CliRunner().invoke(
        app, ["serve", "--cloud", "none"], env={"TANDEM_BUDGETS_FILE": str(budgets), "TANDEM_CONFIG": ""}
    )
    assert result.exit_code != 0 and "prices are 0" in result.output
    priced = tmp_path / "tandem.toml"
    priced.write_text(
        f'[server]\nbudgets_file = "{budgets}"\n[cascade.prices]\ncloud = {{ input_per_million = 1.0 }}\n'
        '[local]\nmodel = "/nonexistent.gguf"\n'
    )
    result = CliRunner().invoke(app, ["serve", "--config", str(priced)])
    assert (
        "prices are 0" not in result.output and "nonexistent" in result.output
    )  # budgets passed; the model file is next
