"""Structured outputs and tool calls on both tiers, constrained against unconstrained (issue 22).

    python -m bench.structured [--quick] --json bench/results/structured.json

The cases (bench/structured_cases.py, written for this bench): 22 requests with a JSON Schema
(extraction, classification, forms) and 12 tool questions with one obvious tool among 2-4.
Both tiers serve the embedded SmolLM2-135M-Instruct: the local engine (llama.cpp, Q4_1) and the
cloud engine (PyTorch, the same GGUF dequantized), each with its own sampler and grammar mask.
Sampling is each tier's default for the model (temperature 0.2, top_p 0.9) with a seed per case.

- Validity: the request (with the schema written into it, as an app would without constrained
  decoding) is answered constrained (response_format json_schema) and free; an answer counts when
  it ends on its own and its JSON (free: the first {...} in the text) fits the schema;
  finish_reason "length" is a failure. max_tokens 256, generous for every case.
- Tools: tool_choice "required" (the grammar makes every call valid: does it pick the right
  tool?) and "auto" (does the model choose to call at all?), rendered as tandem renders them.
- Throughput: constrained vs free on the same requests, output tokens per second, side by side,
  3 repetitions alternating (median and spread): local with 8 clients in a closed loop (each
  sends its next request when one ends), cloud one batch of 32. Every answer runs exactly 96
  tokens (the constrained ones under a list schema longer than that, the free ones with
  ignore_eos), so the two differ only in the per-token cost of the mask.
- Grammar compile: building a matcher for each case's schema or tool grammar and computing its first
  mask (llguidance builds the lexer there), on the local tier's vocabulary, the vocabulary's
  one-time preparation excluded; also on schemas no case was written around (bench.json_schemas'
  one-feature set and structured_cases.OTHER_SCHEMAS). p99 is nearest-rank: with ~30 compiles, the slowest.

Keys: schema_validity_constrained (target 1.0), schema_validity_free, tool_name_accuracy (local,
required), tool_call_rate_auto_local, invalid_structure_rate_local, throughput_ratio_constrained_c8_local (>= 0.90),
throughput_ratio_constrained_b32_cloud (>= 0.90), grammar_compile_p50_ms (<= 50), grammar_compile_p99_ms,
grammar_compile_other_schemas_p50_ms / _p99_ms; the budget sweep (bench.structured_budget):
validity_under_budget_local / _cloud (target 1.0 where a valid answer fits), closing_search_p50_us_local /
_p99_us_local, step_cost_ratio_closing_on_vs_off_local; per-tier detail under "local" and "cloud",
with every failing case's text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from bench.machine import report_header, write_report
from bench.structured_answers import fits, schema_prompt
from bench.structured_budget import BUDGETS, budget_sweep
from bench.structured_cases import LOOSE_JSON_PROMPTS, SCHEMA_CASES, TOOL_CASES
from bench.structured_compile import grammar_compile_figures
from sdk.protocol.engine import GenerationRequest, SamplingParams, StructuredOutput
from sdk.protocol.tool_calls import ToolAnswer, render_tool_messages
from sdk.protocol.tool_formats import LIST, ToolFunction, ToolRequest

MAX_TOKENS = 256
THROUGHPUT_MAX_TOKENS = 96


def tool_request(tools: list[dict], required: bool) -> ToolRequest:
    functions = tuple(
        ToolFunction(t["function"]["name"], t["function"]["description"], t["function"]["parameters"]) for t in tools
    )
    return ToolRequest(functions, required=required)


def tool_job(question: str, tools: list[dict], required: bool) -> tuple[list[dict], StructuredOutput]:
    request = tool_request(tools, required)
    return render_tool_messages([{"role": "user", "content": question}], request, LIST), LIST.grammar(request)


# -- the tiers: (messages, structured, seed, max_tokens) jobs in, (text, finish_reason, tokens) out ----


class LocalTier:
    def __init__(self):
        from local_runtime.async_engine import AsyncLocalEngine
        from local_runtime.config import LocalEngineConfig

        self.engine = AsyncLocalEngine(
            LocalEngineConfig(max_num_seqs=8, kv_cache_tokens=8192, max_model_len=1024)
        ).start()
        self.engine.wait_ready(300)
        self.loop = asyncio.new_event_loop()

    def run(
        self, jobs: list[tuple], concurrency: int = 8, ignore_eos: bool = False
    ) -> tuple[list[tuple[str, str | None, int]], float]:
        """Every job's answer, in order, with `concurrency` clients in a closed loop; and the wall time."""
        results: list = [None] * len(jobs)
        queue = list(enumerate(jobs))

        async def client() -> None:
            while queue:
                i, (messages, structured, seed, max_tokens, *closes) = queue.pop(0)
                params = SamplingParams(
                    max_tokens=max_tokens,
                    seed=seed,
                    structured=structured,
                    ignore_eos=ignore_eos,
                    close_within_max_tokens=closes[0] if closes else None,
                )
                prompt = self.engine.apply_chat_template(messages)
                events = [
                    e
                    async for e in self.engine.generate(
                        GenerationRequest(f"bench-{i}-{time.monotonic_ns()}", prompt, params)
                    )
                ]
                results[i] = ("".join(e.text for e in events), events[-1].finish_reason, len(events))

        async def all_clients() -> None:
            await asyncio.gather(*(client() for _ in range(concurrency)))

        start = time.perf_counter()
        self.loop.run_until_complete(all_clients())
        return results, time.perf_counter() - start

    def grammar(self):
        return self.engine.engine.grammar

    def close(self) -> None:
        self.engine.shutdown()
        self.loop.close()


