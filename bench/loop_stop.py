"""How many of SmolLM2's own long right answers the loop stop would cut, and how many of its
looping answers it ends.

    python -m bench.loop_stop [--quick | --smoke] --json bench/results/loop_stop.json

The local tier stops an answer whose tail is one unit repeated exactly
(sdk.engine_common.repetition.STOP_LOOP), and the cascade escalates one earlier (ESCALATE_LOOP).
Each answer is generated with the stop off, then replayed token by token through the tracker
the engines use, so one run measures both rules on identical answers.

What the stop could cut: right answers of at least STOP_LOOP.min_span (64) tokens, because the
stop cannot fire before then. Those come from bench.loop_stop_tasks: word problems with the
working shown (one or two per prompt), the alphabet with positions, and spelling; each checked
strictly (the final number, or the exact content). GSM8K answers are checked too (by the last
number), but the 135M model gets about 1 in 100 right. `loop_stop_cut_correct` counts the
stops on these (target 0), over `loop_stop_correct_long_answers`, with a Wilson 95% interval.
Short arithmetic answers (the old `arithmetic` set, 12.5 tokens on average) are gone: the stop
cannot fire on them.

What the stop is for: *looping* answers, judged independently of the rules' parameters: ran to
max_tokens and its last LOOP_TAIL (64) tokens already occurred, verbatim, earlier in the answer
(a loop of any period, however many copies). `loop_stop_cut_looping` counts the stops on those,
over `loop_stop_looping_answers`, and the tokens the stop saves on them (up to each set's cap
only). They come from every set, MT-bench's first turns (open writing, coding, reasoning)
and GSM8K the most. An answer that runs away without repeating itself verbatim ("18. laurel",
"19. laurel", ...) is not looping here: the stop is for exact loops.

All answers: the embedded SmolLM2-135M-Instruct at the local tier's sampling defaults
(temperature 0.2, top_p 0.9), one seed per request. `gsm8k_reference` (secondary, not in the
headline): right answers written by GPT-4 and Mixtral-8x7B to every GSM8K question (RouteLLM's
responses table), tokenized with SmolLM2's vocabulary and replayed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench.loop_stop_tasks import FAMILIES, Task, last_number
from router.eval_tables import DEFAULT_DATA_DIR, ROUTELLM_STRONG, ROUTELLM_WEAK, load_table
from sdk.protocol.engine import GenerationRequest, SamplingParams
from sdk.engine_common.repetition import ESCALATE_LOOP, STOP_LOOP, find_loop

# Prompts per set. A full run: about 90k output tokens, some 15 minutes on 2 cores.
FULL = {"word_problems": 200, "word_problem_pairs": 160, "alphabet": 36, "spelling": 32, "gsm8k": 60, "mt_bench": 60}
QUICK = {name: max(4, count // 4) for name, count in FULL.items()}
SMOKE = {name: 2 for name in FULL}
MAX_TOKENS = {
    "word_problems": 160,
    "word_problem_pairs": 320,
    "alphabet": 320,
    "spelling": 256,
    "gsm8k": 384,
    "mt_bench": 384,
}
SMOKE_MAX_TOKENS = 72  # room for the rules to fire at all (the stop needs 64 tokens)
SMOKE_REFERENCE_ANSWERS = 20
LOOP_TAIL = 64  # tokens at the end of a looping answer that repeat earlier text verbatim
Z95 = 1.959963984540054


@dataclass
class Answer:
    token_ids: list[int]
    correct: bool | None  # None: nothing to check it against
    finish_reason: str | None = None
    right_after_stop: bool | None = None  # a right answer the stop cuts: is the cut text still right?


def wilson(successes: int, trials: int) -> list[float]:
    """Wilson 95% interval of successes/trials; [0, 1] when there are no trials."""
    if trials == 0:
        return [0.0, 1.0]
    p = successes / trials
    centre = (p + Z95**2 / (2 * trials)) / (1 + Z95**2 / trials)
    half = Z95 * math.sqrt(p * (1 - p) / trials + Z95**2 / (4 * trials**2)) / (1 + Z95**2 / trials)
    # Exact at the ends (rounding would leave 1.7e-18 where the bound is 0).
    return [0.0 if successes == 0 else centre - half, 1.0 if successes == trials else centre + half]


def loop_period(answer: Answer, tail: int = LOOP_TAIL) -> int | None:
    """For an answer that ran to max_tokens with its last `tail` tokens a verbatim copy of an
    earlier stretch: how far back the nearest copy starts (the loop's period); else None."""
    ids = answer.token_ids
    if answer.finish_reason != "length" or len(ids) <= tail:
        return None
    end = ids[-tail:]
    for start in range(len(ids) - tail - 1, -1, -1):
        if ids[start : start + tail] == end:
            return len(ids) - tail - start
    return None


def is_looping(answer: Answer) -> bool:
    return loop_period(answer) is not None


def _gsm8k_task(row: dict) -> Task:
    expected = last_number(row["answer"].rsplit("####", 1)[-1])
    return Task(
        ({"role": "user", "content": row["question"]},),
        lambda reply: expected is not None and last_number(reply) == expected,
    )


def _tasks(counts: dict[str, int], data_dir: Path) -> dict[str, list[Task]]:
    """Per set, the prompts in order (each set fixed: seeded generators, the datasets' first rows)."""
    sets = {name: FAMILIES[name](counts[name]) for name in FAMILIES}
    with open(data_dir / "gsm8k_test.jsonl", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()][: counts["gsm8k"]]
    sets["gsm8k"] = [_gsm8k_task(row) for row in rows]
    with open(data_dir / "mt_bench_questions.jsonl", encoding="utf-8") as handle:
        turns = [json.loads(line)["turns"][0] for line in handle if line.strip()][: counts["mt_bench"]]
    sets["mt_bench"] = [Task(({"role": "user", "content": turn},), None) for turn in turns]
    return sets


async def _generate(engine, name: str, tasks: list[Task], max_tokens: int) -> tuple[list[Answer], int]:
    """Every task's answer, and how many requests failed (their answers are left out)."""

    async def one(index: int, task: Task) -> Answer:
        params = SamplingParams(max_tokens=max_tokens, seed=index, repetition_stop=False)
        request = GenerationRequest(f"{name}-{index}", engine.apply_chat_template(list(task.messages)), params)
        events = [event async for event in engine.generate(request)]
        correct = None if task.check is None else task.check("".join(event.text for event in events))
        answer = Answer([event.token_id for event in events], correct, events[-1].finish_reason)
        stop = find_loop(answer.token_ids, STOP_LOOP)
        if correct and stop is not None:
            answer.right_after_stop = task.check("".join(event.text for event in events[: stop[0]]))
        return answer

    results = await asyncio.gather(*(one(i, task) for i, task in enumerate(tasks)), return_exceptions=True)
    for error in (r for r in results if isinstance(r, BaseException)):
        print(f"{name}: a request failed: {error!r}", flush=True)
    answers = [r for r in results if isinstance(r, Answer)]
    return answers, len(results) - len(answers)


def _reference_answers(engine, data_dir: Path, limit: int | None) -> list[Answer]:
    answers = []
    for example in load_table(data_dir / "gsm8k_responses.csv"):
        for column, right in ((ROUTELLM_STRONG, example.strong_correct), (ROUTELLM_WEAK, example.weak_correct)):
            text = example.extra.get(f"{column}_response", "")
            if right and text.strip():
                answers.append(Answer(engine.tokenize(text.strip(), add_special=False), True))
            if limit is not None and len(answers) >= limit:
                return answers
    return answers


def summarize(answers: list[Answer]) -> dict:
    """Replay every answer through both rules; what each would have done, to the right long
    answers (`correct_long`) and to the looping ones (`looping`)."""
    stops = [find_loop(a.token_ids, STOP_LOOP) for a in answers]
    escalations = [find_loop(a.token_ids, ESCALATE_LOOP) for a in answers]
    long_right = [bool(a.correct) and len(a.token_ids) >= STOP_LOOP.min_span for a in answers]
    periods = [loop_period(a) for a in answers]
    looping = [p is not None for p in periods]

    def count(flags, fired) -> int:
        return sum(flag and f is not None for flag, f in zip(flags, fired))

    n_right, n_looping = sum(long_right), sum(looping)
    cut_right, cut_looping = count(long_right, stops), count(looping, stops)
    escalated_right, escalated_looping = count(long_right, escalations), count(looping, escalations)
    return {
        "answers": len(answers),
        "checked": sum(a.correct is not None for a in answers),
        "correct": sum(bool(a.correct) for a in answers),
        "correct_long": n_right,
        "correct_long_distinct": len({tuple(a.token_ids) for a, r in zip(answers, long_right) if r}),
        "correct_long_tokens_median": _median([len(a.token_ids) for a, r in zip(answers, long_right) if r]),
        "output_tokens": sum(len(a.token_ids) for a in answers),
        "hit_max_tokens": sum(a.finish_reason == "length" for a in answers),
        "looping": n_looping,
        "stopped": sum(s is not None for s in stops),
        "stopped_correct": cut_right,
        "stopped_correct_ci95": wilson(cut_right, n_right),
        "stopped_correct_still_right": sum(bool(a.right_after_stop) for a in answers),
        "stopped_looping": cut_looping,
        "stopped_looping_ci95": wilson(cut_looping, n_looping),
        "stopped_at_token_median": _median([s[0] for s in stops if s is not None]),
        "tokens_saved": sum(len(a.token_ids) - s[0] for a, s in zip(answers, stops) if s is not None),
        "tokens_saved_looping": sum(
            len(a.token_ids) - s[0] for a, s, loop in zip(answers, stops, looping) if loop and s is not None
        ),
        "escalated": sum(e is not None for e in escalations),
        "escalated_correct": escalated_right,
        "escalated_correct_ci95": wilson(escalated_right, n_right),
        "escalated_looping": escalated_looping,
        "escalated_looping_ci95": wilson(escalated_looping, n_looping),
        "escalated_at_token_median": _median([e[0] for e in escalations if e is not None]),
        "stop_periods": sorted({s[1].period for s in stops if s is not None}),
        # Why the stop left a looping answer alone: a unit over MAX_PERIOD (64) tokens, or too few copies.
        "looping_not_stopped_periods": sorted(p for p, s in zip(periods, stops) if p is not None and s is None),
    }


def _median(values: list[int]) -> float | None:
    return float(statistics.median(values)) if values else None


def headline(sets: dict[str, dict]) -> dict:
    """The headline figures over SmolLM2's own answers (every set but `gsm8k_reference`)."""
    own = [entry for name, entry in sets.items() if name != "gsm8k_reference"]

    def total(key: str) -> int:
        return sum(entry[key] for entry in own)

    right, looping = total("correct_long"), total("looping")
    return {
        "loop_stop_correct_long_answers": right,
        "loop_stop_cut_correct": total("stopped_correct"),
        "loop_stop_cut_correct_ci95": wilson(total("stopped_correct"), right),
        "loop_stop_looping_answers": looping,
        "loop_stop_cut_looping": total("stopped_looping"),
        "loop_stop_cut_looping_ci95": wilson(total("stopped_looping"), looping),
        "loop_stop_tokens_saved_looping": total("tokens_saved_looping"),
        "loop_stop_stopped": total("stopped"),
        "loop_escalate_correct": total("escalated_correct"),
        "loop_escalate_correct_ci95": wilson(total("escalated_correct"), right),
        "loop_escalate_looping": total("escalated_looping"),
        "loop_escalate_looping_ci95": wilson(total("escalated_looping"), looping),
    }


HEADLINE_KEYS = (
    "loop_stop_cut_correct",
    "loop_stop_correct_long_answers",
    "loop_stop_cut_correct_ci95",
    "loop_stop_looping_answers",
    "loop_stop_cut_looping",
    "loop_stop_cut_looping_ci95",
    "loop_escalate_correct",
    "loop_escalate_looping",
)


def main() -> None:
    from bench.machine import report_header, write_report
    from local_runtime.async_engine import AsyncLocalEngine
    from local_runtime.config import LocalEngineConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"fewer prompts: {QUICK}")
    size.add_argument(
        "--smoke",
        action="store_true",
        help=f"checks the bench runs: {SMOKE} prompts, "
        f"{SMOKE_MAX_TOKENS} tokens, {SMOKE_REFERENCE_ANSWERS} reference answers; figures mean nothing",
    )
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    # The answers (and so every figure) do not depend on it; on a host whose cores other work is
    # using, llama.cpp's threads wait on each other and one thread is far faster.
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    args = parser.parse_args()
    counts = SMOKE if args.smoke else QUICK if args.quick else FULL
    max_tokens = {name: SMOKE_MAX_TOKENS if args.smoke else cap for name, cap in MAX_TOKENS.items()}
    data_dir = Path(args.data_dir)

    engine = AsyncLocalEngine(
        LocalEngineConfig(max_num_seqs=16, max_model_len=1024, max_waiting=10_000, n_threads=args.threads)
    ).start()
    sets: dict[str, dict] = {}
    failed = 0
    try:
        engine.wait_ready(180)
        start = time.perf_counter()
        for name, tasks in _tasks(counts, data_dir).items():
            answers, failures = asyncio.run(_generate(engine, name, tasks, max_tokens[name]))
            sets[name], failed = summarize(answers), failed + failures
            print(name, json.dumps(sets[name]), flush=True)
        reference = _reference_answers(engine, data_dir, SMOKE_REFERENCE_ANSWERS if args.smoke else None)
        sets["gsm8k_reference"] = summarize(reference)
        print("gsm8k_reference", json.dumps(sets["gsm8k_reference"]), flush=True)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()

    report = {
        **report_header("loop_stop", smoke=args.smoke),
        "model": "embedded SmolLM2-135M-Instruct (GGUF Q4_1), local_runtime.AsyncLocalEngine, its sampling defaults",
        "rules": {"stop": vars(STOP_LOOP), "escalate": vars(ESCALATE_LOOP)},
        "looping": f"ran to max_tokens and its last {LOOP_TAIL} tokens occurred verbatim earlier in the answer",
        "workload": {name: {"prompts": counts.get(name), "max_tokens": max_tokens.get(name)} for name in sets},
        "seconds": seconds,
        "failed_requests": failed,
        "sets": sets,
        **headline(sets),
        "targets": {"loop_stop_cut_correct": 0},
    }
    write_report(args.json, report, HEADLINE_KEYS)


if __name__ == "__main__":
    main()
