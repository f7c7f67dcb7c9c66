"""`tandem eval` on a small table: the terminal table, the JSON report and the PNG plot."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from sdk.cli.eval import register_eval_commands

# test_eval_metrics' ten-prompt table; its router's APGR is 0.6 and the oracle's 1.25.
WEAK = [0, 0, 0, 1, 1, 1, 1, 1, 0, 0]
STRONG = [1, 1, 1, 0, 1, 1, 1, 1, 0, 0]
NEED = [0.9, 0.1, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.0]


def cli() -> typer.Typer:
    app = typer.Typer()
    register_eval_commands(app)
    return app


def write_table(tmp_path):
    table = tmp_path / "table.csv"
    table.write_text(
        "prompt,weak_correct,strong_correct,confidence\n"
        + "".join(f"p{i},{w},{s},{1 - n:.1f}\n" for i, (w, s, n) in enumerate(zip(WEAK, STRONG, NEED)))
    )
    return table


def test_eval_writes_json_and_png_and_prints_the_table(tmp_path):
    table, report, plot = write_table(tmp_path), tmp_path / "report.json", tmp_path / "curve.png"
    # A contamination list in the data dir: p9 is dropped from every table.
    (tmp_path / "gsm8k_contaminated_prompts.jsonl").write_text(json.dumps({"eval_prompt": "p9"}) + "\n")
    result = CliRunner().invoke(
        cli(),
        [
            "eval",
            "--data",
            str(table),
            "--router",
            "column:confidence",
            "--seeds",
            "20",
            "--json",
            str(report),
            "--plot",
            str(plot),
            "--data-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "APGR" in result.output and "CPT(50%)" in result.output and "column:confidence" in result.output
    data = json.loads(report.read_text())
    assert (data["num_prompts"], data["num_dropped_contaminated"], data["num_random_seeds"]) == (9, 1, 20)
    assert list(data["routers"]) == ["column:confidence", "random", "oracle"]
    assert len(data["routers"]["oracle"]["quality"]) == 11
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_scores_file_and_direction(tmp_path):
    table, scores, report = write_table(tmp_path), tmp_path / "scores.csv", tmp_path / "report.json"
    scores.write_text("prompt,score\n" + "".join(f"p{i},{n}\n" for i, n in enumerate(NEED)))
    args = ["eval", "--data", str(table), "--json", str(report), "--data-dir", str(tmp_path)]
    assert CliRunner().invoke(cli(), [*args, "--router", f"scores:{scores}"]).exit_code == 0
    as_cloud = json.loads(report.read_text())["routers"][f"scores:{scores}"]["apgr"]
    assert CliRunner().invoke(cli(), [*args, "--router", "column:confidence", "--higher-means", "local"]).exit_code == 0
    assert (
        json.loads(report.read_text())["routers"]["column:confidence"]["apgr"] == as_cloud
    )  # the same signal both ways
    assert abs(as_cloud - 0.6) < 1e-9


def test_eval_errors_say_what_to_fix(tmp_path):
    table = write_table(tmp_path)
    result = CliRunner().invoke(
        cli(), ["eval", "--data", str(table), "--router", "column:nope", "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 2 and "no column 'nope'" in result.output
    result = CliRunner().invoke(cli(), ["eval", "--router", "random"])
    assert result.exit_code == 2 and "--data or --live" in result.output
