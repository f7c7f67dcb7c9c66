"""bench.local_step_profile on a few prompts: the step accounting adds up and names the steps right."""

from __future__ import annotations

import json

import pytest

from bench.local_step_profile import run

pytestmark = pytest.mark.slow


def test_a_short_run_accounts_for_every_step():
    report = run(num_prompts=9)  # 8 clients, then one more: full 8-decode steps, and prefill beside decodes
    json.dumps(report, allow_nan=False)
    assert report["output_tokens_per_s"] > 0
    assert 0 < report["llama_decode_time_s"] < report["step_time_s"] <= report["elapsed_s"]
    assert 0 < report["python_share"] < 1
    assert report["num_full_decode_steps"] > 0 and report["prefill_steps"]["count"] > 0
    assert report["llama_decode_ms_p50"] < report["decode_step_ms_p50"]
    # Every prompt token was either computed or shared: the chat template's system prompt is common.
    assert report["prefix_shared_tokens"] > 0
    assert report["prefill_tokens_computed"] + report["prefix_shared_tokens"] == report["prompt_tokens_total"]
