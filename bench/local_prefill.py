"""Where a lone prompt's prefill time goes: tandem's two prefill modes against llama-server's own timing.

    python -m bench.local_prefill --json bench/results/local_prefill.json [--quick]

One prompt at a time, nothing else in the pool, random token ids (seeded) of 64, 128, 256 and
512 tokens, logits for the last token only, 2 threads, the embedded SmolLM2:

* `invariant`: tandem's backend in batch-invariant mode (ubatches of 63 tokens: llama.cpp's
  per-row attention kernel; how every prompt went through before issue 38);
* `default`: tandem's backend with its defaults (ubatches of up to 512 tokens, as llama.cpp's);
* `engine`: the whole local engine with its defaults, add_request to the first token event
  (scheduling, the batch tandem builds, llama_decode, sampling and the confidence signals); its
  `prefill_weights` default (docs/local-engine.md "Prefill weights") is recorded as `engine_prefill_weights`, with
  the reason `auto` gave (its measurement on this machine) as `engine_prefill_choice`;
* `engine_own_weights`: the same engine with `prefill_weights = "off"` (prompts on the model's own
  quantized weights, as llama-server runs them);
* `llama_server`: llama-server (scripts/build-llama-server.sh, the same llama.cpp commit) with
  the bench.serve comparison's flags (--no-repack, -b/-ub 512, flash attention), the same token
  ids through /completion with `cache_prompt` off and one output token: its own `prompt_ms`.

Also `first_token_kl_vs_f16_own_weights` and `first_token_kl_vs_f16_bf16`: over 16 chat prompts,
the mean KL divergence of the first token's distribution on the model's own Q4_1 path and through
a BF16 copy from the distribution through an F16 copy of the same weights (the dequantized Q4_1
weights to F16's 11 bits, 16-bit activations: the closest llama.cpp gets to the file's own numbers);
`first_token_kl_vs_f16_bf16_then_own` and `..._f16_then_own`: the engine's path through each copy,
whose first token is computed on the model's own weights over the copy's cells.

The timed ones run interleaved, prompt by prompt, with a pause between them so neither process's
OpenMP threads are still spinning when the other starts. Keys, per length N: `ms_p50` of each
and the medians of per-repetition ratios with their min-max spread,
`ratio_invariant_vs_default_N`, `ratio_default_vs_llama_server_N`, `ratio_engine_vs_llama_server_N`,
`ratio_engine_own_weights_vs_llama_server_N`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import httpx
import numpy as np

from bench.machine import report_header, write_report
from bench.repetitions import median_and_spread
from bench.serve_compare import build_llama_server
from bench.serve_servers import llama_server
from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from sdk.protocol.engine import GenerationRequest, SamplingParams
from sdk.engine_common.model_files import default_model_path

LENGTHS = (64, 128, 256, 512)
THREADS = 2
N_CTX = 2048
PAUSE_S = 0.3  # OpenMP workers spin a while after a parallel region; let them sleep before the next timing
HEADLINE_KEYS = (
    "ratio_invariant_vs_default_128",
    "ratio_default_vs_llama_server_128",
    "ratio_engine_vs_llama_server_128",
    "ratio_engine_own_weights_vs_llama_server_128",
)


def time_backend(backend: LlamaBackend, tokens: np.ndarray) -> float:
    n = len(tokens)
    want = np.zeros(n, np.int8)
    want[-1] = 1
    backend.clear_slot(0)
    start = time.perf_counter()
    backend.decode(tokens, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), want)
    elapsed = time.perf_counter() - start
    backend.clear_slot(0)
    return elapsed * 1000


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def time_engine(engine: LocalEngine, request_id: str, tokens: np.ndarray) -> float:
    engine.clear_prompt_cache()  # random ids share nothing; an empty pool, as for the others
    start = time.perf_counter()
    engine.add_request(GenerationRequest(request_id, tokens.tolist(), SamplingParams(max_tokens=1, temperature=0.0)))
    while not engine.step():
        pass
    elapsed = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed * 1000


def time_llama_server(client: httpx.Client, url: str, tokens: np.ndarray) -> float:
    body = {"prompt": tokens.tolist(), "n_predict": 1, "cache_prompt": False, "temperature": 0.0}
    timings = client.post(url + "/completion", json=body).raise_for_status().json()["timings"]
    assert timings["prompt_n"] == len(tokens), timings  # nothing reused: the whole prompt computed
    return float(timings["prompt_ms"])


FIDELITY_QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain photosynthesis briefly.",
    "List three prime numbers.",
    "Who wrote Hamlet?",
    "Translate 'thank you' into German.",
    "What is 12 times 7?",
    "Give me a tip for sleeping better.",
    "Why is the sky blue?",
    "Name a mammal that can fly.",
    "How do I reverse a list in Python?",
    "What does DNA stand for?",
    "Suggest a name for a cat.",
    "What is the boiling point of water?",
    "Summarize the plot of Cinderella.",
    "Is a tomato a fruit?",
)


def first_token_kl(path: str) -> dict:
    """Mean KL(F16 copy || path) of the first token over FIDELITY_QUESTIONS: the model's own weights, the
    BF16 copy, and the engine's path through each copy (all but the last token on the copy, the cells
    moved, the last token on the model's own weights)."""
    from local_runtime.prefill_context import PrefillContext, PromptChunk
    from local_runtime.prefill_weights import prefill_copy_path
    from sdk.engine_common.chat_template import render_chat

    paths = {"own_weights": path, "bf16": prefill_copy_path(path, "bf16"), "f16": prefill_copy_path(path, "f16")}
    backends = {name: LlamaBackend(LlamaBackendConfig(p, N_CTX, 1, 512, THREADS)) for name, p in paths.items()}
    main = LlamaBackend(LlamaBackendConfig(path, N_CTX, 1, 512, THREADS, scratch_sequence=True))
    copies = {f"{kind}_then_own": PrefillContext(main, paths[kind], N_CTX, kind) for kind in ("bf16", "f16")}
    try:
        model = backends[
            "own_weights"
        ]  # the prompt as tandem serves it: the GGUF's chat template, as LocalEngine renders it
        template, bos, eos = (
            model.metadata("tokenizer.chat_template"),
            model.special_token_text("bos"),
            model.special_token_text("eos"),
        )
        kl = {"own_weights": [], "bf16": [], "bf16_then_own": [], "f16_then_own": []}
        for question in FIDELITY_QUESTIONS:
            text = render_chat(template, [{"role": "user", "content": question}], bos, eos)
            tokens = np.array(model.tokenize(text, add_special=False, parse_special=True), np.int32)
            n = len(tokens)
            logits = {}
            for name, backend in backends.items():
                want = np.zeros(n, np.int8)
                want[-1] = 1
                backend.clear_slot(0)
                logits[name] = backend.decode(tokens, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), want)[0]
            for name, copy in copies.items():
                main.clear_all()
                copy.prefill([PromptChunk(0, 0, tokens[:-1])])
                last = np.array([n - 1], np.int32)
                logits[name] = main.decode(tokens[-1:], last, np.zeros(1, np.int32), np.ones(1, np.int8))[0]
            logp = {name: _log_softmax(x.astype(np.float64)) for name, x in logits.items()}
            for name in kl:
                kl[name].append(float(np.sum(np.exp(logp["f16"]) * (logp["f16"] - logp[name]))))
    finally:
        for closable in [*copies.values(), *backends.values(), main]:
            closable.close()
    return {f"first_token_kl_vs_f16_{name}": statistics.mean(values) for name, values in kl.items()} | {
        "fidelity_prompts": len(FIDELITY_QUESTIONS)
    }


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def summarize(samples: dict[str, list[float]], n: int) -> dict:
    out = {f"{name}_ms_p50": statistics.median(values) for name, values in samples.items()}
    for key, (a, b) in {
        "invariant_vs_default": ("invariant", "default"),
        "default_vs_llama_server": ("default", "llama_server"),
        "engine_vs_llama_server": ("engine", "llama_server"),
        "engine_own_weights_vs_llama_server": ("engine_own_weights", "llama_server"),
    }.items():
        out[f"ratio_{key}_{n}"], out[f"ratio_{key}_{n}_spread"] = median_and_spread(
            [x / y for x, y in zip(samples[a], samples[b])]
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.local_prefill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", default="bench/results/local_prefill.json")
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 9")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one repetition of 32- and 128-token prompts: checks that the bench runs; its figures mean nothing",
    )
    args = parser.parse_args(argv)
    repeats = 1 if args.smoke else 3 if args.quick else 9
    lengths = (32, 128) if args.smoke else LENGTHS
    path = default_model_path()
    binary, llama_cpp_commit = build_llama_server()
    rng = np.random.default_rng(0)
    backends = {
        mode: LlamaBackend(LlamaBackendConfig(path, N_CTX, 1, 512, THREADS, batch_invariant=mode == "invariant"))
        for mode in ("invariant", "default")
    }
    vocab = backends["default"].n_vocab
    engine_config = dict(n_threads=THREADS, kv_cache_tokens=N_CTX, max_num_seqs=1, max_model_len=1024)
    warm = rng.integers(100, vocab, 32).astype(np.int32)
    # What the copy costs in memory: each engine's growth of this process's resident set, loaded and
    # warmed (the model file's pages are resident already, from the backends above, for both).
    rss = rss_mib()
    own_weights = LocalEngine(LocalEngineConfig(**engine_config, prefill_weights="off"))
    time_engine(own_weights, "warm", warm)
    rss_own, rss = rss_mib() - rss, rss_mib()
    engine = LocalEngine(LocalEngineConfig(**engine_config))
    time_engine(engine, "warm", warm)
    rss_engine = rss_mib() - rss
    copy_mib = os.path.getsize(engine.prefill.backend.config.model_path) / 2**20 if engine.prefill else 0.0
    samples = {
        n: {"invariant": [], "default": [], "engine": [], "engine_own_weights": [], "llama_server": []} for n in lengths
    }
    server = llama_server(binary, path, THREADS, "bench", 1, N_CTX, 512, 512, repack=False)
    with server, httpx.Client(timeout=120, trust_env=False) as client:
        time_backend(backends["invariant"], warm), time_backend(backends["default"], warm)
        time_llama_server(client, server.base_url, warm)
        for rep in range(repeats):
            for n in lengths:
                tokens = rng.integers(100, vocab, n).astype(np.int32)
                timers = {
                    "invariant": lambda: time_backend(backends["invariant"], tokens),
                    "default": lambda: time_backend(backends["default"], tokens),
                    "engine": lambda: time_engine(engine, f"r{rep}-{n}", tokens),
                    "engine_own_weights": lambda: time_engine(own_weights, f"r{rep}-{n}", tokens),
                    "llama_server": lambda: time_llama_server(client, server.base_url, tokens),
                }
                order = list(timers) if rep % 2 == 0 else list(reversed(timers))
                for name in order:
                    time.sleep(PAUSE_S)
                    samples[n][name].append(timers[name]())
            print(
                f"repetition {rep + 1}/{repeats}: "
                + ", ".join(
                    f"{n}: {samples[n]['engine'][-1]:.0f}/{samples[n]['engine_own_weights'][-1]:.0f}/"
                    f"{samples[n]['llama_server'][-1]:.0f} ms"
                    for n in lengths
                )
            )
    for backend in backends.values():
        backend.close()
    engine_prefill_weights = engine.prefill.kind if engine.prefill else "own"
    engine_prefill_choice = engine.prefill_choice.reason
    engine.close()
    own_weights.close()
    report = report_header("local_prefill", smoke=args.smoke)
    report.update(
        {
            "engine_prefill_weights": engine_prefill_weights,
            "engine_prefill_choice": engine_prefill_choice,
            "prefill_copy_file_mib": copy_mib,
            "engine_rss_growth_mib": rss_engine,
            "engine_own_weights_rss_growth_mib": rss_own,
            "prefill_copy_extra_rss_mib": rss_engine - rss_own,
            "llama_cpp_commit": llama_cpp_commit,
            "llama_server_command": " ".join(server.command),
            "threads": THREADS,
            "repeats": repeats,
            "lengths": list(lengths),
            "samples_ms": {str(n): samples[n] for n in lengths},
        }
    )
    for n in lengths:
        report[f"n{n}"] = summarize(samples[n], n)
        report.update({k: v for k, v in report[f"n{n}"].items() if k.startswith("ratio_")})
    report.update(first_token_kl(path))
    write_report(args.json, report, HEADLINE_KEYS + ("first_token_kl_vs_f16_own_weights", "first_token_kl_vs_f16_bf16"))


if __name__ == "__main__":
    main()
