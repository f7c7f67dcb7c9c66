"""How many right answers the loop stop would cut, and how many looping ones it ends.

    python -m bench.loop_stop [--quick] --json bench/results/loop_stop.json

The local tier stops an answer whose tail is one unit repeated exactly
(sdk.protocol.repetition.STOP_LOOP), and the cascade escalates one earlier
(ESCALATE_LOOP). A stop that fired on a right answer would cut it short: that count is
the key `loop_stop_cut_correct` (target 0). Each answer below is generated with the stop
off and then replayed token by token through the same tracker the engines use, so one
run measures both rules on identical answers.

Sets (the embedded SmolLM2-135M-Instruct at the local tier's sampling defaults,
temperature 0.2 / top_p 0.9, one seed per request):
- `arithmetic`: confidence.arithmetic_task's generated sums (bench.confidence_auroc's set),
  right = arithmetic_task.is_correct;
- `gsm8k`: the first GSM8K test questions (RouteLLM's copy), right = the last number in
  the reply equals the reference's "#### N";
- `gsm8k_reference`: real right answers written by GPT-4 and Mixtral-8x7B to every GSM8K
  question (RouteLLM's responses table, rows it marks correct), tokenized with SmolLM2's
  vocabulary and replayed: long worked solutions with repeated sentence shapes;
- `mt_bench`: MT-bench's first turns (open writing, coding, reasoning): no right answer
  to check, so only how often each rule fires and the tokens the stop saves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from confidence.arithmetic_task import generate_items, is_correct
from router.eval_tables import DEFAULT_DATA_DIR, ROUTELLM_STRONG, ROUTELLM_WEAK, load_table
from sdk.protocol.engine import GenerationRequest, SamplingParams
from sdk.protocol.repetition import ESCALATE_LOOP, STOP_LOOP, find_loop

FULL = {"arithmetic": 300, "gsm8k": 100, "mt_bench": 80}
QUICK = {"arithmetic": 60, "gsm8k": 24, "mt_bench": 16}
MAX_TOKENS = {"arithmetic": 256, "gsm8k": 384, "mt_bench": 384}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass
class Answer:
    token_ids: list[int]
    correct: bool | None  # None: nothing to check it against
    finish_reason: str | None = None


def _last_number(text: str) -> float | None:
    numbers = _NUMBER.findall(text)
    try:
        return float(numbers[-1].replace(",", "")) if numbers else None
    except ValueError:
        return None


def _gsm8k_right(reply: str, reference: str) -> bool:
    expected = _last_number(reference.rsplit("####", 1)[-1])
    return expected is not None and _last_number(reply) == expected


def _prompts(counts: dict[str, int], data_dir: Path) -> dict[str, list[tuple[list[dict], object]]]:
    """Per set: (chat messages, what checks the reply) in order."""
    arithmetic = [(list(item.messages), item.answer) for item in generate_items(counts["arithmetic"], seed=0)]
    with open(data_dir / "gsm8k_test.jsonl", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()][: counts["gsm8k"]]
    gsm8k = [([{"role": "user", "content": row["question"]}], row["answer"]) for row in rows]
    with open(data_dir / "mt_bench_questions.jsonl", encoding="utf-8") as handle:
        turns = [json.loads(line)["turns"][0] for line in handle if line.strip()][: counts["mt_bench"]]
    mt_bench = [([{"role": "user", "content": turn}], None) for turn in turns]
    return {"arithmetic": arithmetic, "gsm8k": gsm8k, "mt_bench": mt_bench}


async def _generate(engine, name: str, prompts) -> list[Answer]:
    async def one(index: int, messages: list[dict], check) -> Answer:
        params = SamplingParams(max_tokens=MAX_TOKENS[name], seed=index, repetition_stop=False)
        request = GenerationRequest(f"{name}-{index}", engine.apply_chat_template(messages), params)
        events = [event async for event in engine.generate(request)]
        text = "".join(event.text for event in events)
        correct = None if check is None else (is_correct(text, check) if name == "arithmetic" else _gsm8k_right(text, check))
        return Answer([event.token_id for event in events], correct, events[-1].finish_reason)

    return await asyncio.gather(*(one(i, messages, check) for i, (messages, check) in enumerate(prompts)))


def _reference_answers(engine, data_dir: Path) -> list[Answer]:
    answers = []
    for example in load_table(data_dir / "gsm8k_responses.csv"):
        for column, right in ((ROUTELLM_STRONG, example.strong_correct), (ROUTELLM_WEAK, example.weak_correct)):
            text = example.extra.get(f"{column}_response", "")
            if right and text.strip():
                answers.append(Answer(engine.tokenize(text.strip(), add_special=False), True))
    return answers


def summarize(answers: list[Answer]) -> dict:
    """Replay every answer through both rules; what each would have done."""
    stops = [find_loop(answer.token_ids, STOP_LOOP) for answer in answers]
    escalations = [find_loop(answer.token_ids, ESCALATE_LOOP) for answer in answers]
    checked = [a.correct is not None for a in answers]
    return {
        "answers": len(answers),
        "correct": sum(bool(a.correct) for a in answers),
        "checked": sum(checked),
        "output_tokens": sum(len(a.token_ids) for a in answers),
        "hit_max_tokens": sum(a.finish_reason == "length" for a in answers),
        "stopped": sum(s is not None for s in stops),
        "stopped_correct": sum(s is not None and bool(a.correct) for a, s in zip(answers, stops)),
        "stopped_at_token_median": _median([s[0] for s in stops if s is not None]),
        "tokens_saved": sum(len(a.token_ids) - s[0] for a, s in zip(answers, stops) if s is not None),
        "escalated": sum(e is not None for e in escalations),
        "escalated_correct": sum(e is not None and bool(a.correct) for a, e in zip(answers, escalations)),
        "escalated_at_token_median": _median([e[0] for e in escalations if e is not None]),
        "stop_periods": sorted({s[1].period for s in stops if s is not None}),
    }


def _median(values: list[int]) -> float | None:
    return float(statistics.median(values)) if values else None


def main() -> None:
    from bench.machine import report_header, write_report
    from local_runtime.async_engine import AsyncLocalEngine
    from local_runtime.config import LocalEngineConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help=f"fewer prompts: {QUICK}")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    args = parser.parse_args()
    counts, data_dir = (QUICK if args.quick else FULL), Path(args.data_dir)

    engine = AsyncLocalEngine(LocalEngineConfig(max_num_seqs=16, max_model_len=1024, max_waiting=10_000)).start()
    sets: dict[str, dict] = {}
    try:
        engine.wait_ready(180)
        start = time.perf_counter()
        for name, prompts in _prompts(counts, data_dir).items():
            sets[name] = summarize(asyncio.run(_generate(engine, name, prompts)))
            print(name, json.dumps(sets[name]), flush=True)
        sets["gsm8k_reference"] = summarize(_reference_answers(engine, data_dir))
        print("gsm8k_reference", json.dumps(sets["gsm8k_reference"]), flush=True)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()

    report = {
        **report_header("loop_stop"),
        "model": "embedded SmolLM2-135M-Instruct (GGUF Q4_1), local_runtime.AsyncLocalEngine, its sampling defaults",
        "rules": {"stop": vars(STOP_LOOP), "escalate": vars(ESCALATE_LOOP)},
        "workload": {name: {"prompts": counts.get(name), "max_tokens": MAX_TOKENS.get(name)} for name in sets},
        "seconds": seconds,
        "sets": sets,
        "loop_stop_cut_correct": sum(entry["stopped_correct"] for entry in sets.values()),
        "loop_stop_correct_answers_checked": sum(entry["correct"] for entry in sets.values()),
        "loop_stop_stopped": sum(entry["stopped"] for entry in sets.values()),
        "loop_escalate_correct": sum(entry["escalated_correct"] for entry in sets.values()),
        "targets": {"loop_stop_cut_correct": 0},
    }
    write_report(args.json, report, ("loop_stop_cut_correct", "loop_stop_correct_answers_checked", "loop_stop_stopped",
                                     "loop_escalate_correct"))


if __name__ == "__main__":
    main()
