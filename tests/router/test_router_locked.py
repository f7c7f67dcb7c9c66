"""Issue 37: the shipped router file's locked-set figure is recomputed from the file itself, and
a labelled table given to `tandem router train --data` teaches the router its topics."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from router.eval_tables import load_routellm
from router.prompt_router.cold_recipe import DEFAULT, ColdRecipe
from router.prompt_router.cross_validation import locked_figures
from router.prompt_router.linear_head import HeadStatistics
from router.prompt_router.locked_split import DEFECTIVE_TABLES, design_examples, is_locked, locked_examples
from router.prompt_router.prompt_shape import shape_features
from router.prompt_router.scorer import load_scorer
from router.prompt_router.training import heldout_gain, table_rows


def test_the_shipped_router_scores_on_the_locked_subjects_what_its_file_says():
    scorer = load_scorer()
    stored = scorer.metrics["locked_test"]
    examples = load_routellm()
    locked = locked_examples(examples)
    prompts = [e.prompt for e in locked]
    outputs = scorer.outputs(prompts)
    figures = locked_figures(outputs.score, shape_features(prompts)[:, 0], locked)
    assert abs(figures["apgr"] - stored["apgr"]) < 2e-3, (figures["apgr"], stored["apgr"])
    # trained on the design subjects only, with the recipe the rule in cold_recipe picks from those figures
    trained_on = scorer.metrics["trained_on"]
    assert trained_on and not any(is_locked(subject) or subject in DEFECTIVE_TABLES for subject in trained_on)
    recipe = ColdRecipe.from_json(scorer.metadata["head_recipe"])
    assert recipe == DEFAULT
    # The file's head is that recipe solved on the design tables' statistics (it carries them): the gains it
    # computes on the locked prompts are the numpy reference's. (A paired "minus length" figure would check
    # nothing here: a head on log_chars alone ranks every prompt as length does, so it is 0 by construction.)
    design = table_rows(design_examples(examples))
    carried = HeadStatistics.from_json(scorer.metadata["prior_statistics"])
    assert carried.num_rows == len(design)
    expected_statistics = HeadStatistics.of(design.shape, design.labels)
    np.testing.assert_allclose(carried.feature_sum, expected_statistics.feature_sum, rtol=1e-9)
    expected = heldout_gain(recipe.solve(carried), None, table_rows(locked))
    np.testing.assert_allclose(outputs.gain, expected, atol=1e-5)


def _topic_prompts(topic: str, start: int, count: int) -> list[str]:
    if topic == "hard":
        stems = [
            "Which enzyme of the {i}th step of glycolysis is inhibited by citrate?",
            "In viral replication, what does protein {i} of the capsid bind to?",
            "Which mutation in oncogene {i} makes the kinase constitutively active?",
        ]
    else:
        stems = [
            "Which slogan would a bakery use for campaign {i}?",
            "What colour is the logo of shop {i} most likely to be?",
            "Which greeting suits customer {i} at a shop counter?",
        ]
    return [
        stems[i % 3].format(i=i) + "\nA. one\nB. two\nC. three\nD. four\nAnswer:" for i in range(start, start + count)
    ]


@pytest.mark.slow
def test_a_labelled_table_teaches_the_topics_it_labels(tmp_path):
    """`tandem router train --data routellm --data labelled.csv`: prompts like the labelled hard
    rows (the local tier wrong, the cloud right) score higher than under the router trained on
    routellm alone, prompts like the labelled easy rows (both right) do not."""
    from typer.testing import CliRunner

    from sdk.cli.router import router_app

    table = tmp_path / "labelled.csv"
    with open(table, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "weak_correct", "strong_correct"])
        writer.writerows([p, "False", "True"] for p in _topic_prompts("hard", 0, 40))
        writer.writerows([p, "True", "True"] for p in _topic_prompts("easy", 0, 40))
    plain, taught = tmp_path / "plain.onnx", tmp_path / "taught.onnx"
    for out, data in ((plain, ["routellm"]), (taught, ["routellm", str(table)])):
        args = ["train", "--out", str(out), "--holdout-fraction", "0"] + [
            part for name in data for part in ("--data", name)
        ]
        result = CliRunner().invoke(router_app, args)
        assert result.exit_code == 0, result.output
    report = json.loads(taught.with_suffix(".report.json").read_text())
    assert report["recipe"]["topic_correction"]["num_rows"] == 80 and report["num_topic_rows"] == 80
    hard, easy = _topic_prompts("hard", 100, 6), _topic_prompts("easy", 100, 6)
    before, after = load_scorer(plain), load_scorer(taught)
    assert np.mean(after.score(hard) - before.score(hard)) > 0.02
    assert (
        np.mean(after.score(hard)) - np.mean(after.score(easy))
        > np.mean(before.score(hard)) - np.mean(before.score(easy)) + 0.03
    )
    plain_report = json.loads(plain.with_suffix(".report.json").read_text())
    assert plain_report["locked_test"]["num_subjects"] == 14  # a shape-only router trained on routellm is scored there
    assert "MiniLM" in report["locked_test"]["not_measured"]
