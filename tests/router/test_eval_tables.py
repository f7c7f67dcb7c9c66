"""Routing tables: RouteLLM's CSV columns, tandem's JSONL, the contamination filter, bad rows."""

from __future__ import annotations

import json

import pytest

from router.eval_tables import ROUTELLM_STRONG, ROUTELLM_WEAK, TableError, load_routellm, load_table


def test_routellm_csv_and_tandem_jsonl(tmp_path):
    csv_path = tmp_path / "mmlu_anatomy.csv"
    csv_path.write_text(f'prompt,{ROUTELLM_WEAK},{ROUTELLM_STRONG}\n"Q1\nA. x",True,False\nQ2,False,True\n')
    examples = load_table(csv_path)
    assert [(e.prompt, e.weak_correct, e.strong_correct, e.source) for e in examples] == [
        ("Q1\nA. x", True, False, "mmlu_anatomy"),
        ("Q2", False, True, "mmlu_anatomy"),
    ]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text(json.dumps({"prompt": "p", "weak_correct": 1, "strong_correct": "yes", "note": "n"}) + "\n")
    (example,) = load_table(jsonl)
    assert (example.weak_correct, example.strong_correct, example.extra) == (True, True, {"note": "n"})


@pytest.mark.parametrize(
    "body", ["prompt,weak_correct\np,true\n", "prompt,weak_correct,strong_correct\np,maybe,true\n"]
)
def test_bad_tables_name_the_problem(tmp_path, body):
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(TableError, match="row 1"):
        load_table(path)


def test_contaminated_prompts_are_dropped(tmp_path):
    (tmp_path / "mmlu").mkdir()
    (tmp_path / "mmlu" / "mmlu_x.csv").write_text(
        f"prompt,{ROUTELLM_WEAK},{ROUTELLM_STRONG}\nclean,True,True\nleaked,False,True\n"
    )
    (tmp_path / "mmlu_contaminated_prompts.jsonl").write_text(
        json.dumps({"train_prompt": "t", "eval_prompt": "leaked"}) + "\n"
    )
    assert [e.prompt for e in load_routellm(tmp_path, datasets=("mmlu",))] == ["clean"]
    assert len(load_routellm(tmp_path, datasets=("mmlu",), drop_contaminated=False)) == 2
    with pytest.raises(TableError, match="unknown dataset"):
        load_routellm(tmp_path, datasets=("nope",))
