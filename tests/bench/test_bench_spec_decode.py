"""bench.spec_decode end to end on a minimal workload: real engines (off, ngram, draft) over
the embedded model, 1 prompt per workload, a batch of 4. float32, where greedy speculative
decoding is exactly token-identical to speculation off (in bfloat16 a multi-token
verification step may round differently from a one-token decode step and flip a near tie)."""

from __future__ import annotations

import json

import pytest

from cloud_engine.spec_decode import SpeculativeConfig

from bench.spec_decode import grounded_conversations, open_conversations, run_bench

pytestmark = pytest.mark.slow


def test_prompts_are_grounded_and_open_ended():
    grounded = grounded_conversations(4, lambda text: text.split())  # words as a stand-in tokenizer
    assert len(grounded) == 4 and all(len(c) == 1 and c[0]["role"] == "user" for c in grounded)
    assert "<<" not in grounded[0][0]["content"]  # GSM8K calculator annotations are removed
    assert len({c[0]["content"].split("\n")[0] for c in grounded}) == 4  # four different instructions
    open_ended = open_conversations(4)
    assert len(open_ended) == 4 and len({c[0]["content"] for c in open_ended}) == 4


def test_minimal_run_reports_sane_figures():
    report = run_bench(num_prompts=1, max_tokens=16, batch_size=4, dtype="float32", measure_step_costs=False)
    json.dumps(report, allow_nan=False)
    for key in (
        "speedup_b1_ngram_grounded",
        "acceptance_rate_ngram_grounded",
        "throughput_ratio_b32_adaptive",
        "speedup_b1_draft_grounded",
        "speedup_b1_ngram_open",
        "throughput_ratio_b32_adaptive_draft",
    ):
        assert report[key] > 0, key
    for workload in ("grounded", "open_ended"):
        results = report["batch1"][workload]
        assert set(results) == {"off", "ngram", "draft"}
        for name, r in results.items():
            assert 0.0 <= r["acceptance_rate"] <= 1.0, name
            assert (
                r["mean_acceptance_length"] == 0.0
                or 1.0 <= r["mean_acceptance_length"] <= 1 + SpeculativeConfig().num_speculative_tokens
            ), name
            assert r["decode_tokens_per_s"] > 0 and r["speedup_vs_off"] > 0, name
            assert r["outputs_identical_to_off"] is True, (workload, name, r["first_divergence_from_off"])
    assert report["batch1"]["grounded"]["off"]["num_drafts"] == 0
    assert report["batch1"]["grounded"]["ngram"]["num_drafts"] > 0  # the copy is found in the prompt
    assert report["outputs_identical_to_off"] is True
    for name, r in report["batch32"].items():
        assert r["num_requests"] == 4 and r["output_tokens"] > 0 and r["ratio_vs_off"] > 0, name
