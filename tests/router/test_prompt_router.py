"""The prompt router: ONNX export parity, the export cache, refusing bad files, the shipped
default, the CLI. Every test runs against a private cache directory (one MiniLM export,
~15 s, shared by the module), never the user's."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from router.prompt_router import embedder_export
from router.prompt_router.scorer import (
    FORMAT_VERSION,
    METADATA_KEY,
    RouterFormatError,
    RouterModelMismatchError,
    _encode,
    load_scorer,
    load_tokenizer,
)

PROMPTS = [
    f"Question {i}: " + " ".join(["what is the integral of x squared", "name the capital of France",
                                  "explain the tort of negligence", "a train leaves at 3pm going 60 mph"][i % 4]) * (1 + i % 7)
    for i in range(100)
]  # fmt: skip


@pytest.fixture(scope="module")
def router_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANDEM_CACHE_DIR", str(tmp_path_factory.mktemp("tandem_cache")))
        yield embedder_export.cache_dir()


def _metadata(**changes) -> dict:
    document = {"format_version": FORMAT_VERSION, "kind": "scorer", "model_fingerprint": embedder_export.model_fingerprint(),
                "embedder_precision": "fp32", "label": "weak_wrong", "max_tokens": 256, "trained_at": "2025-01-01T00:00:00+00:00", "metrics": {}}  # fmt: skip
    return document | changes


def _random_layers(seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, 0.3, (384, 16)).astype(np.float32), rng.normal(0, 0.1, 16).astype(np.float32)),
            (rng.normal(0, 0.3, (16, 1)).astype(np.float32), np.zeros(1, dtype=np.float32))]  # fmt: skip


def test_split_holds_out_whole_subjects_and_evaluates():
    from router.eval_tables import RoutingExample
    from router.prompt_router.training import evaluate, subject_split

    rng = np.random.default_rng(0)
    examples = [RoutingExample(f"p{i}", bool(rng.random() < 0.5), bool(rng.random() < 0.8), f"mmlu_s{i % 8}") for i in range(400)]
    examples += [RoutingExample(f"g{i}", True, True, "gsm8k") for i in range(20)]
    train_rows, held_rows, held = subject_split(examples, 0.25, seed=0)
    assert len(held) == 2 and "gsm8k" not in held  # GSM8K always trains
    assert not {examples[i].source for i in train_rows} & {examples[i].source for i in held_rows}
    held_examples = [examples[i] for i in held_rows]
    figures = evaluate(rng.random(len(held_examples)), held_examples)
    assert figures["oracle_apgr"] > 0.9 and abs(figures["apgr"] - 0.5) < 0.25  # random scores: about half the gap


def test_refuses_wrong_or_corrupt_files(tmp_path, router_cache):
    import onnx

    from router.prompt_router.head_graph import build_head_model

    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not an onnx file at all")
    with pytest.raises(RouterFormatError, match="not a loadable ONNX model"):
        load_scorer(garbage)
    with pytest.raises(FileNotFoundError):
        load_scorer(tmp_path / "missing.onnx")
    head = build_head_model(_random_layers(), _metadata())
    bare = onnx.ModelProto.FromString(head.SerializeToString())
    del bare.metadata_props[:]
    onnx.save(bare, tmp_path / "bare.onnx")
    with pytest.raises(RouterFormatError, match="not a tandem prompt router"):
        load_scorer(tmp_path / "bare.onnx")
    onnx.save(head, tmp_path / "head.onnx")  # a head alone is not a whole scorer
    with pytest.raises(RouterFormatError, match="kind 'head'"):
        load_scorer(tmp_path / "head.onnx")
    other = build_head_model(_random_layers(), _metadata())
    onnx.helper.set_model_props(other, {METADATA_KEY: json.dumps(_metadata(model_fingerprint="minilm-l6-v2:0000"))})
    onnx.save(other, tmp_path / "other.onnx")  # another embedder's router: metadata checked before the graph
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
def test_whole_scorer_matches_pytorch(tmp_path, router_cache):
    import onnx
    import torch

    from router.prompt_router.head_graph import build_head_model, merge_scorer

    embedder = onnx.load(str(embedder_export.ensure_embedder(precision="fp32")))  # the exact export
    layers = _random_layers()
    head = build_head_model(layers, _metadata(), ir_version=embedder.ir_version)
    onnx.save(merge_scorer(embedder, head, _metadata()), tmp_path / "whole.onnx")
    scores = load_scorer(tmp_path / "whole.onnx").score(PROMPTS)

    module, tokenizer = embedder_export.pytorch_embedder(), load_tokenizer()
    expected = []
    for start in range(0, len(PROMPTS), 25):  # PyTorch on other batches (other padding) than onnxruntime
        inputs = {k: torch.from_numpy(v) for k, v in _encode(tokenizer, PROMPTS[start : start + 25]).items()}
        with torch.no_grad():
            hidden = module(**inputs)
            for weight, bias in layers[:-1]:
                hidden = torch.relu(hidden @ torch.from_numpy(weight) + torch.from_numpy(bias))
            expected.append(torch.sigmoid(hidden @ torch.from_numpy(layers[-1][0]) + torch.from_numpy(layers[-1][1]))[:, 0])
    expected = torch.cat(expected).numpy()
    assert scores.shape == (100,) and np.std(expected) > 0.01  # a head that actually varies
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_int8_embedder_stays_close_to_the_exact_export(router_cache):
    """The default (int8) embedder is a quantization of the fp32 export: a quarter of the
    size, embeddings within cosine 0.98 of fp32 (per-tensor scales would give ~0.95)."""
    from router.prompt_router.scorer import open_session, run_batched

    exact, small = embedder_export.ensure_embedder(precision="fp32"), embedder_export.ensure_embedder(precision="int8")
    assert small != exact and small.stat().st_size < exact.stat().st_size / 3
    tokenizer = load_tokenizer()
    embeddings = [run_batched(tokenizer, PROMPTS, lambda inputs, s=open_session(path): s.run(["embedding"], inputs)[0])
                  for path in (exact, small)]  # fmt: skip
    cosine = (embeddings[0] * embeddings[1]).sum(axis=1)
    assert cosine.min() > 0.98, cosine.min()
    assert np.abs(embeddings[0] - embeddings[1]).max() > 1e-4  # it is quantized, not a copy of fp32


def test_unknown_embedder_precision_is_refused(router_cache):
    from router.prompt_router.scorer import validate_router_metadata

    with pytest.raises(RouterFormatError, match="embedder_precision"):
        validate_router_metadata(_metadata(embedder_precision="int4"))
    with pytest.raises(ValueError, match="precision"):
        embedder_export.ensure_embedder(precision="fp16")


@pytest.mark.slow
def test_default_scorer_scores_deterministically(router_cache):
    scorer = load_scorer()
    first, second = scorer.score(PROMPTS[:20]), scorer.score(PROMPTS[:20])
    assert first.shape == (20,) and np.all((first >= 0) & (first <= 1))
    np.testing.assert_array_equal(first, second)
    assert abs(scorer(PROMPTS[3]) - first[3]) < 1e-5  # one prompt alone (no padding) = in a batch
    assert scorer.metrics["heldout_mmlu"]["apgr"] > 0.5 and scorer.metadata["embedder_precision"] == "int8"


@pytest.mark.slow
def test_cli_score_writes_prompt_score_rows(tmp_path, router_cache):
    from typer.testing import CliRunner

    from sdk.cli.router import router_app

    source, out = tmp_path / "in.csv", tmp_path / "out.csv"
    with open(source, "w", newline="") as handle:
        csv.writer(handle).writerows([["id", "prompt"], ["1", "What is 2+2?"], ["2", "Prove, with care, that, sqrt 2 is irrational."]])
    result = CliRunner().invoke(router_app, ["score", "--data", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["prompt"] for r in rows] == ["What is 2+2?", "Prove, with care, that, sqrt 2 is irrational."]
    assert all(0.0 <= float(r["score"]) <= 1.0 for r in rows) and list(rows[0]) == ["prompt", "score"]


@pytest.mark.slow
def test_cli_train_writes_a_loadable_whole_scorer(tmp_path, router_cache):
    from typer.testing import CliRunner

    from sdk.cli.router import router_app

    table, out = tmp_path / "table.csv", tmp_path / "router.onnx"
    with open(table, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "weak_correct", "strong_correct", "subject"])
        for i in range(48):
            hard = i % 3 == 0  # the weak tier fails the long-division prompts
            prompt = f"Compute {1000 + i} / {7 + i % 5} by long division." if hard else f"Say hello to friend number {i}."
            writer.writerow([prompt, str(not hard), "true", f"subject_{i % 4}"])
    result = CliRunner().invoke(router_app, ["train", "--data", str(table), "--out", str(out), "--steps", "30"])
    assert result.exit_code == 0, result.output
    assert "heldout: APGR" in result.output
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert len(report["heldout_groups"]) == 1 and report["num_final_train"] == 48
    scorer = load_scorer(out)
    scores = scorer.score(["Compute 1234 / 9 by long division.", "Say hello to friend number 99."])
    assert scores[0] > scores[1] and scorer.metadata["kind"] == "scorer"


@pytest.mark.slow
def test_cli_train_takes_every_data_table(tmp_path, router_cache):
    """--data repeats: both tables are trained on (a second one used to replace the first)."""
    from typer.testing import CliRunner

    from sdk.cli.router import router_app

    tables = [tmp_path / "first.csv", tmp_path / "second.csv"]
    for n, table in enumerate(tables):
        with open(table, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["prompt", "weak_correct", "strong_correct", "subject"])
            for i in range(24):
                hard = i % 3 == 0
                prompt = f"Compute {1000 + i} / {7 + n} by long division." if hard else f"Say hello to friend {n}-{i}."
                writer.writerow([prompt, str(not hard), "true", f"subject_{n}_{i % 2}"])
    out = tmp_path / "router.onnx"
    args = ["train", "--data", str(tables[0]), "--data", str(tables[1]), "--out", str(out), "--steps", "20"]
    result = CliRunner().invoke(router_app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.with_suffix(".report.json").read_text())["num_final_train"] == 48
    again = CliRunner().invoke(router_app, ["train", "--data", str(tables[0]), "--data", str(tables[0]), "--out", str(out)])
    assert again.exit_code != 0 and "more than once" in again.output
