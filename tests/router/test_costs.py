"""Cost accounting: prices per million tokens, per-request breakdowns, ledger totals."""

from __future__ import annotations

import enum

import pytest

from router.costs import CostLedger, CostTable, TierPrices


class Tier(str, enum.Enum):
    """Like router.decision.Tier: a str enum whose hash is not its value's."""

    LOCAL = "local"
    CLOUD = "cloud"


def make_table() -> CostTable:
    return CostTable.from_config({"cloud": {"input_per_million": 0.5, "output_per_million": 1.5}})


def test_prices_per_million_tokens():
    table = make_table()
    assert table.request_cost("cloud", 1_000_000, 0) == pytest.approx(0.5)
    assert table.request_cost("cloud", 2_000, 1_000) == pytest.approx((2_000 * 0.5 + 1_000 * 1.5) / 1e6)
    assert table.request_cost(Tier.CLOUD, 10, 10) == table.request_cost("cloud", 10, 10)
    assert table.request_cost("local", 10**9, 10**9) == 0.0  # local is free unless configured


def test_local_tier_can_be_priced():
    table = CostTable.from_config({"local": {"output_per_million": 0.01}})
    assert table.request_cost("local", 0, 1_000_000) == pytest.approx(0.01)
    assert table.cloud == TierPrices()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"edge": {}}, "unknown tiers"),
        ({"cloud": {"input_per_1k": 1.0}}, "unknown price keys"),
        ({"cloud": {"input_per_million": -1}}, "finite price"),
        ({"cloud": {"input_per_million": float("inf")}}, "finite price"),
        ({"cloud": {"output_per_million": "1.0"}}, "finite price"),
    ],
)
def test_invalid_config_raises(config, message):
    with pytest.raises(ValueError, match=message):
        CostTable.from_config(config)


def test_invalid_requests_raise():
    table = make_table()
    with pytest.raises(ValueError, match="unknown tier"):
        table.request_cost("edge", 1, 1)
    with pytest.raises(ValueError, match="prompt_tokens"):
        table.request_cost("cloud", -1, 1)
    with pytest.raises(ValueError, match="completion_tokens"):
        table.request_cost("cloud", 1, 1.5)


def test_escalated_request_breakdown_covers_both_tiers():
    ledger = CostLedger(make_table())
    request = ledger.new_request()
    request.add(Tier.LOCAL, prompt_tokens=100, completion_tokens=20)
    cloud_cost = request.add("cloud", prompt_tokens=100, completion_tokens=300)
    assert cloud_cost == pytest.approx((100 * 0.5 + 300 * 1.5) / 1e6)
    assert request.as_dict() == {
        "local": {"prompt_tokens": 100, "completion_tokens": 20, "cost_usd": 0.0},
        "cloud": {"prompt_tokens": 100, "completion_tokens": 300, "cost_usd": pytest.approx(cloud_cost)},
        "total_cost_usd": pytest.approx(cloud_cost),
    }


def test_local_only_request_reports_only_local():
    request = CostLedger().new_request()
    request.add("local", 5, 7)
    assert request.as_dict() == {
        "local": {"prompt_tokens": 5, "completion_tokens": 7, "cost_usd": 0.0},
        "total_cost_usd": 0.0,
    }


def test_ledger_accumulates_per_tier():
    ledger = CostLedger(make_table())
    for prompt_tokens, escalated in [(1_000, False), (2_000, True), (3_000, True)]:
        request = ledger.new_request()
        request.add("local", prompt_tokens, 10)
        if escalated:
            request.add("cloud", prompt_tokens, 1_000)
        ledger.record(request)
    snapshot = ledger.snapshot()
    assert snapshot["num_requests"] == 3
    assert snapshot["tiers"]["local"] == {
        "num_requests": 3,
        "prompt_tokens": 6_000,
        "completion_tokens": 30,
        "cost_usd": 0.0,
    }
    cloud_cost = (5_000 * 0.5 + 2_000 * 1.5) / 1e6
    assert snapshot["tiers"]["cloud"] == {
        "num_requests": 2,
        "prompt_tokens": 5_000,
        "completion_tokens": 2_000,
        "cost_usd": pytest.approx(cloud_cost),
    }
    assert snapshot["total_cost_usd"] == pytest.approx(cloud_cost)
    totals = ledger.totals()
    totals["cloud"].prompt_tokens = 0  # a copy: the ledger is unchanged
    assert ledger.totals()["cloud"].prompt_tokens == 5_000