class CloudTier:
    def __init__(self):
        from cloud_engine.llm import LLM

        self.llm = LLM(None, max_num_seqs=32, kv_cache_gb=1.0, max_model_len=1024)
        self.dtype = str(self.llm.engine.dtype).removeprefix("torch.")

    def run(
        self, jobs: list[tuple], concurrency: int = 32, ignore_eos: bool = False
    ) -> tuple[list[tuple[str, str | None, int]], float]:
        prompts = [self.llm.engine.apply_chat_template(job[0]) for job in jobs]
        params = [
            SamplingParams(
                max_tokens=m,
                seed=seed,
                structured=s,
                ignore_eos=ignore_eos,
                close_within_max_tokens=closes[0] if closes else None,
            )
            for _, s, seed, m, *closes in jobs
        ]
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params)
        return [(o.text, o.finish_reason, len(o.token_ids)) for o in outputs], time.perf_counter() - start

    def grammar(self):
        return self.llm.engine.grammar

    def close(self) -> None:
        pass


# -- measurements ----------------------------------------------------------------------------------


def validity(tier, cases, max_tokens: int = MAX_TOKENS) -> dict:
    jobs, order = [], []
    for i, (name, request, schema) in enumerate(cases):
        for free in (False, True):
            structured = None if free else StructuredOutput("json_schema", json.dumps(schema))
            jobs.append((schema_prompt(request, schema), structured, i, max_tokens))
            order.append((name, schema, free))
    answers, _ = tier.run(jobs)
    out = {"constrained": [], "free": []}
    for (name, schema, free), (text, finish, _) in zip(order, answers):
        out["free" if free else "constrained"].append(
            {"case": name, "ok": fits(text, finish, schema, free), "finish_reason": finish, "text": text}
        )
    return {
        "schema_validity_constrained": sum(r["ok"] for r in out["constrained"]) / len(cases),
        "schema_validity_free": sum(r["ok"] for r in out["free"]) / len(cases),
        "length_cut_constrained": sum(r["finish_reason"] == "length" for r in out["constrained"]),
        "failures": {mode: [r for r in rows if not r["ok"]] for mode, rows in out.items()},
    }


