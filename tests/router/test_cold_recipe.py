"""The cold router's recipe: chosen by grouped CV on the design subjects, sign-stable features
only, prompt length unless a candidate beats it by a standard error (router.prompt_router.cold_recipe)."""

from __future__ import annotations

import numpy as np
import pytest

from router.eval_tables import RoutingExample, load_routellm
from router.prompt_router.cold_recipe import LENGTH, SELECTED, ColdRecipe, select_cold_recipe
from router.prompt_router.linear_head import HeadStatistics
from router.prompt_router.locked_split import design_examples
from router.prompt_router.prompt_shape import SHAPE_FEATURES
from router.prompt_router.training import table_rows


def test_the_shipped_recipe_is_what_selection_chooses_on_the_design_subjects():
    design = design_examples(load_routellm())
    rows = table_rows(design)
    recipe, report = select_cold_recipe(design, rows.shape, rows.labels)
    assert recipe == SELECTED, report
    assert set(report["stable_features"]) | set(report["unstable_features"]) == set(SHAPE_FEATURES)
    assert not set(SELECTED.features) & set(report["unstable_features"])


def _synthetic(signal_column: int | None, seed: int = 0, subjects: int = 16, per_subject: int = 150):
    """Shape matrices made up directly: log_chars carries some of the gain in every subject,
    `signal_column` (when given) more of it, every other column is noise."""
    rng = np.random.default_rng(seed)
    examples, shape, labels = [], [], []
    for s in range(subjects):
        for _ in range(per_subject):
            x = rng.normal(size=len(SHAPE_FEATURES))
            need = 0.6 * x[0] + (1.5 * x[signal_column] if signal_column is not None else 0.0) + rng.normal()
            strong_only = rng.random() < 1 / (1 + np.exp(-need))
            labels.append(
                [0.0 if strong_only else float(rng.random() < 0.5), 1.0 if strong_only else float(rng.random() < 0.5)]
            )
            shape.append(x)
            examples.append(
                RoutingExample(f"p{s}-{len(shape)}", labels[-1][0] > 0.5, labels[-1][1] > 0.5, f"mmlu_s{s}")
            )
    return examples, np.array(shape), np.array(labels)


def test_a_feature_that_carries_the_gain_in_every_subject_ships_and_noise_does_not():
    examples, shape, labels = _synthetic(signal_column=SHAPE_FEATURES.index("digit_share"))
    recipe, report = select_cold_recipe(examples, shape, labels)
    assert "digit_share" in recipe.features and "log_chars" in recipe.features, report
    assert len(report["unstable_features"]) >= 10  # noise columns change sign between folds
    assert not set(recipe.features) & set(report["unstable_features"])


def test_prompt_length_ships_when_nothing_beats_it_by_a_standard_error():
    examples, shape, labels = _synthetic(signal_column=None)
    recipe, report = select_cold_recipe(examples, shape, labels)
    assert recipe == LENGTH, report
    assert report["chosen"] == "length"


def test_a_head_on_a_feature_subset_weighs_the_rest_zero_and_equals_a_fit_on_those_columns():
    rng = np.random.default_rng(1)
    x, labels = rng.normal(size=(300, 6)), rng.random((300, 2))
    statistics = HeadStatistics.of(x, labels)
    subset = statistics.solve(3.0, [0, 4])
    alone = HeadStatistics.of(x[:, [0, 4]], labels).solve(3.0)
    assert np.all(subset.weights[[1, 2, 3, 5]] == 0)
    np.testing.assert_allclose(subset.predict(x), alone.predict(x[:, [0, 4]]), atol=1e-9)


def test_a_recipe_names_known_features_and_round_trips():
    assert ColdRecipe.from_json(SELECTED.as_json()) == SELECTED
    assert ColdRecipe.from_json(None).features == tuple(SHAPE_FEATURES)  # files from before recipes: every feature
    with pytest.raises(ValueError, match="unknown"):
        ColdRecipe(("log_chars", "vibes"), 1.0)
