"""A fleet of devices drafting, one cloud verifying (issue 68): how many more tokens one cloud machine
serves when every answer is drafted by its own device.

    python -m bench.draft_fleet --json bench/results/draft_fleet.json [--quick | --smoke]

bench.spec_cascade measures the pair on one machine, its drafters sharing one device core, so its c4/c8
figures measure that core. Here each answer has a simulated device of its own that drafts exactly what
the device's model would (bench.draft_fleet_replay: recorded on the real local engine, SmolLM2-135M Q4_1,
before any timing, then replayed at a device speed by the production DeviceDrafter), so the fleet costs
this machine almost nothing and the cloud is what is measured.

Setup: `tandem cloud serve` (the same 135M model in its serving dtype on this CPU (bf16 where the CPU has
it natively, else float32), compiled, one torch thread) on core 0; the fleet (asyncio clients and their
devices in this process) and bench.delay_proxy's RTT_MS round trip on the others. Both modes (alone:
Generate; drafted: GenerateWithDrafts) go through the proxy and run on one server with the same settings,
the server's draft caps at their defaults; the step token budget is raised to STEP_TOKEN_BUDGET for both
(32 answers verifying 16-token drafts need 544 rows; the default is 512). Prompts: the bench's chat
prompts and MT-Bench first turns, greedy, at most MAX_TOKENS tokens (EOS ends an answer), every prompt
once per run, c at a time; repetitions interleaved, the modes' order alternating.

Device speeds: `here` (the default) is the local engine's decode speed at one sequence on this machine
(`device_ms_per_token`, measured before timing); `phone` is PHONE_MS_PER_TOKEN (100 tokens a second:
Cactus reports LFM2.5-350M INT8 decoding at 100 tokens/s on one core of a Galaxy S25 Ultra and 42 on a
Pixel 6a; SmolLM2-135M Q4 reads about a fifth of those bytes a token, so a mid-range phone drafts it at
least this fast). Both tiers run the same model here, so acceptance is near its ceiling; the `smaller`
run cuts the device's agreement with the cloud to SMALLER_DEVICE_AGREEMENT per token (the per-token
acceptance Leviathan et al. 2023 report for small drafters spans about 0.5 to 0.8; 0.6 sits low in it).
The targets apply to the same-model run at the default speed.

Figures (median over repetitions, [min, max] in `*_spread`):
- `cloud_tokens_per_cpu_s_ratio_c8`, `_c16`, `_c32`: the cloud process's output tokens per CPU second
  (user + system), drafted / alone (targets: >= 1.8 at c16, >= 1.5 at c32);
- `output_tps_ratio_c16`, `_c32`: output tokens per second of wall time, drafted / alone;
- `tpot_p50_ratio_c16`, `_c32`: the median answer's time per output token, drafted / alone (target
  <= 0.7 at c32);
- `acceptance_rate` (accepted / verified draft tokens) and `tokens_per_round` (tokens a verifying step
  emitted) at c16; `left_recording_fraction`: drafted answers whose cloud tokens left the recording;
- `greedy_identical_fraction`: prompts whose drafted answer is token for token the cloud's own, the
  cloud in float32 (its own server and recording), every prompt at c = 8 (target 1.0);
- the same ratios with `phone_` and `smaller_` in front, at c16 and c32; `fleet_cpu_s_per_token`: this
  process's CPU per drafted output token (what replaying costs this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter

import psutil

from bench.delay_proxy import DelayProxy
from bench.draft_fleet_replay import Recording, ReplayDevice, device_ms_per_token, record_device_runs
from bench.machine import report_header, write_report
from bench.repetitions import median_and_spread
from bench.spec_cascade import CHAT_PROMPTS, RETRIED, answer, cloud_server, draft_totals, median_tpot, placement
from bench.spec_decode import open_conversations
from sdk.cascade.device_drafts import DEFAULT_DRAFT_TOKENS, DeviceDrafter
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.cloud_backend import CloudError
from sdk.protocol.engine import SamplingParams

CONCURRENCY = (8, 16, 32)
EXTRA_CONCURRENCY = (16, 32)  # the phone and smaller-device runs
MAX_TOKENS = 128
RTT_MS = 20
STEP_TOKEN_BUDGET = 640  # [cloud] max_num_batched_tokens, both modes (default 512)
PHONE_MS_PER_TOKEN = 10.0
SMALLER_DEVICE_AGREEMENT = 0.6
IDENTITY_CONCURRENCY = 8
RECORD_CONCURRENCY = 8
SIZES = {  # repetitions, MT-Bench first turns, max tokens
    "full": (5, 24, MAX_TOKENS),
    "quick": (2, 24, MAX_TOKENS),
    "smoke": (1, 2, 12),
}
HEADLINE = (
    "cloud_tokens_per_cpu_s_ratio_c8",
    "cloud_tokens_per_cpu_s_ratio_c16",
    "cloud_tokens_per_cpu_s_ratio_c32",
    "output_tps_ratio_c16",
    "output_tps_ratio_c32",
    "tpot_p50_ratio_c16",
    "tpot_p50_ratio_c32",
    "acceptance_rate",
    "tokens_per_round",
    "left_recording_fraction",
    "greedy_identical_fraction",
    "phone_cloud_tokens_per_cpu_s_ratio_c32",
    "smaller_cloud_tokens_per_cpu_s_ratio_c32",
)


async def run_set(mode: str, target: str, device, prompts, params, concurrency: int, cloud_pid: int) -> dict:
    """Every prompt answered in `mode`, `concurrency` at a time, each drafted answer by a device of its own
    (`device`: a ReplayDevice; one object, no shared state between answers): the answers, wall time, and the
    cloud's and this process's CPU seconds."""
    drafter = DeviceDrafter(device, DEFAULT_DRAFT_TOKENS) if device is not None else None
    gate = asyncio.Semaphore(concurrency)
    async with CloudClient(target) as client:

        async def one(prompt_ids):
            async with gate:
                for attempt in range(3):
                    try:
                        return await answer(mode, client, drafter, prompt_ids, params)
                    except CloudError as error:  # answered again; the failed attempt's cloud CPU stays counted
                        RETRIED.append({"mode": mode, "attempt": attempt, "error": str(error)})
                raise RuntimeError(f"{mode}: three attempts failed")

        await one(prompts[0])  # the connection is up and warm before the clock starts
        cloud, own = psutil.Process(cloud_pid), psutil.Process()
        cloud_before, own_before, started = cloud.cpu_times(), own.cpu_times(), time.monotonic()
        answers = await asyncio.gather(*(one(p) for p in prompts))
        wall_s = time.monotonic() - started
        cloud_after, own_after = cloud.cpu_times(), own.cpu_times()
    return {
        "answers": answers,
        "wall_s": wall_s,
        "cloud_cpu_s": (cloud_after.user - cloud_before.user) + (cloud_after.system - cloud_before.system),
        "fleet_cpu_s": (own_after.user - own_before.user) + (own_after.system - own_before.system),
        "tokens": sum(len(a["tokens"]) for a in answers),
    }


async def record(target: str, local, prompts: list[list[int]], params: SamplingParams) -> list[Recording]:
    """The cloud's greedy answers (RECORD_CONCURRENCY at a time), then the device's runs along each, eight
    prompts at a time on the local engine."""
    gate = asyncio.Semaphore(RECORD_CONCURRENCY)
    async with CloudClient(target) as client:

        async def cloud_answer(prompt_ids):
            async with gate:
                return Recording(
                    list(prompt_ids), [event.token_id async for event in client.generate(prompt_ids, params)]
                )

        recordings = list(await asyncio.gather(*(cloud_answer(p) for p in prompts)))
    gate = asyncio.Semaphore(8)

    async def runs(recording):
        async with gate:
            await record_device_runs(local, recording)

    await asyncio.gather(*(runs(r) for r in recordings))
    return recordings


def _ratio(drafted: float, alone: float) -> float:
    return drafted / alone if alone else float("nan")


def _tokens_per_cpu_s(run: dict) -> float:
    return run["tokens"] / run["cloud_cpu_s"]


def _left(run: dict, recordings: dict[tuple, Recording], prompts: list[list[int]]) -> list[bool]:
    return [a["tokens"] != recordings[tuple(p)].answer for a, p in zip(run["answers"], prompts)]


async def identity_pass(target: str, recordings, prompts, params, cloud_pid: int, ms_per_token: float) -> dict:
    """float32: every prompt alone and drafted at c = IDENTITY_CONCURRENCY; the fraction answered identically."""
    device = ReplayDevice(recordings, ms_per_token)
    alone = await run_set("alone", target, None, prompts, params, IDENTITY_CONCURRENCY, cloud_pid)
    drafted = await run_set("drafted", target, device, prompts, params, IDENTITY_CONCURRENCY, cloud_pid)
    same = [a["tokens"] == d["tokens"] for a, d in zip(alone["answers"], drafted["answers"])]
    return {
        "identical_fraction": sum(same) / len(same),
        "num_prompts": len(same),
        "acceptance_rate": draft_totals(drafted)["accepted_tokens"] / max(draft_totals(drafted)["verified_tokens"], 1),
    }


async def timed_repetitions(proxy, recordings, prompts, params, cloud_pid, repetitions, speeds) -> list:
    """Per repetition: each concurrency's alone run and its drafted runs (the default device, and at the
    extra concurrencies the phone and the smaller device), the modes' order alternating."""
    target = f"127.0.0.1:{proxy.port}"
    devices = {
        "default": ReplayDevice(recordings, speeds["default"]),
        "phone": ReplayDevice(recordings, speeds["phone"]),
        "smaller": ReplayDevice(recordings, speeds["default"], agreement=SMALLER_DEVICE_AGREEMENT),
    }
    reps = []
    for repetition in range(repetitions):
        rep = {}
        for c in CONCURRENCY:
            names = ["default"] + (["phone", "smaller"] if c in EXTRA_CONCURRENCY else [])
            order = ["alone", *names] if repetition % 2 == 0 else [*names, "alone"]
            runs = {}
            for name in order:
                device = None if name == "alone" else devices[name]
                runs[name] = await run_set(
                    "alone" if device is None else "drafted", target, device, prompts, params, c, cloud_pid
                )
            rep[c] = runs
            print(f"rep {repetition} c {c}: " + _summary(runs), flush=True)
        reps.append(rep)
    return reps