def tools(tier, cases, max_tokens: int = MAX_TOKENS) -> dict:
    jobs = [
        (*tool_job(question, tool_set, required), i, max_tokens)
        for required in (True, False)
        for i, (question, tool_set, _) in enumerate(cases)
    ]
    answers, _ = tier.run(jobs)
    picked = {True: [], False: []}
    for (required, (question, _, expected)), (text, _, _) in zip(
        [(r, c) for r in (True, False) for c in cases], answers
    ):
        _, calls = ToolAnswer.read(LIST, required, text)
        picked[required].append(
            {
                "question": question,
                "expected": expected,
                "called": calls[0].name if calls else None,
                "arguments": calls[0].arguments if calls else None,
                "text": None if calls else text,
            }
        )
    return {
        "tool_name_accuracy": sum(p["called"] == p["expected"] for p in picked[True]) / len(cases),
        "tool_call_rate_auto": sum(p["called"] is not None for p in picked[False]) / len(cases),
        "tool_name_accuracy_auto": sum(p["called"] == p["expected"] for p in picked[False]) / len(cases),
        "required": picked[True],
        "auto": picked[False],
    }


# The throughput runs' constraint: a list longer than max_tokens can hold (strings, numbers,
# booleans, nested objects), so every constrained answer runs its full length under the mask, as
# the free ones do with ignore_eos: the same tokens per request, and the cost per token compares.
LONG_LIST = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 100,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "count": {"type": "integer"},
                    "ok": {"type": "boolean"},
                },
                "required": ["name", "count", "ok"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}


def throughput(
    tier, cases, num_requests: int, concurrency: int, repetitions: int, max_tokens: int = THROUGHPUT_MAX_TOKENS
) -> dict:
    """Constrained vs free output tokens/s on the same requests and lengths, alternating, `repetitions` each."""
    chosen = [cases[i % len(cases)] for i in range(num_requests)]
    constraint = StructuredOutput("json_schema", json.dumps(LONG_LIST))
    # Warm-up on other prompts, not measured: the first constrained run pays one-time costs (cause not
    # isolated; without this, one cloud run measured 0.76x in its first repetition and 1.03x after).
    tier.run(
        [([{"role": "user", "content": "Warm up."}], constraint if i % 2 else None, i, 16) for i in range(4)],
        concurrency,
    )
    runs: dict[str, list[float]] = {"constrained": [], "free": []}
    for repetition in range(repetitions):
        for mode in ("constrained", "free"):
            # Prompts distinct per run from their first words: no run finds another's prompts in a prefix cache.
            jobs = [
                (
                    schema_prompt(f"Run {repetition} {mode}. List some items for: {request}", LONG_LIST),
                    constraint if mode == "constrained" else None,
                    i,
                    max_tokens,
                )
                for i, (_, request, _) in enumerate(chosen)
            ]
            answers, seconds = tier.run(jobs, concurrency, ignore_eos=mode == "free")
            assert all(n == max_tokens for _, _, n in answers), "every answer runs its full length"
            runs[mode].append(sum(n for _, _, n in answers) / seconds)
    median = {mode: statistics.median(values) for mode, values in runs.items()}
    return {
        "output_tokens_per_s": runs,
        "median": median,
        "spread": {mode: (max(v) - min(v)) / statistics.median(v) for mode, v in runs.items()},
        "ratio": median["constrained"] / median["free"],
        "requests": num_requests,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
    }


