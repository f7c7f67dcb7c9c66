"""Security: keys never reach the logs, loopback by default, PII and private requests never
reach the cloud.

- Keys: a real `tandem cloud serve` (tiny checkpoint) with a key file at debug log level,
  called over HTTP and gRPC with the right key and a wrong one; neither key may appear
  anywhere in its output. `tandem config show` masks the cloud key.
- Bind: the default host is 127.0.0.1; 0.0.0.0 without keys warns, with keys does not.
- PII: the cascade over a fake local engine and a recording OpenAI-compatible cloud (the
  real OpenAICloudClient, so what is recorded is the JSON that would go on the wire), at
  threshold 1 (every request escalates), under hypothesis-generated prompts that embed an
  e-mail address, a phone number or a Luhn-valid card number in arbitrary text, and
  `private: true` requests with arbitrary text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.pii_detectors import luhn_is_valid
from router.privacy import PrivacyRules
from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.cloud.grpc_client import CloudClient, CloudUnauthenticatedError
from sdk.protocol.engine import SamplingParams
from sdk.cloud.openai_client import OpenAICloudClient
from tests.app_helpers import make_app
from sdk.settings.fields import FIELDS
from tests.cloud_engine.test_cloud_engine_edges import tiny_dir  # noqa: F401  (fixture)
from tests.conftest import REPO_ROOT, clean_env, free_port, running_server
from tests.sdk.test_openai_server import FakeEngine

# -- keys never logged -----------------------------------------------------------------------

KEY = "sk-sec-configured-7f3a9c21d4e8b605"
WRONG_KEY = "sk-sec-presented-wrong-0b1c2d3e4f5a"


@pytest.fixture(scope="module")
def keyed_cloud_server(tiny_dir, tmp_path_factory):  # noqa: F811
    """`tandem cloud serve` with KEY in a key file, at debug level: (process, base_url, grpc_target, log_path)."""
    folder = tmp_path_factory.mktemp("security")
    (folder / "keys").write_text(f"# the only key\n{KEY}\n")
    grpc_port = free_port()
    args = [
        "cloud",
        "serve",
        "--model",
        tiny_dir,
        "--model-name",
        "tiny",
        "--dtype",
        "float32",
        "--kv-cache-gb",
        "0.001",
        "--max-model-len",
        "64",
        "--grpc-port",
        str(grpc_port),
        "--api-key-file",
        str(folder / "keys"),
        "--log-level",
        "debug",
    ]
    log_path = folder / "server.log"
    # GRPC_VERBOSITY: gRPC's own core log too.
    with running_server(args, log_path, "tandem cloud serve", extra_env={"GRPC_VERBOSITY": "debug"}) as (
        process,
        base_url,
    ):
        yield process, base_url, f"127.0.0.1:{grpc_port}", log_path


@pytest.mark.slow
async def test_keys_never_appear_in_the_server_log(keyed_cloud_server):
    process, base_url, grpc_target, log_path = keyed_cloud_server
    completion = {"model": "tiny", "prompt": "w1 w2 w3", "max_tokens": 2, "temperature": 0}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for key, status in [(WRONG_KEY, 401), (KEY, 200), (None, 401)]:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            for path in ("/v1/models", "/metrics"):
                assert (await http.get(path, headers=headers)).status_code == status
            response = await http.post("/v1/completions", json=completion, headers=headers)
            assert response.status_code == status, response.text
            assert KEY not in response.text and WRONG_KEY not in response.text
        # A key in a malformed header (not Bearer), and in the body: still never echoed or logged.
        odd = await http.post(
            "/v1/completions", json={**completion, "user": WRONG_KEY}, headers={"Authorization": WRONG_KEY}
        )
        assert odd.status_code == 401 and WRONG_KEY not in odd.text
    async with CloudClient(grpc_target, api_key=KEY) as client:
        events = [
            e async for e in client.generate("w1 w2", SamplingParams(max_tokens=2, temperature=0.0), model="tiny")
        ]
        assert events[-1].finish_reason == "length"
    async with CloudClient(grpc_target, api_key=WRONG_KEY) as client:
        with pytest.raises(CloudUnauthenticatedError) as info:
            [e async for e in client.generate("w1", SamplingParams(max_tokens=1), model="tiny")]
        assert WRONG_KEY not in str(info.value)
    with pytest.raises(openai.AuthenticationError) as info:  # what the official client surfaces
        await openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=WRONG_KEY, max_retries=0).models.list()
    assert WRONG_KEY not in str(info.value) + str(info.value.body)
    process.terminate()  # flush everything: shutdown logging included
    process.wait(timeout=30)
    log = log_path.read_text(errors="replace")
    assert "DEBUG" in log and "refused: unknown API key" in log, log[-3000:]  # the debug/refusal lines were written
    for secret in (KEY, WRONG_KEY):
        # Not the key, nor any long piece of it (a truncated or wrapped key is a leak too).
        pieces = {secret[i : i + 12] for i in range(len(secret) - 11)}
        leaked = [piece for piece in pieces if piece in log]
        assert not leaked, f"{leaked[:3]} of a key is in the log"


def test_config_show_masks_the_cloud_key(tmp_path):
    config = tmp_path / "tandem.toml"
    config.write_text(
        f'[cloud]\nurl = "grpcs://cloud.example:443"\napi_key = "{KEY}"\n'
        f'[traffic]\nrecord = true\nshadow_fraction = 0.1\njudge = "https://judge.example/v1"\n'
        f'judge_model = "big"\njudge_api_key = "{KEY}-judge"\n'
        f'[cloud_server]\nstate_db = "postgresql://tandem:{KEY}@db.example/tandem"\n'
    )
    for extra in ([], ["--json"]):
        out = subprocess.run(
            [sys.executable, "-m", "sdk.cli", "config", "show", "--config", str(config), *extra],
            capture_output=True,
            text=True,
            env=clean_env(),
            cwd=REPO_ROOT,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert KEY not in out.stdout + out.stderr and "***" in out.stdout
    env = clean_env() | {"TANDEM_CLOUD_API_KEY": WRONG_KEY}
    out = subprocess.run(
        [sys.executable, "-m", "sdk.cli", "config", "show"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 0 and WRONG_KEY not in out.stdout + out.stderr
    # the secret settings: the cloud's key, the shadow judge's, and the state database's URL (it may hold a password)
    assert sorted(f.dotted for f in FIELDS.values() if f.secret) == [
        "cloud.api_key",
        "cloud_server.state_db",
        "server.state_db",
        "traffic.judge_api_key",
    ]


# -- binding ---------------------------------------------------------------------------------


def test_default_bind_is_loopback():
    assert FIELDS["server.host"].default == "127.0.0.1"
    from sdk.serving.grpc.server import GrpcServerConfig

    assert GrpcServerConfig().host == "127.0.0.1"
    out = subprocess.run(
        [sys.executable, "-m", "sdk.cli", "cloud", "serve", "--help"],
        capture_output=True,
        text=True,
        env=clean_env() | {"COLUMNS": "200"},
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert "127.0.0.1" in out.stdout  # tandem cloud serve's --host default


@pytest.mark.parametrize(
    "host, keys, warns",
    [
        ("0.0.0.0", frozenset(), True),
        ("::", frozenset(), True),
        ("192.168.1.20", frozenset(), True),
        ("0.0.0.0", frozenset({KEY}), False),
        ("127.0.0.1", frozenset(), False),
        ("localhost", frozenset(), False),
    ],
)
def test_a_wide_bind_without_keys_warns(host, keys, warns, caplog):
    caplog.set_level(logging.WARNING, logger="sdk.openai_server")
    make_app(FakeEngine(), api_keys=keys, bind_host=host)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "without API keys" in r.getMessage()]
    assert bool(warnings) is warns
    assert all(KEY not in r.getMessage() for r in caplog.records)


# -- PII and private requests never reach the cloud ---------------------------------------------


class RecordingCloud:
    """An OpenAI-compatible cloud (ASGI) that records every body it is sent and answers "ok"."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"].endswith("/models"):
            payload = json.dumps({"object": "list", "data": [{"id": "rec", "object": "model", "owned_by": "test"}]})
            await _send(send, 200, "application/json", payload.encode())
            return
        self.bodies.append(body)
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
        ]
        events = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        await _send(send, 200, "text/event-stream", events.encode())

    def texts(self) -> list[str]:
        """Every message text the cloud was sent (parsed, so JSON escapes are undone)."""
        out = []
        for body in self.bodies:
            for message in json.loads(body)["messages"]:
                content = message["content"]
                out += [content] if isinstance(content, str) else [part.get("text", "") for part in content]
        return out


