"""The cascade runner over a real local engine (embedded GGUF) and a real gRPC cloud tier
(the tiny random-weight cloud engine on loopback), recording what the cloud received."""

from __future__ import annotations

import dataclasses

import pytest

from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server, stop_grpc_server
from confidence import RunningConfidence
from local_runtime.async_engine import AsyncLocalEngine
from local_runtime.config import LocalEngineConfig
from router.decision import ModelChoiceError
from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import GenerationRequest, InvalidRequestError, SamplingParams
from sdk.engine_common.repetition import ESCALATE_LOOP, STOP_LOOP, find_loop
from tests.cloud_engine.grpc_helpers import long_tiny_dir, make_engine, serve  # noqa: F401  (fixtures)
from tests.cloud_engine.tiny_models import VOCAB_SIZE
from tests.conftest import free_port

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Describe a cat in detail: its habits and its fur."}]
EMAIL = [{"role": "user", "content": "Write to jane.doe@example.com about the meeting."}]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


class RecordingCloudEngine:
    """The cloud engine, recording each request's messages and continuation ids.

    The tiny model has no chat template and another vocabulary than the local model, so
    this wrapper renders messages as plain words and folds ids into its vocabulary before
    the engine sees them; what was *sent* is recorded before that."""

    def __init__(self, engine):
        self.engine = engine
        self.received: list[tuple[list[dict], list[int]]] = []  # (messages, continuation ids)
        self._template_len = 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def apply_chat_template(self, messages):
        self.received.append(([dict(m) for m in messages], []))
        ids = [1] + self.engine.tokenize(" ".join(m["content"] for m in messages), add_special=False)
        self._template_len = len(ids)
        return ids

    def generate(self, request: GenerationRequest):
        self.received[-1][1].extend(request.prompt_token_ids[self._template_len :])
        folded = [t % VOCAB_SIZE for t in request.prompt_token_ids]
        return self.engine.generate(dataclasses.replace(request, prompt_token_ids=folded))


@pytest.fixture(scope="module")
def local_engine():
    # batch_invariant: these tests compare the cascade's local run with the same request run alone
    # (by default a repeated request's cells land around cached ones, and can round differently).
    config = LocalEngineConfig(
        kv_cache_tokens=1024,
        max_num_seqs=2,
        max_num_batched_tokens=128,
        max_model_len=512,
        n_threads=1,
        batch_invariant=True,
    )
    engine = AsyncLocalEngine(config).start()
    engine.wait_ready(180)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def cloud_engine(long_tiny_dir):  # noqa: F811
    engine = make_engine(long_tiny_dir)
    yield engine
    engine.shutdown()


@pytest.fixture
def recording(cloud_engine):
    return RecordingCloudEngine(cloud_engine)


@pytest.fixture
async def make_runner(recording, serve, local_engine):  # noqa: F811
    clients = []

    async def make(target: str | None = "serve", **config) -> CascadeRunner:
        """A runner over the session's local engine and a cloud at `target`; `config`: CascadeConfig's fields,
        and any of the runner's own collaborators (clock, budgets, traffic, shadow)."""
        if target == "serve":
            target = await serve(recording)
        client = CloudClient(target) if target else None
        clients.append(client)
        parts = {name: config.pop(name) for name in ("clock", "budgets", "traffic", "shadow") if name in config}
        return CascadeRunner(local_engine, client, CascadeConfig(**config), **parts)

    yield make
    for client in clients:
        if client is not None:
            await client.close()


async def reference_scores(local_engine, params=GREEDY) -> list[float]:
    """mean_prob after each local token, computed independently of the runner."""
    request = GenerationRequest("reference", local_engine.apply_chat_template(QUESTION), params)
    running, scores = RunningConfidence(), []
    async for event in local_engine.generate(request):
        running.update(event)
        scores.append(running.score("mean_prob"))
    return scores


