"""bench.serve: metric arithmetic on synthetic timings, the streaming client on canned SSE, and quick
runs against real servers (tandem serve; llama-cpp-python's server through our launcher)."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys

import httpx
import numpy as np
import pytest

from bench.serve_client import ClientConfig, arrival_times, make_payload, send_request
from bench.serve_datasets import SampleRequest, random_requests
from bench.serve_metrics import (
    RequestResult,
    compute_metrics,
    gaps,
    meets_slos,
    parse_goodput,
    percentile,
    summarize_ms,
    tpot_s,
)
from bench.serve_servers import REPO_ROOT, llama_cpp_server, tandem_server


def make_result(
    ttft: float, e2e: float, output_len: int, itl=None, prompt_len: int = 10, ok: bool = True, error: str = ""
) -> RequestResult:
    return RequestResult(
        ok=ok, prompt_len=prompt_len, output_len=output_len, ttft_s=ttft, e2e_s=e2e, itl_s=list(itl or []), error=error
    )


# -- metrics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear_interpolation(q):
    values = [5.0, 1.0, 9.0, 3.0, 7.5, 2.0, 8.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edge_cases():
    assert math.isnan(percentile([], 50))
    assert percentile([4.0], 99) == 4.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_ms_converts_seconds_and_is_json_safe_when_empty():
    summary = summarize_ms([0.1, 0.2, 0.3, 0.4])
    assert summary["mean"] == pytest.approx(250.0)
    assert summary["median"] == pytest.approx(250.0)
    assert summary["p90"] == pytest.approx(370.0)
    assert summary["p99"] == pytest.approx(397.0)
    assert summary["count"] == 4
    empty = summarize_ms([])
    assert empty["count"] == 0 and empty["mean"] is None and empty["p99"] is None
    json.dumps(empty, allow_nan=False)


def test_tpot_and_itl():
    assert tpot_s(e2e_s=1.0, ttft_s=0.2, output_len=5) == pytest.approx(0.2)
    assert tpot_s(1.0, 0.2, 1) is None and tpot_s(1.0, 0.2, 0) is None
    assert gaps([1.0, 1.5, 1.75, 2.75]) == pytest.approx([0.5, 0.25, 1.0])
    assert gaps([1.0]) == []


def test_parse_goodput():
    assert parse_goodput(["ttft:200", "tpot:50.5", "e2el:3000"]) == {"ttft": 200.0, "tpot": 50.5, "e2el": 3000.0}
    assert parse_goodput(None) == {}
    for bad in (["ttft"], ["latency:5"], ["ttft:fast"], ["tpot:0"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_meets_slos_uses_every_slo_and_zero_tpot_for_single_tokens():
    fast = make_result(ttft=0.1, e2e=0.5, output_len=5)  # tpot 100 ms
    assert meets_slos(fast, {"ttft": 150, "tpot": 100, "e2el": 500})
    assert not meets_slos(fast, {"ttft": 99})
    assert not meets_slos(fast, {"tpot": 99.9})
    assert meets_slos(make_result(ttft=0.1, e2e=0.1, output_len=1), {"tpot": 1})
    assert not meets_slos(make_result(0.0, 0.0, 0, ok=False, error="boom"), {"ttft": 1e9})


def test_compute_metrics_on_synthetic_timings():
    results = [
        make_result(ttft=0.1, e2e=1.1, output_len=11, itl=[0.1] * 10, prompt_len=20),  # tpot 100 ms
        make_result(ttft=0.3, e2e=2.3, output_len=5, itl=[0.5] * 4, prompt_len=30),  # tpot 500 ms
        make_result(ttft=0.2, e2e=0.2, output_len=1, prompt_len=10),  # no tpot, no itl
        make_result(0, 0, 0, ok=False, error="HTTP 503: full"),
        make_result(0, 0, 0, ok=False, error="HTTP 503: full"),
    ]
    m = compute_metrics(results, duration_s=4.0, slos_ms={"ttft": 250, "tpot": 200})
    assert (m["completed"], m["failed"]) == (3, 2)
    assert m["error_samples"] == ["HTTP 503: full"]
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 17)
    assert m["request_throughput"] == pytest.approx(0.75)
    assert m["output_throughput"] == pytest.approx(17 / 4)
    assert m["total_token_throughput"] == pytest.approx(77 / 4)
    assert m["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert m["ttft_ms"]["median"] == pytest.approx(200.0)
    assert m["tpot_ms"]["count"] == 2 and m["tpot_ms"]["mean"] == pytest.approx(300.0)
    assert m["itl_ms"]["count"] == 14
    assert m["itl_ms"]["mean"] == pytest.approx((10 * 100 + 4 * 500) / 14)
    assert m["itl_ms"]["median"] == pytest.approx(100.0)
    assert m["e2el_ms"]["p99"] == pytest.approx(float(np.percentile([1100, 2300, 200], 99)))
    # Meeting both SLOs: the first (ttft 100, tpot 100) and the single-token one (ttft 200, tpot 0).
    assert m["good_requests"] == 2 and m["request_goodput"] == pytest.approx(0.5)
    json.dumps(m, allow_nan=False)
    with pytest.raises(ValueError):
        compute_metrics(results, duration_s=0.0)


# -- arrivals and workloads ---------------------------------------------------------------------


def test_arrival_times():
    assert arrival_times(4, math.inf) == [0.0] * 4
    times = arrival_times(4000, request_rate=10.0, burstiness=1.0, seed=3)
    assert times[0] == 0.0 and times == sorted(times)
    intervals = gaps(times)
    assert statistics.mean(intervals) == pytest.approx(0.1, rel=0.08)
    assert statistics.pstdev(intervals) / statistics.mean(intervals) == pytest.approx(1.0, rel=0.1)  # Poisson
    even = gaps(arrival_times(4000, 10.0, burstiness=16.0, seed=3))
    assert statistics.pstdev(even) / statistics.mean(even) == pytest.approx(0.25, rel=0.1)  # cv = 1/sqrt(shape)
    assert arrival_times(50, 5.0, 0.5, seed=1) == arrival_times(50, 5.0, 0.5, seed=1)
    for rate, shape in ((0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)):
        with pytest.raises(ValueError):
            arrival_times(3, rate, shape)


def test_random_requests_lengths_and_seed():
    samples = random_requests(50, input_len=100, output_len=40, range_ratio=0.25, seed=7)
    assert all(75 <= s.prompt_len <= 125 and 30 <= s.output_len <= 50 for s in samples)
    assert all(len(s.prompt.split()) == s.prompt_len for s in samples)  # estimate: one token per word
    assert len({s.prompt for s in samples}) == 50
    assert samples == random_requests(50, 100, 40, 0.25, seed=7)
    assert samples != random_requests(50, 100, 40, 0.25, seed=8)
    with pytest.raises(ValueError):
        random_requests(1, 10, 10, range_ratio=1.0)


def test_payload_asks_for_fixed_lengths():
    sample = SampleRequest("hi there", 2, 12)
    chat = make_payload(ClientConfig("http://x/v1", "m"), sample)
    assert chat["messages"] == [{"role": "user", "content": "hi there"}] and chat["max_tokens"] == 12
    assert chat["ignore_eos"] is True and chat["min_tokens"] == 12
    assert chat["stream"] and chat["stream_options"] == {"include_usage": True}
    completion = make_payload(ClientConfig("http://x", "m", endpoint="completions", ignore_eos=False), sample)
    assert completion["prompt"] == "hi there" and "ignore_eos" not in completion and "min_tokens" not in completion
    assert ClientConfig("http://x/v1/", "m").url == "http://x/v1/chat/completions"
    assert ClientConfig("http://x", "m", endpoint="completions").url == "http://x/v1/completions"


# -- the streaming client on canned responses ---------------------------------------------------


def _sse(*chunks) -> bytes:
    lines = [": ping"] + [f"data: {json.dumps(c)}" for c in chunks] + ["data: [DONE]"]
    return ("\n\n".join(lines) + "\n\n").encode()


def _delta(content=None, finish=None, role=None) -> dict:
    delta = {k: v for k, v in (("content", content), ("role", role)) if v is not None}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _send(body: bytes, status: int = 200, max_tokens: int = 3) -> RequestResult:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await send_request(client, ClientConfig("http://test", "m"), SampleRequest("p", 7, max_tokens))

    return asyncio.run(go())


def test_client_reads_usage_and_content_chunks():
    usage = {"prompt_tokens": 15, "completion_tokens": 3, "total_tokens": 18}
    result = _send(
        _sse(_delta(role="assistant"), _delta("a"), _delta("b"), _delta("c", "length"), {"choices": [], "usage": usage})
    )
    assert result.ok and result.output_len == 3 and result.output_len_source == "usage"
    assert result.prompt_len == 15 and result.finish_reason == "length"
    assert len(result.itl_s) == 2 and 0 < result.ttft_s <= result.e2e_s


def test_client_without_usage_falls_back_to_length_then_chunks():
    by_length = _send(_sse(_delta("a"), _delta("bc"), _delta(finish="length")), max_tokens=3)
    assert (by_length.output_len, by_length.output_len_source, by_length.prompt_len) == (3, "length", 7)
    by_chunks = _send(_sse(_delta("a"), _delta("b"), _delta(finish="stop")), max_tokens=9)
    assert (by_chunks.output_len, by_chunks.output_len_source) == (2, "chunks")


def test_client_reports_failures_without_raising():
    refused = _send(b'{"error": {"message": "queue full"}}', status=503)
    assert not refused.ok and refused.error.startswith("HTTP 503") and "queue full" in refused.error
    empty = _send(_sse(_delta(role="assistant"), _delta(finish="stop")))
    assert not empty.ok and "no content" in empty.error
    in_stream = _send(_sse(_delta("a"), {"error": {"message": "engine died"}}))
    assert not in_stream.ok and "engine died" in in_stream.error
    cut_short = _send(_sse(_delta("a"), _delta("b")))  # [DONE] with no finish_reason
    assert not cut_short.ok and "finish_reason" in cut_short.error


def test_extra_buffer_types_are_off_inside_the_patch_and_back_after():
    import llama_cpp
    import llama_cpp.llama_cpp as low_level

    from tests.local_runtime.reference_llama import without_extra_buffer_types

    assert low_level.llama_model_default_params().use_extra_bufts
    with without_extra_buffer_types():
        assert not low_level.llama_model_default_params().use_extra_bufts
        assert not llama_cpp.llama_model_default_params().use_extra_bufts
    assert low_level.llama_model_default_params().use_extra_bufts


# -- real servers -------------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_against_tandem_serve_writes_sane_json(tmp_path):
    out = tmp_path / "serve.json"
    # One llama.cpp thread: the benchmark client needs the other core.
    server = tandem_server(None, threads=1, max_model_len=512)
    server.log_path = str(tmp_path / "tandem.log")
    with server:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.serve",
                "--base-url",
                server.base_url,
                "--quick",
                "--goodput",
                "ttft:60000",
                "--json",
                str(out),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    m = report["metrics"]
    assert report["command"].startswith("python -m bench.serve --base-url")
    # No --model: the first id /v1/models lists, which under tandem serve is the router ("auto").
    listed = [entry["id"] for entry in report["server"]["models_listed"]]
    assert report["machine"]["cores"] >= 1 and report["server"]["model"] == listed[0] == "auto"
    assert "smollm2-135m-instruct" in listed
    assert (m["completed"], m["failed"]) == (8, 0)
    assert m["total_output_tokens"] == 8 * 32  # ignore_eos: exactly max_tokens each
    assert m["output_len_sources"] == {"usage": 8}
    # The server's usage counts the chat template; our fallback count (for servers without usage) agrees.
    from bench import serve
    from bench.serve_datasets import GgufTokenizer
    from bench.serve_run import build_samples
    from sdk.engine_common.model_files import default_model_path

    samples = build_samples(serve.parse_args(["--base-url", "x", "--quick"]), GgufTokenizer(default_model_path()))
    assert m["total_input_tokens"] == sum(s.prompt_len for s in samples) > 8 * 64
    assert m["ttft_ms"]["median"] > 0 and m["ttft_ms"]["p99"] >= m["ttft_ms"]["median"]
    assert m["tpot_ms"]["mean"] > 0 and m["itl_ms"]["count"] > 0
    assert m["e2el_ms"]["mean"] > m["ttft_ms"]["mean"]
    assert m["request_throughput"] > 0 and m["output_throughput"] > 0
    assert m["good_requests"] == 8
    assert report["output_throughput"] == m["output_throughput"]


@pytest.mark.slow
def test_llama_cpp_server_serves_concurrent_fixed_length_streams(tmp_path):
    from bench import serve
    from sdk.engine_common.model_files import default_model_path

    out = tmp_path / "llama.json"
    server = llama_cpp_server(default_model_path(), threads=1, model_alias="smollm2-135m-instruct", n_ctx=512)
    server.log_path = str(tmp_path / "llama_cpp_server.log")
    with server:
        serve.main(
            [
                "--base-url",
                server.base_url,
                "--num-prompts",
                "4",
                "--random-input-len",
                "16",
                "--random-output-len",
                "8",
                "--max-concurrency",
                "2",
                "--json",
                str(out),
            ]
        )
    m = json.loads(out.read_text())["metrics"]
    # interrupt_requests off: a waiting request must not cut the running stream short.
    assert (m["completed"], m["failed"]) == (4, 0)
    assert m["total_output_tokens"] == 4 * 8 and m["output_len_sources"] == {"length": 4}


# -- compare mode's arithmetic ----------------------------------------------------------------


def _metrics(output_tps: float, ttft_ms: float) -> dict:
    latency = {"median": ttft_ms, "p99": ttft_ms * 2, "mean": ttft_ms, "p90": ttft_ms, "count": 1}
    return {
        "output_throughput": output_tps,
        "ttft_ms": latency,
        "itl_ms": {**latency, "median": 40.0, "p99": 90.0},
        "tpot_ms": latency,
        "completed": 64,
        "failed": 0,
        "request_throughput": 1.0,
    }


def test_compare_ratios_pair_repetitions_and_report_their_spread():
    from bench.serve_compare import headline_ratios, summarize, targets_met

    runs = {
        8: {
            "tandem": [_metrics(90, 900), _metrics(100, 1000), _metrics(80, 1100)],
            "llama_server_no_repack": [_metrics(90, 1000), _metrics(80, 1000), _metrics(100, 1000)],
            "llama_server": [_metrics(45, 500)] * 3,
        }
    }
    ratios = headline_ratios(runs)
    # Repetition by repetition (the servers ran in turn): 1.0, 1.25, 0.8 -> median 1.0.
    assert ratios["ratio_output_tps_vs_llama_server_c8"] == pytest.approx(1.0)
    assert ratios["ratio_output_tps_vs_llama_server_c8_spread"] == pytest.approx([0.8, 1.25])
    assert ratios["ratio_ttft_p50_vs_llama_server_c8"] == pytest.approx(1.0)
    assert ratios["ratio_output_tps_vs_llama_server_default_c8"] == pytest.approx(2.0)  # llama.cpp's default buffers
    assert "ratio_output_tps_vs_llama_cpp_server_c8" not in ratios  # that server did not run
    # A median at the target with part of the spread below it is not met.
    assert targets_met(ratios)["ratio_output_tps_vs_llama_server_c8"] is False
    assert targets_met(ratios)["ratio_ttft_p50_vs_llama_server_c8"] is False
    summary = summarize(runs[8])
    assert summary["tandem"]["output_tps"] == 90 and len(summary["tandem"]["runs"]) == 3
    assert summary["llama_server_no_repack"]["ttft_p99_ms"] == 2000


def test_cloud_compare_never_takes_a_wrong_answering_vllm_as_its_baseline():
    from bench.serve_cloud_compare import answered_right, headline_ratios

    runs = {
        32: {
            "tandem_compiled_t2": [_metrics(120, 900), _metrics(100, 1000)],
            "tandem_eager_t2": [_metrics(100, 900), _metrics(80, 1000)],
            "vllm_t1": [_metrics(400, 100)] * 2,  # fastest, but answered nonsense
            "vllm_compiled_t1": [_metrics(100, 1000)] * 2,
            "vllm_compiled_t2": [_metrics(50, 1000)] * 2,
        }
    }
    answers = {"vllm_t1": "L'Etoile, la Marseillaise", "vllm_compiled_t1": "The capital of France is Paris."}
    excluded = {name: answer for name, answer in answers.items() if not answered_right(answer)}
    ratios = headline_ratios(runs, excluded)
    assert ratios["vllm_best_at"] == {"c32": "vllm_compiled_t1"}
    assert ratios["ratio_output_tps_vs_vllm_c32"] == pytest.approx(1.1)  # tandem_compiled: 1.2, 1.0
    assert ratios["tandem_eager_ratio_output_tps_vs_vllm_c32"] == pytest.approx(0.9)
    assert ratios["ratio_output_tps_vs_vllm_compiled_t2_c32"] == pytest.approx(2.2)
    assert not any("vllm_t1" in key for key in ratios)
    with pytest.raises(Exception, match="no vLLM setting answered"):
        headline_ratios(runs, {name: "no" for name in runs[32] if name.startswith("vllm")})


def test_cloud_compare_names_the_keys_of_tandem_on_fewer_threads():
    from bench.serve_cloud_compare import headline_ratios

    runs = {
        32: {
            "tandem_compiled_t2": [_metrics(100, 900)] * 2,
            "tandem_eager_t2": [_metrics(90, 900)] * 2,
            "tandem_compiled_t1": [_metrics(120, 900)] * 2,
            "tandem_eager_t1": [_metrics(80, 900)] * 2,
            "vllm_t1": [_metrics(100, 1000)] * 2,
        }
    }
    ratios = headline_ratios(runs, {})
    assert ratios["ratio_output_tps_vs_vllm_c32"] == pytest.approx(1.0)  # the compiled server on the most threads
    assert ratios["tandem_eager_ratio_output_tps_vs_vllm_c32"] == pytest.approx(0.9)
    assert ratios["tandem_t1_ratio_output_tps_vs_vllm_c32"] == pytest.approx(1.2)
    assert ratios["tandem_eager_t1_ratio_output_tps_vs_vllm_c32"] == pytest.approx(0.8)


def test_compare_servers_are_configured_alike():
    from bench.serve_compare import CTX_PER_SLOT, NUM_SLOTS, STEP_TOKENS, servers_at

    servers = {s.name: s.command for s in servers_at(8, "/bin/llama-server", "/m.gguf", "m", 2)}
    assert set(servers) == {"tandem", "llama_server", "llama_server_no_repack", "llama_cpp_server"}
    assert "llama_cpp_server" not in {s.name for s in servers_at(4, "/bin/llama-server", "/m.gguf", "m", 2)}

    def flag(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    tandem, ls = servers["tandem"], servers["llama_server"]
    assert int(flag(tandem, "--kv-cache-tokens")) == int(flag(ls, "-c")) == NUM_SLOTS * CTX_PER_SLOT
    assert int(flag(tandem, "--max-num-seqs")) == int(flag(ls, "-np")) == NUM_SLOTS
    assert int(flag(tandem, "--max-model-len")) == CTX_PER_SLOT
    assert int(flag(tandem, "--max-num-batched-tokens")) == int(flag(ls, "-b")) == STEP_TOKENS
    assert flag(tandem, "--threads") == flag(ls, "-t") == flag(ls, "-tb") == "2"
    assert "--no-repack" in servers["llama_server_no_repack"] and "--no-repack" not in ls
    assert flag(tandem, "--kv-cache-type") == "f16" and "-ctk" not in ls

    quantized = {s.name: s.command for s in servers_at(8, "/bin/llama-server", "/m.gguf", "m", 2, "q8_0")}
    assert set(quantized) == {"tandem", "llama_server", "llama_server_no_repack"}  # llama_cpp.server: f16 only
    assert flag(quantized["tandem"], "--kv-cache-type") == "q8_0"
    for name in ("llama_server", "llama_server_no_repack"):
        assert flag(quantized[name], "-ctk") == flag(quantized[name], "-ctv") == "q8_0"


def test_cloud_compare_runs_both_sides_in_the_dtype_asked():
    from bench import serve
    from bench.serve_cloud_compare import TandemSettings, Weights, servers

    def flag(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    weights = Weights("/hf", "m", "/m.gguf", "chat")
    for dtype in ("bfloat16", "float32"):
        pool = servers("/bin/python", weights, 2, True, TandemSettings((2,), "int8", "int8", dtype))
        assert {flag(s.command, "--dtype") for s in pool} == {dtype}
        tandem = [s for s in pool if s.name.startswith("tandem")]
        assert tandem and all(flag(s.command, "--weight-dtype") == "int8" for s in tandem)
    assert serve.parse_args(["--compare-cloud"]).cloud_dtype == "bfloat16"
    assert serve.parse_args(["--compare-cloud", "--cloud-dtype", "float32"]).cloud_dtype == "float32"


def test_a_figure_with_no_spread_meets_its_target_as_one_measurement():
    from bench.serve_cloud_compare import EIGHT_BIT_TARGETS
    from bench.serve_compare import targets_met

    ratios = {"roofline_fraction_c32": 0.1, "ratio_output_tps_vs_vllm_c32": 1.38}
    ratios["ratio_output_tps_vs_vllm_c32_spread"] = [1.31, 1.63]
    met = targets_met(ratios, EIGHT_BIT_TARGETS)
    assert met["roofline_fraction_c32"] is False and met["ratio_output_tps_vs_vllm_c32"] is False
    assert met["ratio_tpot_p50_vs_vllm_c32"] == "not measured"
    assert targets_met({"roofline_fraction_c32": 0.85}, EIGHT_BIT_TARGETS)["roofline_fraction_c32"] is True
