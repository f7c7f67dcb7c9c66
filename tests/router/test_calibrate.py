"""`choose_threshold` and `tandem calibrate`: the threshold meets its target when measured with the
cascade's own rule (router.decision.should_escalate), and the config file keeps its other keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tomllib
import typer
from typer.testing import CliRunner

from router.costs import CostTable
from router.decision import should_escalate
from router.eval_tables import RoutingExample
from router.evaluation.calibrate import CalibrationError, Target, choose_threshold, cost_model
from sdk.cli.eval import register_eval_commands
from sdk.settings import load_settings
from sdk.settings.config_file import write_threshold
from tests.router.test_eval_metrics import ROUTER, STRONG, WEAK

# The ten-prompt table of test_eval_metrics, with the confidence 1 - s of its router:
# escalating the k least confident gives quality 0.5, 0.6, 0.7, 0.6 (x6), 0.7, 0.7.
CONFIDENCE = [round(1.0 - s, 12) for s in ROUTER]


def make_examples(weak=WEAK, strong=STRONG, confidence=CONFIDENCE, **extra) -> list[RoutingExample]:
    return [
        RoutingExample(f"p{i}", bool(w), bool(s), "t", {"confidence": c, **extra})
        for i, (w, s, c) in enumerate(zip(weak, strong, confidence))
    ]


def measured_share(confidence, threshold: float) -> float:
    return float(np.mean([should_escalate(c, threshold) for c in confidence]))


def calibration_table(seed: int = 0, size: int = 500):
    rng = np.random.default_rng(seed)
    confidence = np.round(rng.random(size), 2)  # two decimals: tie groups of ~1% of the prompts
    weak = rng.random(size) < confidence  # confident answers are more often right
    return make_examples(weak, rng.random(size) < 0.8, confidence), confidence


@pytest.mark.parametrize("share", [0.0, 0.1, 0.3, 0.5, 0.77, 1.0])
def test_a_cloud_share_target_is_met_within_two_points(share):
    examples, confidence = calibration_table()
    point = choose_threshold(confidence, examples, Target("cloud_share", share))
    assert abs(measured_share(confidence, point.threshold) - share) <= 0.02
    assert point.cloud_share == measured_share(confidence, point.threshold)


def test_quality_targets_take_the_least_cloud_that_reaches_them():
    point = choose_threshold(CONFIDENCE, make_examples(), Target("quality", 1.0))
    assert (point.threshold, point.cloud_share, point.quality) == pytest.approx((0.25, 0.2, 0.7))
    assert point.quality_of_strong == pytest.approx(1.0)
    point = choose_threshold(CONFIDENCE, make_examples(), Target("quality", 0.85))  # 0.595: one escalation
    assert (point.threshold, point.cloud_share) == pytest.approx((0.15, 0.1))
    with pytest.raises(CalibrationError, match="best is 0.7000"):
        choose_threshold(CONFIDENCE, make_examples(), Target("quality", 1.1))


@pytest.mark.parametrize(("budget", "threshold", "share"), [(0.5, 0.25, 0.2), (0.1, 0.0, 0.0), (10.0, 0.25, 0.2)])
def test_a_budget_buys_the_best_quality_it_can_afford(budget, threshold, share):
    # 1000 prompt + 500 completion tokens at 1 and 2 USD per million: 0.002 USD a cloud call,
    # so 2 USD per 1k requests times the cloud share; local is free.
    prices = CostTable.from_config({"cloud": {"input_per_million": 1.0, "output_per_million": 2.0}})
    costs = cost_model(make_examples(), prices, prompt_tokens=1000, completion_tokens=500)
    point = choose_threshold(CONFIDENCE, make_examples(), Target("budget", budget), costs)
    assert (point.threshold, point.cloud_share, point.cost_per_1k) == pytest.approx((threshold, share, 2 * share))


def test_token_counts_come_from_a_live_table_else_defaults():
    examples = make_examples(cloud_prompt_tokens=100, cloud_completion_tokens=50)
    costs = cost_model(examples, CostTable())
    assert costs.tokens["cloud"] == (100.0, 50.0) and costs.assumed == (
        "local_prompt_tokens",
        "local_completion_tokens",
    )


def test_scores_outside_zero_one_cannot_be_thresholds():
    with pytest.raises(CalibrationError, match=r"\[0, 1\]"):
        choose_threshold([5.0] * 10, make_examples(), Target("cloud_share", 0.5))
    # A missing confidence (-inf) escalates at any threshold above 0, as at run time.
    point = choose_threshold([-np.inf] + CONFIDENCE[1:], make_examples(), Target("cloud_share", 0.1))
    assert point.cloud_share == pytest.approx(0.1) and point.threshold > 0


def test_write_threshold_keeps_the_other_keys(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('# a comment\n[server]\nport = 9000\n\n[cascade]\nthreshold = 0.9\nhandoff = "restart"\n')
    write_threshold(path, 0.4)
    data = tomllib.loads(path.read_text())
    assert data == {"server": {"port": 9000}, "cascade": {"threshold": 0.4, "handoff": "restart"}}
    assert load_settings(path, env={}).get("cascade.threshold") == 0.4
    new = tmp_path / "new" / "config.toml"
    write_threshold(new, 0.3)
    assert tomllib.loads(new.read_text()) == {"cascade": {"threshold": 0.3}}


def cli() -> typer.Typer:
    app = typer.Typer()
    register_eval_commands(app)
    return app


def test_tandem_calibrate_writes_the_config_and_dry_run_does_not(tmp_path):
    examples, confidence = calibration_table(seed=1)
    table = tmp_path / "table.jsonl"
    table.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": e.prompt,
                    "weak_correct": e.weak_correct,
                    "strong_correct": e.strong_correct,
                    "confidence": e.extra["confidence"],
                }
            )
            + "\n"
            for e in examples
        )
    )
    config = tmp_path / "config.toml"
    config.write_text(
        "[server]\nport = 9000\n[cascade.prices.cloud]\ninput_per_million = 1.0\noutput_per_million = 2.0\n"
    )
    before = config.read_text()
    args = [
        "calibrate",
        "--data",
        str(table),
        "--router",
        "column:confidence",
        "--cloud-share",
        "0.3",
        "--config",
        str(config),
        "--data-dir",
        str(tmp_path),
    ]
    result = CliRunner().invoke(cli(), [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run: nothing written" in result.output and config.read_text() == before
    result = CliRunner().invoke(cli(), args)
    assert result.exit_code == 0, result.output
    data = tomllib.loads(config.read_text())
    assert data["server"] == {"port": 9000} and data["cascade"]["prices"]["cloud"]["input_per_million"] == 1.0
    assert abs(measured_share(confidence, data["cascade"]["threshold"]) - 0.3) <= 0.02
    assert "cloud share" in result.output and "USD per 1k requests" in result.output and "assumed" in result.output
    assert "comments in that file are not kept" in result.output


def test_calibrating_the_prompt_routers_scores_writes_its_own_threshold(tmp_path):
    """A scores file (`tandem router score`: higher means cloud) sets cascade.prompt_router_threshold,
    which the prompt router reads; the confidence policy's cascade.threshold stays as it was."""
    examples, confidence = calibration_table(seed=2)
    table, scores = tmp_path / "table.jsonl", tmp_path / "scores.csv"
    rows = [{"prompt": e.prompt, "weak_correct": e.weak_correct, "strong_correct": e.strong_correct} for e in examples]
    table.write_text("".join(json.dumps(row) + "\n" for row in rows))
    scores.write_text("prompt,score\n" + "".join(f"{e.prompt},{1 - c}\n" for e, c in zip(examples, confidence)))
    config = tmp_path / "config.toml"
    config.write_text("[cascade]\nthreshold = 0.5\n")
    args = ["calibrate", "--data", str(table), "--router", f"scores:{scores}", "--cloud-share", "0.3"]
    args += ["--config", str(config), "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(cli(), args)
    assert result.exit_code == 0, result.output
    cascade = tomllib.loads(config.read_text())["cascade"]
    assert cascade["threshold"] == 0.5 and "wrote [cascade] prompt_router_threshold" in result.output
    assert abs(measured_share(confidence, cascade["prompt_router_threshold"]) - 0.3) <= 0.02
    assert load_settings(config, env={}).get("cascade.prompt_router_threshold") == cascade["prompt_router_threshold"]
    forced = CliRunner().invoke(cli(), [*args, "--setting", "threshold", "--dry-run"])
    assert forced.exit_code == 0 and "it would set [cascade] threshold" in forced.output
    with pytest.raises(ValueError, match="prompt_router_threshold"):
        write_threshold(config, 0.2, "handoff")
