"""The live table builder: its scorers (pure functions), and one run against a real `tandem serve`."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from router.eval_tables import load_table
from sdk.evaluation.live import (
    LiveError,
    agrees,
    is_correct,
    last_number,
    load_prompts,
    option_letter,
)
from sdk.cli.eval import register_eval_commands


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("The total is 1,000.50 dollars", "1000.5"),
        ("-3 degrees", "-3"),
        ("It is 7.0", "7"),
        ("3,4 and then 12", "12"),
        ("no digits here", None),
        (None, None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("The answer is (B).", "B"),
        ("Answer: c", "C"),
        ("D. Urethra", "D"),
        ("B", "B"),
        ("I think (A) fits best", "A"),
        ("A lesion of the nerve", None),
        ("none of them", None),
    ],
)
def test_option_letter(text, letter):
    assert option_letter(text) == letter


def test_correctness_and_agreement():
    assert is_correct("so 5 + 13 = 18", "18", "number") and not is_correct("about 17", "18", "number")
    assert is_correct("Answer: b", "B", "letter") and not is_correct("no idea", "B", "letter")
    assert agrees("It is 42.", "The answer: 42", "number") and not agrees("41", "42", "number")
    assert agrees("(C)", "C. Melanocytes", "letter") and not agrees(
        "nothing", "nothing", "letter"
    )  # no letter: no agreement
    assert agrees("Paris ", "paris", "text")


def test_prompt_sets(tmp_path):
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "2+2=4\n#### 4"}) + "\n")
    (gsm,) = load_prompts("gsm8k", tmp_path)
    assert (gsm.gold, gsm.kind) == ("4", "number")
    (tmp_path / "mmlu").mkdir()
    (tmp_path / "mmlu" / "mmlu_anatomy.csv").write_text('prompt,a,b\n"Q?\nA. x\nB. y\nAnswer:",True,False\n')
    (mmlu,) = load_prompts("mmlu", tmp_path)
    assert (mmlu.gold, mmlu.kind, mmlu.source) == (None, "letter", "mmlu_anatomy")  # RouteLLM's CSVs: no gold letter
    mine = tmp_path / "mine.jsonl"
    mine.write_text(
        "".join(
            json.dumps(row) + "\n"
            for row in [{"prompt": "a", "answer": "B"}, {"prompt": "b", "answer": "1,200"}, {"prompt": "c"}]
        )
    )
    assert [(p.gold, p.kind) for p in load_prompts(str(mine), tmp_path, limit=3)] == [
        ("B", "letter"),
        ("1200", "number"),
        (None, "text"),
    ]
    with pytest.raises(LiveError, match="no such prompt file"):
        load_prompts(str(tmp_path / "missing.jsonl"), tmp_path)


@pytest.mark.slow
def test_eval_live_against_a_real_server(server_url, tmp_path):
    prompts = tmp_path / "arithmetic.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
            for a, b in [(2, 3), (10, 7), (4, 4), (21, 21)]
        )
    )
    table, report = tmp_path / "table.jsonl", tmp_path / "report.json"
    app = typer.Typer()
    register_eval_commands(app)
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--live",
            "--base-url",
            server_url,
            "--prompts",
            str(prompts),
            "--max-tokens",
            "12",
            "--concurrency",
            "2",
            "--table-out",
            str(table),
            "--json",
            str(report),
            "--data-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
    for row in rows:
        assert 0.0 <= row["confidence"] <= 1.0 and row["label"] == "gold"
        assert row["local_completion_tokens"] > 0 and row["cloud_completion_tokens"] > 0
        assert row["weak_correct"] == is_correct(row["local_answer"], row["gold"], "number")
    assert len(load_table(table)) == 4
    assert json.loads(report.read_text())["routers"].keys() == {"column:confidence", "random", "oracle"}
