"""The prompt router: prompt-shape features, the per-tier head, the topic correction learned
from traffic, their ONNX graph against the numpy reference (and MiniLM against PyTorch),
refusing bad files, the shipped default, the CLI. Tests that export MiniLM run against a
private cache directory (one export, ~15 s, shared by the module), never the user's."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from router.eval_tables import RoutingExample
from router.prompt_router import embedder_export
from router.prompt_router.linear_head import fit_head
from router.prompt_router.prompt_shape import NUM_SHAPE_FEATURES, SHAPE_FEATURES, SHAPE_VERSION, shape_features
from router.prompt_router.score_scale import ScoreScale
from router.prompt_router.scorer import (
    FORMAT_VERSION,
    METADATA_KEY,
    RouterFormatError,
    RouterModelMismatchError,
    _encode,
    load_scorer,
    load_tokenizer,
)
from router.prompt_router.topic_correction import fit_topic_correction
from router.prompt_router.training import LabelledRows, fit, heldout_gain, table_rows, write_router

PROMPTS = [
    f"Question {i}: "
    + " ".join(
        [
            "what is the integral of x squared",
            "name the capital of France",
            "explain the tort of negligence",
            "a train leaves at 3pm going 60 mph",
        ][i % 4]
    )
    * (1 + i % 7)
    for i in range(100)
]
PROMPTS_AS_ROWS = [RoutingExample(p, True, True, "x") for p in PROMPTS]


@pytest.fixture(scope="module")
def router_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANDEM_CACHE_DIR", str(tmp_path_factory.mktemp("tandem_cache")))
        yield embedder_export.cache_dir()


def _examples(n: int = 240, seed: int = 0) -> list[RoutingExample]:
    """The weak tier fails the arithmetic-heavy prompts; the strong tier gets most right."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        hard = i % 3 == 0
        prompt = (
            f"Compute {1000 + i} * {7 + i % 5} = ? then (x + {i}) / 2" if hard else f"Say hello to friend number {i}."
        )
        examples.append(
            RoutingExample(prompt, bool(not hard and rng.random() < 0.9), bool(rng.random() < 0.9), f"mmlu_s{i % 6}")
        )
    return examples


def _traffic(examples: list[RoutingExample], dim: int = 384, seed: int = 0) -> LabelledRows:
    """Traffic rows with unit embeddings: topic A (the first half) is harder for the weak tier
    than the head predicts; a third of the rows know only one label, some none."""
    rng = np.random.default_rng(seed)
    rows = table_rows(examples)
    topic_a = np.arange(len(examples)) < len(examples) // 2
    centres = rng.normal(size=(2, dim))
    embedding = centres[np.where(topic_a, 0, 1)] + 0.3 * rng.normal(size=(len(examples), dim))
    rows.embedding = (embedding / np.linalg.norm(embedding, axis=1, keepdims=True)).astype(np.float32)
    rows.labels[topic_a, 0] = (rng.random(topic_a.sum()) < 0.2).astype(float)  # topic A: the weak tier mostly wrong
    rows.labels[1::3, 1] = np.nan
    rows.labels[2::7] = np.nan
    return rows


def test_split_holds_out_whole_subjects_and_evaluates():
    from router.prompt_router.cross_validation import evaluate, subject_split

    rng = np.random.default_rng(0)
    examples = [
        RoutingExample(f"p{i}", bool(rng.random() < 0.5), bool(rng.random() < 0.8), f"mmlu_s{i % 8}")
        for i in range(400)
    ]
    examples += [RoutingExample(f"g{i}", True, True, "gsm8k") for i in range(20)]
    train_rows, held_rows, held = subject_split(examples, 0.25, seed=0)
    assert len(held) == 2 and "gsm8k" not in held  # GSM8K always trains
    assert not {examples[i].source for i in train_rows} & {examples[i].source for i in held_rows}
    held_examples = [examples[i] for i in held_rows]
    figures = evaluate(rng.random(len(held_examples)), held_examples)
    assert figures["oracle_apgr"] > 0.9 and abs(figures["apgr"] - 0.5) < 0.25  # random scores: about half the gap


