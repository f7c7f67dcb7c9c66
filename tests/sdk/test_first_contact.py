"""A new user's first minute: README's own example, unchanged, against `tandem serve` on the
embedded default (the session's server: embedded cloud tier, default threshold)."""

from __future__ import annotations

import contextlib
import io

import pytest

from bench.first_contact import README_BASE_URL, readme_example  # the bench times the same code


@pytest.mark.slow
def test_readme_example_answers_4_every_time_without_degrading(server_url):
    code = readme_example()
    assert README_BASE_URL in code
    code = code.replace(README_BASE_URL, f"{server_url}/v1")  # the only change: this server's port
    for attempt in range(5):
        namespace: dict = {}
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            exec(compile(code, "README.md", "exec"), namespace)
        out = namespace["out"]
        answer, routing = out.choices[0].message.content, out.model_extra["tandem"]
        assert "4" in answer, (attempt, answer, routing)
        assert routing["degraded"] is False, (attempt, answer, routing)
        assert answer in printed.getvalue()


@pytest.mark.slow
def test_models_say_what_a_request_that_leaves_sampling_out_gets(server_url):
    import httpx

    cards = {card["id"]: card for card in httpx.get(f"{server_url}/v1/models", timeout=30).json()["data"]}
    builtin = "built-in: the SmolLM2-Instruct model card"
    for name in ("local", "smollm2-135m-instruct", "cloud"):  # the cloud tier here is the embedded engine
        defaults = cards[name]["sampling_defaults"]
        assert defaults["temperature"] == {"value": 0.2, "source": builtin}, name
        assert defaults["top_p"] == {"value": 0.9, "source": builtin} and defaults["top_k"]["value"] == 0, name
    assert "sampling_defaults" not in cards["auto"]  # either tier may answer: see theirs