async def _send(send, status: int, content_type: str, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type.encode())]})
    await send({"type": "http.response.body", "body": body})


def _cascade(cloud: RecordingCloud, **config) -> CascadeRunner:
    client = OpenAICloudClient("http://cloud.test/v1")
    client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=cloud), base_url="http://cloud.test")
    return CascadeRunner(FakeEngine(words=["x", "y"]), client, CascadeConfig(**config))


def _with_check_digit(payload: str) -> str:
    return next(payload + d for d in "0123456789" if luhn_is_valid(payload + d))


def _grouped(digits: str, sizes: tuple[int, ...], sep: str) -> str:
    groups, at = [], 0
    for size in sizes:
        groups.append(digits[at : at + size])
        at += size
    return sep.join(groups)


DIGITS = st.text("0123456789", min_size=1, max_size=1)


@st.composite
def card_numbers(draw) -> str:
    """Luhn-valid Visa/Mastercard (16 digits) or Amex (15), compact or grouped by spaces or dashes."""
    if draw(st.booleans()):
        first, length, sizes = draw(st.sampled_from(["4", "51", "55", "22"])), 16, (4, 4, 4, 4)
    else:
        first, length, sizes = draw(st.sampled_from(["34", "37"])), 15, (4, 6, 5)
    body = first + "".join(draw(st.lists(DIGITS, min_size=length - 1 - len(first), max_size=length - 1 - len(first))))
    digits = _with_check_digit(body)
    sep = draw(st.sampled_from(["", " ", "-"]))
    return digits if not sep else _grouped(digits, sizes, sep)