def _summary(runs: dict) -> str:
    alone = runs["alone"]
    parts = [f"alone {_tokens_per_cpu_s(alone):.0f} tok/cpu-s, tpot {median_tpot(alone) * 1000:.1f} ms"]
    for name, run in runs.items():
        if name != "alone":
            totals = draft_totals(run)
            parts.append(
                f"{name} {_tokens_per_cpu_s(run):.0f} tok/cpu-s, tpot {median_tpot(run) * 1000:.1f} ms, "
                f"accepted {totals['accepted_tokens']}/{totals['verified_tokens']}"
            )
    return "; ".join(parts)


def figures(reps: list, identity: dict, recordings, prompts) -> dict:
    out: dict = {"greedy_identical_fraction": identity["identical_fraction"]}

    def put(key: str, values: list[float]) -> None:
        out[key], out[f"{key}_spread"] = median_and_spread(values)

    for prefix, name, counts in (
        ("", "default", CONCURRENCY),
        ("phone_", "phone", EXTRA_CONCURRENCY),
        ("smaller_", "smaller", EXTRA_CONCURRENCY),
    ):
        for c in counts:
            pairs = [(rep[c][name], rep[c]["alone"]) for rep in reps]
            put(
                f"{prefix}cloud_tokens_per_cpu_s_ratio_c{c}",
                [_ratio(_tokens_per_cpu_s(d), _tokens_per_cpu_s(a)) for d, a in pairs],
            )
            put(
                f"{prefix}output_tps_ratio_c{c}",
                [_ratio(d["tokens"] / d["wall_s"], a["tokens"] / a["wall_s"]) for d, a in pairs],
            )
            put(f"{prefix}tpot_p50_ratio_c{c}", [_ratio(median_tpot(d), median_tpot(a)) for d, a in pairs])
            totals = [draft_totals(d) for d, _ in pairs]
            put(f"{prefix}acceptance_rate_c{c}", [t["accepted_tokens"] / max(t["verified_tokens"], 1) for t in totals])
    at16 = [draft_totals(rep[16]["default"]) for rep in reps]
    put("acceptance_rate", [t["accepted_tokens"] / max(t["verified_tokens"], 1) for t in at16])
    put("tokens_per_round", [(t["accepted_tokens"] + t["rounds"]) / max(t["rounds"], 1) for t in at16])
    recorded = {tuple(r.prompt_ids): r for r in recordings}
    left = [flag for rep in reps for c in CONCURRENCY for flag in _left(rep[c]["default"], recorded, prompts)]
    out["left_recording_fraction"] = sum(left) / len(left)
    drafted = [rep[c]["default"] for rep in reps for c in CONCURRENCY]
    out["fleet_cpu_s_per_token"] = sum(r["fleet_cpu_s"] for r in drafted) / sum(r["tokens"] for r in drafted)
    out["stopped"] = dict(sum((Counter(draft_totals(r)["stopped"]) for r in drafted), Counter()))
    out["targets"] = {
        "cloud_tokens_per_cpu_s_ratio_c16 >= 1.8": out["cloud_tokens_per_cpu_s_ratio_c16_spread"][0] >= 1.8,
        "cloud_tokens_per_cpu_s_ratio_c32 >= 1.5": out["cloud_tokens_per_cpu_s_ratio_c32_spread"][0] >= 1.5,
        "tpot_p50_ratio_c32 <= 0.7": out["tpot_p50_ratio_c32_spread"][1] <= 0.7,
        "greedy_identical_fraction == 1.0": out["greedy_identical_fraction"] == 1.0,
    }
    return out


