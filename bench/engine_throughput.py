"""Offline throughput of tandem's cloud engine against HF transformers, measured side by side.

    python -m bench.engine_throughput --json bench/results/engine_throughput.json [--quick | --smoke]
    python -m bench.engine_throughput --family qwen3 --json bench/results/engine_throughput_qwen3.json [--quick]

A heterogeneous workload (prompt lengths 16-512, output lengths 8-256, fixed seed,
greedy, EOS ignored so every system produces the same tokens count) runs through:

* tandem: `cloud_engine.LLM.generate` with max_num_seqs 32 (continuous batching,
  chunked prefill, paged KV);
* HF static: transformers `generate` on left-padded batches of 32 in arrival order; a
  batch runs until its longest request is done, and only each request's own output
  tokens count;
* HF sequential: transformers `generate` one request at a time.

All three use the same weights (the embedded SmolLM2 GGUF, dequantized, or --model, or with --family
random weights of that architecture at SmolLM2-135M's dimensions: bench.random_model) in the same
dtype on the same device: tandem's default (bfloat16 on CUDA and on CPUs with native
bf16 such as AVX512-BF16, float32 elsewhere) unless --dtype says otherwise. HF loads the
GGUF in float32 and is then cast with `.to(dtype)`, because asked for bfloat16 directly
transformers 5 keeps a GGUF's weights packed and computes in float32. We report output
tokens/s over each system's wall time.

Warm-up runs on prompts outside the measured set (another seed), and the prefix cache is
emptied before every measured run, so no measured prompt finds its prefix cached. tandem and
HF static run REPEATS times each (median, and the spread as min/max); HF sequential, the
slowest, once (--skip-sequential leaves it out: the families' target is against HF static). --quick: one
run each.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

from bench.machine import machine_info, write_report
from bench.penalty_compare import compare as compare_penalties
from bench.random_model import FAMILIES, RANDOM_WEIGHTS_FILE, describe_model, write_random_model
from cloud_engine.llm import LLM
from sdk.protocol.engine import SamplingParams
from sdk.engine_common.model_files import default_model_path

STATIC_BATCH = 32
REPEATS = 3
WORDS = (
    "the a river city model token light engine paper garden music window story number quiet under over "
    "between people winter summer mountain valley history science market bridge silver orange morning"
).split()


def make_workload(
    num_requests: int, seed: int, tokenize, max_prompt: int, max_output: int
) -> list[tuple[list[int], int]]:
    """(prompt ids, output length): prompt lengths uniform in [16, max_prompt], outputs in [8, max_output]."""
    rng = random.Random(seed)
    work = []
    for _ in range(num_requests):
        text = " ".join(rng.choice(WORDS) for _ in range(max_prompt + 16))
        work.append((tokenize(text)[: rng.randint(16, max_prompt)], rng.randint(8, max_output)))
    return work


def run_tandem(llm: LLM, work, sampling: dict | None = None, min_tokens: bool = False) -> dict:
    fields = sampling or {"temperature": 0.0}
    params = [
        SamplingParams(max_tokens=n, ignore_eos=True, min_tokens=n if min_tokens else 0, **fields) for _, n in work
    ]
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in work], params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    return {"requests": len(work), "output_tokens": tokens, "seconds": seconds, "output_tokens_per_s": tokens / seconds}


def median_run(runs: list[dict]) -> dict:
    """The run with the median tokens/s, with every run's tokens/s beside it."""
    ordered = sorted(runs, key=lambda run: run["output_tokens_per_s"])
    return {**ordered[len(ordered) // 2], "runs_output_tokens_per_s": [run["output_tokens_per_s"] for run in runs]}


def load_hf(model_path: str, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    if os.path.isdir(model_path):
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    elif (cached := hf_llama_from_gguf_cache(model_path)) is not None:
        model = cached.to(device=device, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=torch.float32
        ).to(device=device, dtype=dtype)  # cast after loading: see the module docstring
    model.eval()
    model.generation_config.eos_token_id = None  # ignore EOS, as tandem's run does
    model.generation_config.pad_token_id = 0
    return model


def hf_llama_from_gguf_cache(model_path: str):
    """transformers' LlamaForCausalLM holding the float32 weights tandem's loader cached for this GGUF
    (cloud_engine.loader.gguf_cache; tandem's engine was just built from them), or None. The same
    weights transformers' own GGUF path gives (tests/cloud_engine/test_real_gguf.py compares the two
    loaders), without its ~20 s of re-reading and re-converting the file here."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cloud_engine.loader.gguf_cache import load_cached_checkpoint

    cached = load_cached_checkpoint(model_path)
    if cached is None or cached.config.architecture not in ("llama", "LlamaForCausalLM"):
        return None
    c = cached.config
    config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        rope_scaling=c.rope_scaling,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.attention_bias,
    )
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(dict(cached.weights()), strict=False)
    tied = {"lm_head.weight"} if c.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"cached GGUF weights do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}"
        )
    model.tie_weights()
    return model


@torch.inference_mode()
def run_hf_static(model, work, batch_size: int, device: torch.device) -> dict:
    tokens = 0
    start = time.perf_counter()
    for i in range(0, len(work), batch_size):
        batch = work[i : i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (prompt, _) in enumerate(batch):  # left padding, as decoder-only generation needs
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        longest = max(n for _, n in batch)
        model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=longest,
            min_new_tokens=longest,
            do_sample=False,
        )
        tokens += sum(n for _, n in batch)
    seconds = time.perf_counter() - start
    return {"requests": len(work), "output_tokens": tokens, "seconds": seconds, "output_tokens_per_s": tokens / seconds}


@torch.inference_mode()
def run_hf_sequential(model, work, device: torch.device) -> dict:
    tokens = 0
    start = time.perf_counter()
    for prompt, n in work:
        out = model.generate(
            input_ids=torch.tensor([prompt], device=device), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
        tokens += out.shape[1] - len(prompt)
    seconds = time.perf_counter() - start
    return {"requests": len(work), "output_tokens": tokens, "seconds": seconds, "output_tokens_per_s": tokens / seconds}


def family_model(family: str) -> str:
    """The random-weight model of `family` (bench.random_model), written once into tandem's cache."""
    root = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tandem", "bench-models")
    path = os.path.join(root, f"smollm2-135m-{family}")
    if not os.path.exists(os.path.join(path, RANDOM_WEIGHTS_FILE)):  # written last: the model is whole
        write_random_model("smollm2-135m", path, family=family)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="a smaller workload (under 3 minutes here)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="only checks that the bench works (4 requests, prompts 16-32 tokens, 8 output tokens, one run each): "
        "figures meaningless",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument(
        "--model",
        help="a GGUF or HF directory (default: the embedded SmolLM2 GGUF); "
        "bench.random_model writes one in a real shape where the GGUF cannot go",
    )
    parser.add_argument(
        "--family",
        choices=FAMILIES,
        help="random weights of this architecture at SmolLM2-135M's dimensions instead of --model (bench.random_model)",
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto (tandem's default for the device), float32, bfloat16; both systems use it"
    )
    parser.add_argument(
        "--skip-sequential",
        action="store_true",
        help="leave out HF one request at a time (the slowest baseline; no ratio_vs_hf_sequential)",
    )
    args = parser.parse_args()
    if args.family and args.model:
        parser.error("--family writes its own random-weight model; give --family or --model, not both")

    num_requests, max_prompt, max_output = (16, 256, 64) if args.quick else (64, 512, 256)
    if args.smoke:
        num_requests, max_prompt, max_output = 4, 32, 8
    model_path = args.model or (family_model(args.family) if args.family else default_model_path())
    llm = LLM(
        model_path, device=args.device, dtype=args.dtype, max_num_seqs=32, max_num_batched_tokens=512, kv_cache_gb=1.0
    )
    engine = llm.engine
    work = make_workload(num_requests, seed=0, tokenize=engine.tokenize, max_prompt=max_prompt, max_output=max_output)

    warm_up = make_workload(4, seed=1, tokenize=engine.tokenize, max_prompt=max_prompt, max_output=max_output)
    run_tandem(llm, warm_up)  # not the measured prompts: nothing measured finds its prefix cached
    repeats = 1 if args.quick or args.smoke else REPEATS
    runs = []
    for _ in range(repeats):
        engine.kv_manager.reset_prefix_cache()
        runs.append(run_tandem(llm, work))
        print(f"tandem: {runs[-1]['output_tokens_per_s']:.1f} tok/s", flush=True)
    results = {"tandem": median_run(runs)}
    batch = work[:32]  # one full batch of 32 (max_num_seqs), sampled, penalties on and off
    # `llm` bound as a default: the name is deleted below, once the penalties have run (ruff F821 otherwise)
    penalties = compare_penalties(
        lambda sampling, min_tokens, llm=llm: run_tandem(llm, batch, sampling, min_tokens)["output_tokens_per_s"]
    )
    print(
        f"penalties on/off at B=32: {penalties['ratio_median']:.3f} "
        f"(spread of off runs {penalties['off_run_spread']:.3f})",
        flush=True,
    )
    config = {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 512,
        "block_size": engine.config.block_size,
        "kv_blocks": engine.num_blocks,
        "device": str(engine.device),
        "dtype": str(engine.dtype),
        "torch_threads": torch.get_num_threads(),
        "attention_backend": engine.attention_backend,
    }
    device, dtype = engine.device, engine.dtype
    del llm, engine

    hf = load_hf(model_path, dtype, device)
    run_hf_sequential(hf, warm_up[:1], device)  # warm-up, outside the measured set
    runs = []
    for _ in range(repeats):
        runs.append(run_hf_static(hf, work, min(STATIC_BATCH, len(work)), device))
        print(f"HF static batches of {STATIC_BATCH}: {runs[-1]['output_tokens_per_s']:.1f} tok/s", flush=True)
    results["hf_static"] = median_run(runs)
    if not args.skip_sequential:
        results["hf_sequential"] = run_hf_sequential(hf, work, device)
        print(f"HF one at a time: {results['hf_sequential']['output_tokens_per_s']:.1f} tok/s", flush=True)

    tandem_tps = results["tandem"]["output_tokens_per_s"]
    static_runs = results["hf_static"]["runs_output_tokens_per_s"]
    tandem_runs = results["tandem"]["runs_output_tokens_per_s"]
    report = {
        "benchmark": "engine_throughput",
        "smoke": args.smoke,
        "command": "python -m bench.engine_throughput " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "model": describe_model(model_path),
        "family": args.family or "llama",
        "config": config,
        "workload": f"{num_requests} requests, seed 0, prompts 16-{max_prompt} tokens, outputs 8-{max_output} tokens, "
        "greedy, EOS ignored",
        "baselines": {
            "hf_static": f"transformers generate, left-padded static batches of {STATIC_BATCH} in arrival order, "
            "each batch runs to its longest output",
            "hf_sequential": "not run (--skip-sequential)"
            if args.skip_sequential
            else "transformers generate, one request at a time",
        },
        "results": results,
        "penalties_b32": penalties,
        "penalty_throughput_ratio_cloud_b32": penalties["ratio_median"],
        "ratio_vs_hf_static": tandem_tps / results["hf_static"]["output_tokens_per_s"],
        # The ratio's spread: worst tandem run over best HF run, best over worst.
        "ratio_vs_hf_static_spread": [min(tandem_runs) / max(static_runs), max(tandem_runs) / min(static_runs)],
        "repeats": repeats,
        "targets": {
            # A mixture of experts is reported against HF, not held to the dense families' target.
            "ratio_vs_hf_static": None if args.family == "qwen3-moe" else 3.0,
            "penalty_throughput_ratio_cloud_b32": 0.95,
        },
    }
    headline = ["ratio_vs_hf_static", "ratio_vs_hf_static_spread", "penalty_throughput_ratio_cloud_b32"]
    if not args.skip_sequential:
        report["ratio_vs_hf_sequential"] = tandem_tps / results["hf_sequential"]["output_tokens_per_s"]
        report["targets"]["ratio_vs_hf_sequential"] = 8.0
        headline.insert(2, "ratio_vs_hf_sequential")
    write_report(args.json, report, tuple(headline))


if __name__ == "__main__":
    main()