@st.composite
def phone_numbers(draw) -> str:
    """North American (area code 2-9xx) in its written forms, or international with "+"."""
    area = draw(st.sampled_from("23456789")) + "".join(draw(st.lists(DIGITS, min_size=2, max_size=2)))
    rest = "".join(draw(st.lists(DIGITS, min_size=7, max_size=7)))
    form = draw(st.sampled_from(["paren", "dash", "dot", "plus"]))
    if form == "paren":
        return f"({area}) {rest[:3]}-{rest[3:]}"
    if form == "dash":
        return f"{area}-{rest[:3]}-{rest[3:]}"
    if form == "dot":
        return f"{area}.{rest[:3]}.{rest[3:]}"
    country = draw(st.sampled_from(["1", "33", "44", "49", "81"]))
    return f"+{country} {area} {rest[:3]} {rest[3:]}"


EMAILS = st.from_regex(
    r"[a-z][a-z0-9._+-]{0,15}[a-z0-9]@[a-z][a-z0-9-]{0,10}[a-z0-9]\.(com|org|net|io|co\.uk)", fullmatch=True
)
PII = st.one_of(
    EMAILS.map(lambda v: ("email", v)),
    phone_numbers().map(lambda v: ("phone", v)),
    card_numbers().map(lambda v: ("card", v)),
)
# Arbitrary text (any Unicode but lone surrogates, which JSON cannot carry).
FILLER = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)
ROLES = st.sampled_from(["user", "system"])


def _embed(left: str, pii: str, right: str) -> str:
    # " | " delimits: no detector joins a digit run, a phone run or an e-mail's local part across "|".
    return f"{left} | {pii} | {right}"


PII_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PII_SETTINGS
@given(pii=PII, left=FILLER, right=FILLER, role=ROLES, earlier=st.lists(FILLER, max_size=2))
def test_pii_is_kept_local_by_default(pii, left, right, role, earlier):
    rule, value = pii
    text = _embed(left, value, right)
    assert rule in PrivacyRules().matched_rule_names(text), f"the {rule} detector missed {value!r} in {text!r}"
    messages = [{"role": "user", "content": t} for t in earlier] + [{"role": role, "content": text}]
    cloud = RecordingCloud()

    async def run():
        runner = _cascade(cloud, default_threshold=1.0)
        result = await runner.complete(messages, SamplingParams(max_tokens=2), model="auto:1")
        await runner.cloud.close()
        return result

    result = asyncio.run(run())
    assert cloud.bodies == []  # nothing at all went out
    assert (result.routing.tier, result.routing.reason) == (
        "local",
        "private",
    ) and rule in result.routing.privacy_reasons