def between_threshold(scores: list[float], k: int) -> float:
    """A threshold the first K prefixes pass and a later one fails, where the answer allows
    it (the first later dip below every earlier judged score); else the median."""
    for n in range(k + 1, len(scores) + 1):
        earlier = min(scores[k - 1 : n - 1])
        if scores[n - 1] < earlier:
            return (scores[n - 1] + earlier) / 2
    judged = sorted(scores[k - 1 :])
    return judged[len(judged) // 2]


async def test_threshold_one_and_forced_cloud_always_reach_the_cloud(make_runner, recording):
    runner = await make_runner()
    for model, reason, escalated in [("auto:1", "threshold_one", True), ("cloud", "forced", False)]:
        result = await runner.complete(QUESTION, GREEDY, model=model)
        assert (result.routing.tier, result.routing.reason, result.routing.escalated) == ("cloud", reason, escalated)
        assert set(result.tiers) == {"cloud"} and not result.routing.degraded
        assert result.routing.cost["cloud"]["completion_tokens"] == len(result.token_ids)
    assert len(recording.received) == 2 and recording.received[0][0] == QUESTION


async def test_threshold_zero_and_forced_local_never_reach_the_cloud(make_runner, recording):
    runner = await make_runner()
    for model, reason in [("auto:0", "confident"), ("local", "forced")]:
        result = await runner.complete(QUESTION, GREEDY, model=model)
        assert (result.routing.tier, result.routing.reason, result.routing.escalated) == ("local", reason, False)
        assert set(result.tiers) == {"local"} and result.text
    assert recording.received == []
    with pytest.raises(InvalidRequestError):
        await runner.complete(QUESTION, GREEDY, model="auto:2")
    assert issubclass(ModelChoiceError, InvalidRequestError)


async def test_private_and_pii_requests_never_reach_the_cloud(make_runner, recording):
    runner = await make_runner()
    private = await runner.complete(QUESTION, GREEDY, model="auto:1", private=True)
    email = await runner.complete(EMAIL, GREEDY, model="cloud")
    assert (private.routing.tier, private.routing.reason, private.routing.privacy_reasons) == (
        "local",
        "private",
        ("private_flag",),
    )
    assert (email.routing.tier, email.routing.reason, email.routing.privacy_reasons) == ("local", "private", ("email",))
    assert recording.received == []
    assert runner.privacy_counters.snapshot().num_requests_kept_local == 2


async def test_redaction_sends_only_placeholders(make_runner, recording):
    runner = await make_runner(redact_before_escalation=True)
    result = await runner.complete(EMAIL, GREEDY, model="auto:1")
    assert result.routing.tier == "cloud" and result.routing.num_redactions == 1
    ((sent, _),) = recording.received
    assert "[EMAIL]" in sent[0]["content"] and "jane.doe" not in sent[0]["content"]
    flagged = await runner.complete(EMAIL, GREEDY, model="auto:1", private=True)  # the flag still wins
    assert flagged.routing.tier == "local" and len(recording.received) == 1


async def test_stopped_cloud_server_degrades_to_local(make_runner, recording):
    server = await start_grpc_server(recording, GrpcServerConfig(port=0))
    target = f"127.0.0.1:{bound_port(server)}"
    await stop_grpc_server(server, grace_s=0)
    runner = await make_runner(target, min_tokens_k=4)
    result = await runner.complete(QUESTION, GREEDY, model="auto:1")
    assert (result.routing.tier, result.routing.degraded, result.routing.degraded_reason) == (
        "local",
        True,
        "cloud_unavailable",
    )
    assert result.text and set(result.tiers) == {"local"}
    # Escalating mid-answer: the held-back tokens come out, then the local answer resumes.
    result = await runner.complete(QUESTION, GREEDY, model="auto:0.9999")
    assert result.routing.escalated and result.routing.degraded_reason == "cloud_unavailable"
    assert len(result.token_ids) == GREEDY.max_tokens or result.finish_reason == "stop"


async def test_breaker_opens_after_failures_and_closes_after_cool_down(make_runner, serve, recording):  # noqa: F811
    now = [0.0]
    runner = await make_runner(
        f"127.0.0.1:{free_port()}", breaker_failure_threshold=2, breaker_cool_down_s=10, clock=lambda: now[0]
    )
    params = SamplingParams(max_tokens=4, temperature=0.0)
    reasons = [(await runner.complete(QUESTION, params, model="cloud")).routing.degraded_reason for _ in range(3)]
    assert reasons == ["cloud_unavailable", "cloud_unavailable", "circuit_open"]
    runner.attach_cloud(CloudClient(await serve(recording)))  # the cloud is back
    assert (await runner.complete(QUESTION, params, model="cloud")).routing.degraded_reason == "circuit_open"
    assert recording.received == []
    now[0] = 10.0
    result = await runner.complete(QUESTION, params, model="cloud")
    assert (result.routing.tier, result.routing.degraded) == ("cloud", False)
    assert runner.breaker.state.value == "closed"
    await runner.cloud.close()


@pytest.mark.parametrize("handoff", ["continue", "restart"])
async def test_escalation_at_token_k_hands_off(make_runner, recording, local_engine, handoff):
    k = 4
    scores = await reference_scores(local_engine)
    threshold = min(0.9999, max(scores[k - 1 :]) + 1e-6)  # every judged prefix falls below it: escalate at K
    # Continuing hands the local ids over: the recording cloud stands in for one that shares the local
    # vocabulary (it folds the ids into the tiny model's own), as the embedded SmolLM2 engine does.
    recording.vocabulary_fingerprint = local_engine.vocabulary_fingerprint
    runner = await make_runner(min_tokens_k=k, handoff=handoff)
    local_ids = [
        e.token_id
        async for e in local_engine.generate(
            GenerationRequest("ids", local_engine.apply_chat_template(QUESTION), GREEDY)
        )
    ]
    result = await runner.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")
    routing = result.routing
    assert (routing.tier, routing.escalated, routing.reason, routing.handoff) == (
        "cloud",
        True,
        "low_confidence",
        handoff,
    )
    assert routing.decided_at_token == k and routing.confidence == pytest.approx(scores[k - 1])
    ((_, continuation),) = recording.received
    if handoff == "continue":
        assert continuation == local_ids[: k - 1]  # the released prefix; the K-th token triggered
        assert result.tiers[: k - 1] == ["local"] * (k - 1) and result.token_ids[: k - 1] == local_ids[: k - 1]
        assert set(result.tiers[k - 1 :]) == {"cloud"}
    else:
        assert continuation == [] and set(result.tiers) == {"cloud"}  # no local token was released
    assert routing.cost["local"]["completion_tokens"] == k


async def test_continuing_into_another_vocabulary_is_refused(make_runner, recording, local_engine):
    """The tiny cloud model's card gives its own vocabulary's fingerprint: the local token ids would mean
    other text there, so the local answer stands and nothing is sent."""
    k = 4
    scores = await reference_scores(local_engine)
    threshold = min(0.9999, max(scores[k - 1 :]) + 1e-6)
    runner = await make_runner(min_tokens_k=k, handoff="continue")
    result = await runner.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")
    routing = result.routing
    assert (routing.tier, routing.escalated, routing.degraded_reason) == ("local", True, "cloud_vocabulary_differs")
    assert recording.received == [] and set(result.tiers) == {"local"}
    assert runner.breaker.state.value == "closed"


async def test_draft_on_device_into_another_vocabulary_answers_as_without_it(make_runner, recording):
    """The tiny cloud model's vocabulary is not the device's: its tokens cannot be drafted, so model `cloud`
    answers as it does without draft_on_device, and the `tandem` extension says why."""
    plain = await (await make_runner()).complete(QUESTION, GREEDY, model="cloud")
    drafted = await (await make_runner(draft_on_device=True)).complete(QUESTION, GREEDY, model="cloud")
    assert drafted.routing.tier == "cloud" and drafted.token_ids == plain.token_ids
    assert drafted.routing.draft_refused == "cloud_vocabulary_differs" and drafted.routing.drafts is None
    assert plain.routing.draft_refused is None


async def test_in_between_threshold_matches_recorded_signals(make_runner, recording, local_engine):
    k = 4
    scores = await reference_scores(local_engine)
    threshold = between_threshold(scores, k)
    expected_at = next((n for n in range(k, len(scores) + 1) if scores[n - 1] < threshold), None)
    runner = await make_runner(min_tokens_k=k)
    routing = (await runner.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")).routing
    if expected_at is None:
        assert (routing.tier, routing.escalated, routing.decided_at_token) == ("local", False, len(scores))
        assert recording.received == []
    else:
        assert (routing.tier, routing.escalated, routing.decided_at_token) == ("cloud", True, expected_at)
        assert routing.confidence == pytest.approx(scores[expected_at - 1])
        assert len(recording.received) == 1


POEM = [{"role": "user", "content": "Write a poem about the sea."}]  # greedy SmolLM2 falls into a refrain


async def local_tokens(local_engine, messages, params) -> list[int]:
    """The local answer on its own, loop stop off: what the cascade's local run produces."""
    params = dataclasses.replace(params, repetition_stop=False)
    request = GenerationRequest("reference", local_engine.apply_chat_template(messages), params)
    return [event.token_id async for event in local_engine.generate(request)]


async def test_a_looping_local_answer_escalates_unless_the_request_opts_out(make_runner, local_engine, recording):
    params = SamplingParams(max_tokens=300, temperature=0.0)
    tokens = await local_tokens(local_engine, POEM, params)
    escalate_at, stop_at = find_loop(tokens, ESCALATE_LOOP), find_loop(tokens, STOP_LOOP)
    assert escalate_at is not None and stop_at is not None, (
        "the poem no longer loops greedily here: pick another prompt"
    )
    runner = await make_runner()
    # A threshold no token of this confident answer falls under: only the loop can escalate it.
    result = await runner.complete(POEM, params, model="auto:0.01")
    routing = result.routing
    assert (routing.reason, routing.escalated, routing.tier, routing.decided_at_token) == (
        "repetition",
        True,
        "cloud",
        escalate_at[0],
    )
    assert escalate_at[0] < stop_at[0] and len(recording.received) == 1
    result = await runner.complete(POEM, dataclasses.replace(params, repetition_stop=False), model="auto:0.01")
    assert (result.routing.reason, result.routing.tier, result.token_ids) == ("confident", "local", tokens)


async def test_a_loop_the_cloud_cannot_take_is_stopped_locally(make_runner, local_engine):
    params = SamplingParams(max_tokens=300, temperature=0.0)
    tokens = await local_tokens(local_engine, POEM, params)
    stop_at = find_loop(tokens, STOP_LOOP)
    runner = await make_runner(None)  # no cloud tier: the escalation is refused, the local answer goes on
    result = await runner.complete(POEM, params, model="auto:0.01")
    assert (result.routing.reason, result.routing.degraded_reason, result.routing.tier) == (
        "repetition",
        "no_cloud",
        "local",
    )
    assert (result.finish_reason, result.stop_reason, result.token_ids) == (
        "length",
        "repetition",
        tokens[: stop_at[0]],
    )


async def test_logit_bias_crosses_tiers_only_when_they_share_a_vocabulary(make_runner, recording, local_engine):
    from sdk.cascade.openai import prepare_routed
    from sdk.protocol.openai_schema import ChatCompletionRequest

    token = local_engine.tokenize(" Paris", add_special=False)[0]
    body = ChatCompletionRequest.model_validate(
        {"messages": QUESTION, "logit_bias": {str(token): 100}, "max_tokens": 3, "temperature": 0}
    )
    runner = await make_runner()  # the tiny cloud model: another vocabulary, and its card says so
    assert not await runner.shares_vocabulary()
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        await prepare_routed(runner, body, "auto")
    # A cloud that reports the local model's vocabulary (as the embedded SmolLM2 engine does:
    # tests/cloud_engine/test_real_gguf.py) takes it: the card's fingerprint travels over gRPC.
    recording.vocabulary_fingerprint = local_engine.vocabulary_fingerprint
    runner = await make_runner()
    assert await runner.shares_vocabulary()
    chat = await prepare_routed(runner, body, "auto")
    result = await runner.complete(chat.messages, chat.params, model="auto:0")
    params = chat.params
    assert params.logit_bias == {token: 100.0} and result.token_ids == [token] * 3
    assert await (await make_runner(None)).shares_vocabulary()  # device only: one vocabulary