def per_run_detail(reps: list) -> list:
    return [
        {
            f"c{c}": {
                name: {
                    "output_tokens": run["tokens"],
                    "wall_s": round(run["wall_s"], 3),
                    "cloud_cpu_s": round(run["cloud_cpu_s"], 3),
                    "fleet_cpu_s": round(run["fleet_cpu_s"], 3),
                    "tpot_ms_median": round(median_tpot(run) * 1000, 2),
                }
                | ({} if name == "alone" else draft_totals(run))
                for name, run in runs.items()
            }
            for c, runs in rep.items()
        }
        for rep in reps
    ]


def serving_dtype() -> str:
    """The cloud engine's own dtype on this CPU (`--dtype auto`): bf16 where the CPU computes it natively,
    float32 elsewhere (bf16 emulated on an AVX2-only CPU makes every step compute-bound, which no serving
    default does)."""
    import torch

    from cloud_engine.device import resolve_dtype

    return str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")


async def run_bench(size: str) -> dict:
    from local_runtime.async_engine import AsyncLocalEngine
    from local_runtime.config import LocalEngineConfig

    repetitions, num_free, max_tokens = SIZES[size]
    smoke = size == "smoke"
    prefix, own_cores, where = placement()
    if own_cores is not None:
        os.sched_setaffinity(0, own_cores)  # before the device's threads start: they inherit it
    local = AsyncLocalEngine(
        LocalEngineConfig(max_model_len=1024, kv_cache_tokens=16384, max_num_seqs=8, n_threads=1)
    ).start()
    local.wait_ready(300)
    chat = CHAT_PROMPTS[:2] if smoke else CHAT_PROMPTS
    conversations = [[{"role": "user", "content": text}] for text in chat] + open_conversations(num_free)
    prompts = [local.apply_chat_template(conversation) for conversation in conversations]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    timed_dtype = serving_dtype()
    options = ("--compile", "on", "--max-num-batched-tokens", str(STEP_TOKEN_BUDGET))
    servers = {"max_num_seqs": max(CONCURRENCY), "kv_cache_gb": 0.5, "options": options}
    try:
        here_ms = await device_ms_per_token(local, prompts[0])
        speeds = {"default": here_ms, "phone": PHONE_MS_PER_TOKEN}
        print(f"device: {here_ms:.1f} ms a token here at one sequence", flush=True)
        server, grpc_port = cloud_server("float32", prefix, **servers)
        try:
            recordings = await record(f"127.0.0.1:{grpc_port}", local, prompts, params)
            identity = await identity_pass(
                f"127.0.0.1:{grpc_port}", recordings, prompts, params, server.process.pid, here_ms
            )
            print(f"float32: {identity}", flush=True)
            if timed_dtype != "float32":  # the timed runs on a server of their dtype, recorded again
                server.stop()
                server, grpc_port = cloud_server(timed_dtype, prefix, **servers)
                recordings = await record(f"127.0.0.1:{grpc_port}", local, prompts, params)
            local.shutdown()  # nothing runs on the device while the cloud is timed
            local = None
            proxy = await DelayProxy(grpc_port, one_way_s=RTT_MS / 2000).start()
            try:
                reps = await timed_repetitions(
                    proxy, recordings, prompts, params, server.process.pid, repetitions, speeds
                )
            finally:
                await proxy.close()
        finally:
            server.stop()
    finally:
        if local is not None:
            local.shutdown()
    report = figures(reps, identity, recordings, prompts)
    report["device_ms_per_token"] = {"default": here_ms, "phone": PHONE_MS_PER_TOKEN}
    report["device_ms_per_token_note"] = "default: the local engine's speed measured here, one sequence, one thread"
    report["retried_after_errors"] = RETRIED
    report["identity_pass"] = identity
    report["recording"] = {
        "answers": len(recordings),
        "answer_tokens": sum(len(r.answer) for r in recordings),
        "device_runs": sum(len(r.runs) for r in recordings),
    }
    report["runs"] = per_run_detail(reps)
    report["setup"] = {
        "placement": where,
        "cloud": f"SmolLM2-135M-Instruct, tandem cloud serve, {timed_dtype} (float32 for the identity pass), "
        "compile on, "
        f"1 thread, max_num_seqs {max(CONCURRENCY)}, max_num_batched_tokens {STEP_TOKEN_BUDGET} in both modes",
        "device": "SmolLM2-135M-Instruct Q4_1 on tandem's local engine, recorded, then replayed per answer",
        "rtt_ms": RTT_MS,
        "draft_tokens": f"DeviceDrafter's default {DEFAULT_DRAFT_TOKENS}, adapted per answer (at most 16)",
        "max_tokens": max_tokens,
        "prompts": {"chat": len(chat), "free_form_mt_bench": num_free},
        "concurrency": list(CONCURRENCY),
        "repetitions": repetitions,
        "smaller_device_agreement": SMALLER_DEVICE_AGREEMENT,
        "dtype": timed_dtype,
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="two repetitions")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes: checks the bench works; figures mean nothing")
    args = parser.parse_args()
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    report = report_header("draft_fleet", smoke=args.smoke) | asyncio.run(run_bench(size))
    write_report(args.json, report, HEADLINE)


if __name__ == "__main__":
    main()