def test_prompt_shape_reads_stem_choices_and_notation():
    question = "Which value solves 2x + 3 = 7?\nA. 1\nB. 2\nC. the empty set\nD. 4"
    row = dict(zip(SHAPE_FEATURES, shape_features([question, "Hello there."]).T))
    assert shape_features([]).shape == (0, NUM_SHAPE_FEATURES) and np.isfinite(shape_features(["", "?"])).all()
    assert row["log_stem_chars"][0] == pytest.approx(np.log1p(len("Which value solves 2x + 3 = 7?\n")))
    assert row["log_choice_chars_max"][0] == pytest.approx(np.log1p(len("the empty set")))
    assert row["choices_have_digits"].tolist() == [1.0, 0.0] and row["log_choice_chars_max"][1] == 0.0
    assert row["notation_share"][0] > 0 and row["notation_share"][1] == 0 and row["log_questions"][0] > 0
    with pytest.raises(TypeError):
        shape_features("one string")


def test_head_fits_each_tier_on_the_rows_that_know_it():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    weak, strong = 0.5 + 0.2 * x[:, 0], 0.8 - 0.1 * x[:, 1]
    strong_seen = strong.copy()
    strong_seen[::2] = np.nan  # half the rows never heard how the strong tier did
    head = fit_head(x, weak, strong_seen, alpha=1e-6)
    np.testing.assert_allclose(head.predict(x), np.c_[weak, strong], atol=1e-6)
    weight, bias = head.folded()  # the standardization folded in: the same map on raw features
    np.testing.assert_allclose(x @ weight + bias, head.predict(x), atol=1e-9)
    # A weight of 2 is the row twice.
    duplicated = fit_head(np.vstack([x, x[:10]]), np.r_[weak, weak[:10]], np.r_[strong, strong[:10]], alpha=1.0)
    by_weight = fit_head(x, weak, strong, alpha=1.0, sample_weight=np.r_[np.full(10, 2.0), np.ones(390)])
    # (standardization differs slightly between the two: it is computed over the rows given)
    np.testing.assert_allclose(duplicated.predict(x), by_weight.predict(x), atol=2e-3)
    with pytest.raises(ValueError, match="no row knows how the strong tier did"):
        fit_head(x[:3], weak[:3], np.full(3, np.nan))
    # Statistics add: two halves summed fit exactly as the whole.
    from router.prompt_router.linear_head import HeadStatistics

    labels = np.c_[weak, strong_seen]
    halves = HeadStatistics.of(x[:150], labels[:150]) + HeadStatistics.of(x[150:], labels[150:])
    np.testing.assert_allclose(
        halves.solve(1.0).predict(x), HeadStatistics.of(x, labels).solve(1.0).predict(x), atol=1e-9
    )
    again = HeadStatistics.from_json(json.loads(json.dumps(halves.as_json())))
    np.testing.assert_allclose(again.solve(1.0).predict(x), halves.solve(1.0).predict(x), atol=1e-12)


def test_topic_correction_learns_a_topic_the_head_misjudges():
    examples = _examples()
    traffic = _traffic(examples)
    head, _ = fit(table_rows(examples), None)
    before = heldout_gain(head, None, traffic)
    head_again, correction = fit(table_rows(examples), traffic)
    assert correction is not None and correction.weight.shape == (384, 2)  # a linear map: no prompt's embedding is kept
    after = heldout_gain(head_again, correction, traffic)
    topic_a = np.arange(len(examples)) < len(examples) // 2
    # The weak tier fails topic A more than its shape says: its predicted gain goes up relative to topic B.
    lift = (after[topic_a].mean() - after[~topic_a].mean()) - (before[topic_a].mean() - before[~topic_a].mean())
    assert lift > 0.1, lift
    assert fit_topic_correction(traffic.embedding[:10], np.arange(10), traffic.labels[:10], np.zeros((10, 2))) is None


