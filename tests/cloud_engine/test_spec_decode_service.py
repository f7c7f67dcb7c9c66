"""Speculative decoding as the cloud tier's users see it: per-request acceptance in the gRPC
final response and in the OpenAI usage, vLLM-named counters in /metrics, the CLI spelling."""

from __future__ import annotations


import httpx
import pytest

from cloud_engine.spec_decode import SpeculativeConfig, parse_speculative
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.app_helpers import make_app
from tests.cloud_engine.grpc_helpers import long_tiny_dir, make_engine, serve, wait_drained  # noqa: F401
from tests.cloud_engine.tiny_models import random_tokens

# The tiny random model repeats its last prompt token: prompt lookup drafts it and is accepted.
NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=4)


@pytest.fixture(scope="module")
def spec_engine(long_tiny_dir):  # noqa: F811
    engine = make_engine(long_tiny_dir, speculative=NGRAM)
    yield engine
    engine.shutdown()


async def test_grpc_final_response_carries_the_requests_acceptance(spec_engine, serve):  # noqa: F811
    prompt = random_tokens(6, seed=3) * 2
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    direct = [e async for e in spec_engine.generate(GenerationRequest("direct", prompt, params))]
    async with CloudClient(await serve(spec_engine)) as client:
        events = [e async for e in client.generate(prompt, params)]
    assert [e.token_id for e in events] == [e.token_id for e in direct]
    last = events[-1]
    assert last.num_draft_tokens > 0 and 0 < last.num_accepted_tokens <= last.num_draft_tokens
    assert (last.num_draft_tokens, last.num_accepted_tokens) == (
        direct[-1].num_draft_tokens,
        direct[-1].num_accepted_tokens,
    )
    assert await wait_drained(spec_engine)


async def test_openai_usage_and_metrics_report_speculation(spec_engine):
    transport = httpx.ASGITransport(app=make_app(spec_engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        body = {"model": "tiny", "prompt": "w5 w6 w7 w5 w6 w7", "max_tokens": 20, "temperature": 0, "ignore_eos": True}
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        details = r.json()["usage"]["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0 and details["rejected_prediction_tokens"] >= 0
        metrics = (await client.get("/metrics")).text
    drafts = next(line for line in metrics.splitlines() if line.startswith("tandem:spec_decode_num_draft_tokens_total"))
    accepted = next(
        line for line in metrics.splitlines() if line.startswith("tandem:spec_decode_num_accepted_tokens_total")
    )
    assert float(drafts.split()[-1]) >= float(accepted.split()[-1]) > 0
    assert 'tandem:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in metrics


def test_usage_has_no_details_without_speculation():
    from sdk.protocol.openai_schema import Usage

    assert Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3).model_dump() == {
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "total_tokens": 3,
    }


def test_cli_spelling(tmp_path):
    assert parse_speculative("off").enabled is False
    assert parse_speculative("ngram", 6).num_speculative_tokens == 6
    model = tmp_path / "draft.gguf"
    model.write_bytes(b"")
    config = parse_speculative(f"draft:{model}@3")
    assert (config.method, config.draft_model, config.draft_num_layers) == ("draft", str(model), 3)
    with pytest.raises(ValueError, match="off, ngram or draft"):
        parse_speculative("eagle")
    with pytest.raises(ValueError, match="draft model not found"):
        parse_speculative("draft:/nonexistent/model.gguf")
    with pytest.raises(ValueError, match="integer LAYERS"):
        parse_speculative(f"draft:{model}@x")
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be in \[1, 16\]"):
        parse_speculative("ngram", 0)
