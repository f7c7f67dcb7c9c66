"""The cost of the samplers' penalties, measured side by side: the same sampled workload with every
penalty, the logit bias and the min_tokens mask on, and with them off, alternating, `repeats` times each.

Used by bench.local_throughput (c=8: key `penalty_throughput_ratio_local_c8`) and
bench.engine_throughput (B=32: `penalty_throughput_ratio_cloud_b32`). The ratio is on/off output
tokens/s per repetition; its median is the headline, and `difference_exceeds_spread` says whether
|1 - median| is larger than the spread of the off runs themselves (run-to-run noise)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

# Both sides sample (the penalties apply before the pick); ignore_eos keeps
# the token counts equal, and min_tokens = max_tokens keeps the end-token mask on at every step.
SAMPLING_OFF = {"temperature": 0.8, "top_p": 0.95, "seed": 0}
# min_p is left out: it is a truncation, not a penalty, and it makes sampling cheaper (fewer candidates).
SAMPLING_ON = SAMPLING_OFF | {
    "repetition_penalty": 1.1,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "logit_bias": {0: -1.0, 1: 0.5},
}


def compare(run: Callable[[dict, bool], float], repeats: int = 3) -> dict:
    """`run(sampling fields, min_tokens_on)` -> output tokens/s; off and on alternate."""
    off, on = [], []
    for _ in range(repeats):
        off.append(run(SAMPLING_OFF, False))
        on.append(run(SAMPLING_ON, True))
    ratios = [b / a for a, b in zip(off, on)]
    median = statistics.median(ratios)
    spread = (max(off) - min(off)) / statistics.median(off)
    return {
        "off_output_tokens_per_s": off,
        "on_output_tokens_per_s": on,
        "ratios": ratios,
        "ratio_median": median,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "off_run_spread": spread,
        "difference_exceeds_spread": abs(1.0 - median) > spread,
        "sampling_off": SAMPLING_OFF,
        "sampling_on": {**SAMPLING_ON, "min_tokens": "max_tokens"},
        "target": 0.95,
    }