def test_router_graph_matches_the_numpy_reference(tmp_path):
    examples = _examples()
    head, _ = fit(table_rows(examples), None)
    scale = ScoreScale.of(heldout_gain(head, None, table_rows(examples[20:])), "the training rows")
    write_router(head, None, tmp_path / "cold.onnx", {"note": "test"}, scale=scale)
    scorer = load_scorer(tmp_path / "cold.onnx")
    outputs = scorer.outputs(PROMPTS + [e.prompt for e in examples[:20]])
    expected = heldout_gain(head, None, table_rows(PROMPTS_AS_ROWS + examples[:20]))
    np.testing.assert_allclose(outputs.gain, expected, atol=1e-5)
    np.testing.assert_allclose(outputs.score, scale.apply(expected), atol=1e-5)
    assert outputs.embedding is None and scorer.tokenizer is None  # a cold router loads no embedding model
    assert scorer.metadata["format_version"] == FORMAT_VERSION and scorer.metadata["shape_version"] == SHAPE_VERSION
    assert ScoreScale.from_json(scorer.metadata["score_scale"]) == scale
    # written without a reference of its own, a router scores on the shipped router's scale
    write_router(head, None, tmp_path / "shipped_scale.onnx", {})
    assert load_scorer(tmp_path / "shipped_scale.onnx").metadata["score_scale"] == load_scorer().metadata["score_scale"]


def test_score_scale_keeps_the_order_and_refuses_nonsense():
    rng = np.random.default_rng(0)
    gains = rng.normal(0.15, 0.03, size=500)
    gains[:100] = 0.15  # a step: many prompts of one length predict one gain
    scale = ScoreScale.of(gains, "test")
    probe = np.linspace(-1.5, 1.5, 2001)
    scores = scale.apply(probe)
    assert scores[0] == 0.0 and scores[-1] == 1.0 and np.all(np.diff(scores[(probe > -1) & (probe < 1)]) > 0)
    assert abs(scale.gain_at(0.5) - np.median(gains)) < 0.01
    with pytest.raises(ValueError, match="at least"):
        ScoreScale.of(gains[:5], "too few")
    with pytest.raises(ValueError, match="increase strictly"):
        ScoreScale((-1.0, 0.2, 0.1, 1.0), (0.0, 0.4, 0.6, 1.0), "x", 3)
    assert ScoreScale.from_json(scale.as_json()) == scale


def _cold_router(**metadata_changes):
    """(onnx, a cold router's graph, its metadata with `metadata_changes`)."""
    import onnx

    from router.prompt_router.router_graph import build_router_graph
    from router.prompt_router.training import router_metadata, shipped_scale

    head, _ = fit(table_rows(_examples()), None)
    metadata = router_metadata(None, {}, None) | metadata_changes
    return onnx, build_router_graph(head, None, shipped_scale(), router_metadata(None, {}, None)), metadata