def bench_constraints(schema_cases, tool_cases) -> list:
    """The bench's own constraints: each case's schema, and each tool set's grammar (required and auto)."""
    constraints = [StructuredOutput("json_schema", json.dumps(schema)) for _, _, schema in schema_cases]
    return constraints + [
        LIST.grammar(tool_request(tool_set, required))
        for tool_set in {id(t): t for _, t, _ in tool_cases}.values()
        for required in (True, False)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a third of the cases, one repetition")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="two schema cases, two tool cases, 4 short throughput requests a tier, once: checks the bench works",
    )
    parser.add_argument("--json", default="bench/results/structured.json")
    parser.add_argument("--skip-cloud", action="store_true", help="the local tier only")
    args = parser.parse_args()
    step = 11 if args.smoke else 3 if args.quick else 1
    schema_cases, tool_cases = SCHEMA_CASES[::step], TOOL_CASES[::step]
    repetitions = 1 if args.quick or args.smoke else 3
    local_requests, cloud_requests = (4, 4) if args.smoke else (8 if args.quick else 24, 32)
    max_tokens = 16 if args.smoke else THROUGHPUT_MAX_TOKENS
    answer_tokens = 48 if args.smoke else MAX_TOKENS  # validity and tools
    prompts = LOOSE_JSON_PROMPTS[:2] if args.smoke else LOOSE_JSON_PROMPTS[::2] if args.quick else LOOSE_JSON_PROMPTS
    budgets = (24,) if args.smoke else BUDGETS  # the budget sweep

    report = report_header("structured", smoke=args.smoke)
    local = LocalTier()
    try:
        compile_figures = grammar_compile_figures(local.grammar(), bench_constraints(schema_cases, tool_cases))
        report["local"] = {
            **validity(local, schema_cases, answer_tokens),
            **tools(local, tool_cases, answer_tokens),
            "throughput_c8": throughput(local, schema_cases, local_requests, 8, repetitions, max_tokens),
            "budget_sweep": budget_sweep(local, local.grammar(), schema_cases, prompts, budgets),
        }
    finally:
        local.close()
    if not args.skip_cloud:
        cloud = CloudTier()
        report["machine"]["cloud_dtype"] = cloud.dtype
        report["cloud"] = {
            **validity(cloud, schema_cases, answer_tokens),
            **tools(cloud, tool_cases, answer_tokens),
            "throughput_b32": throughput(cloud, schema_cases, cloud_requests, 32, repetitions, max_tokens),
            "budget_sweep": budget_sweep(cloud, cloud.grammar(), schema_cases, prompts, budgets),
        }
    both = [report[tier] for tier in ("local", "cloud") if tier in report]
    report.update(
        {
            "schema_validity_constrained": min(t["schema_validity_constrained"] for t in both),
            "schema_validity_free": max(t["schema_validity_free"] for t in both),
            "tool_name_accuracy": report["local"]["tool_name_accuracy"],
            "tool_call_rate_auto_local": report["local"]["tool_call_rate_auto"],
            "throughput_ratio_constrained_c8_local": report["local"]["throughput_c8"]["ratio"],
            "throughput_ratio_constrained_b32_cloud": report["cloud"]["throughput_b32"]["ratio"]
            if "cloud" in report
            else None,
            # How often the cascade's invalid_structure escalation would fire on constrained local answers
            # (cut off by max_tokens: the only way a constrained answer can fail to parse).
            "invalid_structure_rate_local": report["local"]["length_cut_constrained"] / len(schema_cases),
            **compile_figures,
            "num_schema_cases": len(schema_cases),
            "num_tool_cases": len(tool_cases),
            "num_loose_json_prompts": len(prompts),
            # The budget sweep (bench.structured_budget): target 1.0 where a valid answer fits.
            "validity_under_budget_local": report["local"]["budget_sweep"]["validity_under_budget"],
            "validity_under_budget_cloud": report["cloud"]["budget_sweep"]["validity_under_budget"]
            if "cloud" in report
            else None,
            "step_cost_ratio_closing_on_vs_off_local": report["local"]["budget_sweep"][
                "step_cost_ratio_closing_on_vs_off"
            ],
            "closing_search_p50_us_local": report["local"]["budget_sweep"]["closing_search_us"]["p50"],
            "closing_search_p99_us_local": report["local"]["budget_sweep"]["closing_search_us"]["p99"],
        }
    )
    headline = [
        "schema_validity_constrained",
        "schema_validity_free",
        "tool_name_accuracy",
        "tool_call_rate_auto_local",
        "throughput_ratio_constrained_c8_local",
        "throughput_ratio_constrained_b32_cloud",
        "grammar_compile_p50_ms",
        "grammar_compile_p99_ms",
        "grammar_compile_other_schemas_p99_ms",
        "validity_under_budget_local",
        "validity_under_budget_cloud",
        "closing_search_p50_us_local",
        "closing_search_p99_us_local",
    ]
    if args.skip_cloud:
        headline.remove("throughput_ratio_constrained_b32_cloud")
        headline.remove("validity_under_budget_cloud")
    write_report(args.json, report, tuple(headline))


if __name__ == "__main__":
    main()