@PII_SETTINGS
@given(pii=PII, left=FILLER, right=FILLER, role=ROLES)
def test_redaction_sends_placeholders_never_the_value(pii, left, right, role):
    rule, value = pii
    text = _embed(left, value, right)
    cloud = RecordingCloud()

    async def run():
        runner = _cascade(cloud, default_threshold=1.0, redact_before_escalation=True)
        result = await runner.complete([{"role": role, "content": text}], SamplingParams(max_tokens=2), model="auto:1")
        await runner.cloud.close()
        return result

    result = asyncio.run(run())
    assert len(cloud.bodies) == 1 and result.routing.tier == "cloud" and result.routing.num_redactions >= 1
    sent = cloud.texts()
    assert all(value not in t for t in sent), f"{value!r} reached the cloud: {sent!r}"
    assert value.encode() not in cloud.bodies[0]  # not in the raw bytes either
    assert "|" in "".join(sent)  # what is left of the text did go


@PII_SETTINGS
@given(texts=st.lists(FILLER, min_size=1, max_size=3), redact=st.booleans())
def test_private_requests_never_reach_the_cloud(texts, redact):
    messages = [{"role": "user", "content": t} for t in texts]
    cloud = RecordingCloud()

    async def run():
        runner = _cascade(cloud, default_threshold=1.0, redact_before_escalation=redact)
        results = [
            await runner.complete(messages, SamplingParams(max_tokens=2), model=model, private=True)
            for model in ("auto:1", "auto", "cloud")
        ]
        await runner.cloud.close()
        return results

    for result in asyncio.run(run()):
        assert result.routing.tier == "local" and "private_flag" in result.routing.privacy_reasons
    assert cloud.bodies == []


async def test_the_recording_cloud_does_record_an_ordinary_escalation():
    """The control for the PII tests: without PII, threshold 1 does reach the recording cloud."""
    cloud = RecordingCloud()
    runner = _cascade(cloud, default_threshold=1.0)
    result = await runner.complete(
        [{"role": "user", "content": "hello there"}], SamplingParams(max_tokens=2), model="auto:1"
    )
    await runner.cloud.close()
    assert result.routing.tier == "cloud" and result.text == "ok" and cloud.texts() == ["hello there"]


def test_private_flag_reaches_the_cascade_over_http():
    """`"private": true` in a chat body keeps the request local through the HTTP layer too."""
    cloud = RecordingCloud()

    async def run():
        engine = FakeEngine(words=["x", "y"])
        client = OpenAICloudClient("http://cloud.test/v1")
        client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=cloud), base_url="http://cloud.test")
        app = make_app(engine, cascade=CascadeRunner(engine, client, CascadeConfig(default_threshold=1.0)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            chat = {"model": "auto:1", "messages": [{"role": "user", "content": "secret plans"}], "max_tokens": 2}
            private = await http.post("/v1/chat/completions", json={**chat, "private": True})
            pii = await http.post(
                "/v1/chat/completions", json={**chat, "messages": [{"role": "user", "content": "mail a.b@example.org"}]}
            )
            plain = await http.post("/v1/chat/completions", json=chat)
        await client.close()
        return private.json(), pii.json(), plain.json()

    private, pii, plain = asyncio.run(run())
    assert private["tandem"]["tier"] == "local" and pii["tandem"]["tier"] == "local"
    assert plain["tandem"]["tier"] == "cloud" and cloud.texts() == ["secret plans"]  # only the plain one went out


# -- what the issue asked about in the README (its reliability section, docs/reliability.md since issue 53) --


def test_readme_documents_grpc_tls():
    page = (REPO_ROOT / "docs" / "reliability.md").read_text()
    assert "--tls-cert" in page and "--tls-key" in page and "grpcs://" in page