def test_refuses_wrong_or_corrupt_files(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not an onnx file at all")
    with pytest.raises(RouterFormatError, match="not a loadable ONNX model"):
        load_scorer(garbage)
    with pytest.raises(FileNotFoundError):
        load_scorer(tmp_path / "missing.onnx")
    onnx, model, _ = _cold_router()
    bare = onnx.ModelProto.FromString(model.SerializeToString())
    del bare.metadata_props[:]
    onnx.save(bare, tmp_path / "bare.onnx")
    with pytest.raises(RouterFormatError, match="not a tandem prompt router"):
        load_scorer(tmp_path / "bare.onnx")
    scale = {"gains": [-1.0, 0.5, 0.2, 1.0], "shares": [0, 0.3, 0.6, 1], "reference": "x", "num_reference": 3}
    cases = [
        # MiniLM-head routers before traffic learning
        ("format_version", 1, "format_version 1 is not supported.*retrain"),
        # score = 0.5 + gain / 2: above 0.5 for nearly every prompt, so threshold 0.5 escalated everything (issue 52)
        ("format_version", 2, "format_version 2 is not supported.*threshold is a cloud share.*retrain"),
        ("shape_version", SHAPE_VERSION + 1, "shape_version"),
        ("topic_correction", {"dims": 16}, "exactly when it has a topic correction"),  # no embedder for it
        ("score_scale", scale, "score_scale.*increase strictly"),
    ]
    for number, (key, value, message) in enumerate(cases):
        _, _, metadata = _cold_router(**{key: value})
        onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(metadata)})
        onnx.save(model, tmp_path / f"case{number}.onnx")
        with pytest.raises(RouterFormatError, match=message):
            load_scorer(tmp_path / f"case{number}.onnx")


@pytest.mark.slow
def test_traffic_router_with_another_embedder_is_refused(tmp_path, router_cache):
    examples = _examples()
    write_router(*fit(table_rows(examples), _traffic(examples)), tmp_path / "learned.onnx", {})
    import onnx

    model = onnx.load(str(tmp_path / "learned.onnx"))
    document = json.loads(model.metadata_props[0].value) | {"model_fingerprint": "minilm-l6-v2:0000"}
    onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(document)})
    onnx.save(model, tmp_path / "other.onnx")
    with pytest.raises(RouterModelMismatchError, match="retrain"):
        load_scorer(tmp_path / "other.onnx")


@pytest.mark.slow
def test_export_is_cached_and_reused(router_cache, monkeypatch):
    path = embedder_export.ensure_embedder()
    assert path.parent == router_cache and path.name.startswith("minilm-")
    mtime = path.stat().st_mtime_ns

    def no_export(*args, **kwargs):
        raise AssertionError("the cached export should have been reused")

    monkeypatch.setattr(embedder_export, "export_embedder", no_export)
    assert embedder_export.ensure_embedder() == path
    assert path.stat().st_mtime_ns == mtime
    assert not list(router_cache.glob("*.partial"))


@pytest.mark.slow
def test_traffic_router_matches_pytorch_and_numpy(tmp_path, router_cache):
    """A router trained from traffic (fp32 export merged in): its embedding output equals
    PyTorch's MiniLM, and its gain the numpy reference over those embeddings."""
    import torch

    examples = _examples()
    head, correction = fit(table_rows(examples), _traffic(examples))
    write_router(head, correction, tmp_path / "learned.onnx", {}, precision="fp32")
    scorer = load_scorer(tmp_path / "learned.onnx")
    outputs = scorer.outputs(PROMPTS)
    module, tokenizer = embedder_export.pytorch_embedder(), load_tokenizer()
    expected = []
    for start in range(0, len(PROMPTS), 25):  # PyTorch on other batches (other padding) than onnxruntime
        inputs = {k: torch.from_numpy(v) for k, v in _encode(tokenizer, PROMPTS[start : start + 25]).items()}
        with torch.no_grad():
            expected.append(module(**inputs).numpy())
    expected = np.concatenate(expected)
    np.testing.assert_allclose(outputs.embedding, expected, atol=1e-4, rtol=0)
    rows = table_rows([RoutingExample(p, True, True, "x") for p in PROMPTS])
    rows.embedding = expected
    reference = heldout_gain(head, correction, rows)
    assert np.std(reference) > 0.01  # a router that actually varies
    np.testing.assert_allclose(outputs.gain, reference, atol=1e-4)
    assert scorer.metadata["topic_correction"]["dims"] == correction.dims


@pytest.mark.slow
def test_int8_embedder_stays_close_to_the_exact_export(router_cache):
    """The default (int8) embedder is a quantization of the fp32 export: a quarter of the
    size, embeddings within cosine 0.98 of fp32 (per-tensor scales would give ~0.95)."""
    from router.prompt_router.scorer import open_session, run_batched

    exact, small = embedder_export.ensure_embedder(precision="fp32"), embedder_export.ensure_embedder(precision="int8")
    assert small != exact and small.stat().st_size < exact.stat().st_size / 3
    tokenizer = load_tokenizer()
    embeddings = [
        np.stack(
            run_batched(tokenizer, PROMPTS, lambda rows, inputs, s=open_session(path): s.run(["embedding"], inputs)[0])
        )
        for path in (exact, small)
    ]
    cosine = (embeddings[0] * embeddings[1]).sum(axis=1)
    assert cosine.min() > 0.98, cosine.min()
    assert np.abs(embeddings[0] - embeddings[1]).max() > 1e-4  # it is quantized, not a copy of fp32


def test_unknown_embedder_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        embedder_export.ensure_embedder(precision="fp16")


def test_default_scorer_scores_deterministically():
    scorer = load_scorer()
    first, second = scorer.score(PROMPTS[:20]), scorer.score(PROMPTS[:20])
    assert first.shape == (20,) and np.all((first >= 0) & (first <= 1)) and np.std(first) > 0
    np.testing.assert_array_equal(first, second)
    assert abs(scorer(PROMPTS[3]) - first[3]) < 1e-6  # one prompt alone = in a batch
    assert scorer.metadata["topic_correction"] is None  # its figures: test_router_locked.py scores the file itself


def test_cli_score_writes_prompt_score_rows(tmp_path):
    from typer.testing import CliRunner

    from sdk.cli.router import router_app

    source, out = tmp_path / "in.csv", tmp_path / "out.csv"
    with open(source, "w", newline="") as handle:
        csv.writer(handle).writerows(
            [["id", "prompt"], ["1", "What is 2+2?"], ["2", "Prove, with care, that, sqrt 2 is irrational."]]
        )
    result = CliRunner().invoke(router_app, ["score", "--data", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["prompt"] for r in rows] == ["What is 2+2?", "Prove, with care, that, sqrt 2 is irrational."]
    assert all(0.0 <= float(r["score"]) <= 1.0 for r in rows) and list(rows[0]) == ["prompt", "score"]


def _write_table(path, examples):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "weak_correct", "strong_correct", "subject"])
        for e in examples:
            writer.writerow([e.prompt, str(e.weak_correct), str(e.strong_correct), e.source])


def test_cli_train_writes_a_loadable_router(tmp_path):
    from typer.testing import CliRunner

    from sdk.cli.router import router_app

    table, out = tmp_path / "table.csv", tmp_path / "router.onnx"
    _write_table(table, _examples())
    result = CliRunner().invoke(router_app, ["train", "--data", str(table), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "heldout: APGR" in result.output
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert len(report["heldout_groups"]) == 2 and report["num_table_rows"] == 240
    scorer = load_scorer(out)
    scores = scorer.score(["Compute 1234 * 9 = ? then (x + 3) / 2", "Say hello to friend number 99."])
    assert scores[0] > scores[1] and scorer.metadata["kind"] == "router"


def test_cli_train_takes_every_data_table(tmp_path):
    """--data repeats: both tables are trained on (a second one used to replace the first)."""
    from typer.testing import CliRunner

    from sdk.cli.router import router_app

    examples = _examples()
    tables = [tmp_path / "first.csv", tmp_path / "second.csv"]
    _write_table(tables[0], examples[:100])
    _write_table(tables[1], examples[100:])
    out = tmp_path / "router.onnx"
    result = CliRunner().invoke(
        router_app, ["train", "--data", str(tables[0]), "--data", str(tables[1]), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.with_suffix(".report.json").read_text())["num_table_rows"] == 240
    twice = CliRunner().invoke(
        router_app, ["train", "--data", str(tables[0]), "--data", str(tables[0]), "--out", str(out)]
    )
    assert twice.exit_code != 0 and "more than once" in twice.output
