"""The documentation's headline figures, rendered from the JSON in bench/results/ (never typed by hand).

    python -m bench.readme_figures            # print the table
    python -m bench.readme_figures --write    # replace the block between the markers, in the page that holds them
    python -m bench.readme_figures --relink structured   # after a re-run: its links' numbers from the JSON

Each row names a benchmark's JSON and a key in it; the table gives the value, the target
when there is one, the commit it was measured at and the machine. The pages are README.md and
docs/*.md (`pages()`); the block sits in one of them (`block_page()`: docs/benchmarks.md since issue
53). tests/bench/test_readme_figures.py fails when the block differs from what the JSON renders
(a re-run bench without a page update, or a hand edit), and when a figure a page quotes in its
prose (a `LINK` into the JSON, from wherever the page is) differs from its JSON; each finding
names its page.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
README = REPO / "README.md"
DOCS = REPO / "docs"
START = "<!-- readme_figures: start (python -m bench.readme_figures --write) -->"
END = "<!-- readme_figures: end -->"


@dataclass(frozen=True)
class Figure:
    label: str
    bench: str  # bench/results/<bench>.json
    key: str  # dotted path into the JSON
    digits: int = 2
    target: str = ""  # as the issue states it, e.g. "<= 1.2"; "> SE" / ">= -SE": against the figure's standard error
    spread: str = ""  # key of the [min, max] over repeated runs: a bound inside it is not "met"
    se: str = ""  # key of the figure's standard error, for an "SE" target (a paired difference beyond its spread)

    def value(self) -> float:
        return lookup(load(self.bench), self.key)

    def bound(self) -> float:
        bound = self.target.split()[1]
        if bound in ("SE", "-SE"):
            return lookup(load(self.bench), self.se) * (-1 if bound == "-SE" else 1) + 0.0  # + 0.0: no "-0.000"
        return float(bound)

    def shown_target(self) -> str:
        if self.target.split()[1:] in (["SE"], ["-SE"]):
            return f"{self.target} ({self.bound():.{self.digits}f})"
        return self.target

    def met(self) -> str:
        if not self.target:
            return ""
        op = self.target.split()[0]
        value, bound = self.value(), self.bound()
        ok = {"<=": value <= bound, ">=": value >= bound, ">": value > bound, "<": value < bound}[op]
        if not ok:
            return "**not met**"
        if self.spread:
            low, high = load(self.bench)[self.spread]
            if low <= bound <= high:
                return f"**within the spread** ({low:.{self.digits}f}–{high:.{self.digits}f})"
        return "met"


FIGURES = (
    Figure(
        "cloud engine vs HF static batches (tok/s ratio, median of 3)",
        "engine_throughput",
        "ratio_vs_hf_static",
        2,
        ">= 3.0",
        "ratio_vs_hf_static_spread",
    ),
    Figure("cloud engine vs HF one at a time", "engine_throughput", "ratio_vs_hf_sequential", 2, ">= 8.0"),
    Figure("cloud penalties on/off at B=32", "engine_throughput", "penalty_throughput_ratio_cloud_b32", 3, ">= 0.95"),
    Figure(
        "cloud serve vs vLLM's fastest right-answering mode, TPOT p50 at 32 clients (compiled steps; median of 5)",
        "serve_cloud_vs_vllm",
        "ratio_tpot_p50_vs_vllm_c32",
        2,
        "<= 0.7",
        "ratio_tpot_p50_vs_vllm_c32_spread",
    ),
    Figure(
        "  the same, output tok/s",
        "serve_cloud_vs_vllm",
        "ratio_output_tps_vs_vllm_c32",
        2,
        ">= 1.0",
        "ratio_output_tps_vs_vllm_c32_spread",
    ),
    Figure(
        "  cloud decode step at 32 sequences, compiled / eager (compile = on)",
        "serve_cloud_vs_vllm",
        "compiled_step_ratio_c32",
        2,
        "< 1.0",
        "compiled_step_ratio_c32_spread",
    ),
    Figure(
        "cloud serve vs vLLM on Gemma-3-270M's weights, output tok/s at 32 clients (quick, median of 2)",
        "serve_cloud_vs_vllm_gemma3_270m_quick",
        "ratio_output_tps_vs_vllm_c32",
        2,
        ">= 1.0",
        "ratio_output_tps_vs_vllm_c32_spread",
    ),
    Figure(
        "chunked prefill ITL p90, paced / unchunked (median of 3)",
        "chunked_prefill",
        "itl_p90_ratio",
        2,
        "<= 2.0",
        "itl_p90_ratio_spread",
    ),
    Figure(
        "chunked prefill ITL p99, paced / unchunked (median of 3)",
        "chunked_prefill",
        "itl_p99_ratio",
        3,
        "<= 0.5",
        "itl_p99_ratio_spread",
    ),
    Figure(
        "chunked prefill long-prompt TTFT, paced / unchunked (median of 3)",
        "chunked_prefill",
        "long_prompt_ttft_ratio",
        2,
        "<= 1.5",
        "long_prompt_ttft_ratio_spread",
    ),
    Figure("prefix cache TTFT, cached / uncached", "prefix_cache", "ttft_ratio", 3, "<= 0.3"),
    Figure(
        "stream ITL p99 under max-size bodies / without",
        "tokenize_stall",
        "itl_p99_ratio_under_max_bodies",
        2,
        "<= 1.2",
        "itl_p99_ratio_spread",
    ),
    Figure(
        "streamed auto TTFT p50, hold window / held until decided",
        "stream_hold",
        "ttft_ratio_window_vs_until_decided",
        2,
    ),
    Figure(
        "structured output throughput, constrained / free (local, 8 clients)",
        "structured",
        "throughput_ratio_constrained_c8_local",
        3,
    ),
    Figure("README example, slowest of 5 (s)", "first_contact", "readme_example_s", 2, "<= 10"),
    Figure(
        "prompt router APGR, locked MMLU subjects, zero-shot (pooled, +-1 SE over subjects)",
        "router_learning",
        "apgr_locked_test_zero_shot",
        3,
    ),
    Figure(
        "  the same minus prompt length, same rows (paired; target: beat it by more than its SE)",
        "router_learning",
        "apgr_locked_test_zero_shot_minus_length",
        3,
        "> SE",
        se="apgr_locked_test_zero_shot_minus_length_se",
    ),
    Figure(
        "  the shape recipe CV picked, minus prompt length, same rows (paired)",
        "router_learning",
        "apgr_locked_test_selected_recipe_minus_length",
        3,
    ),
    Figure(
        "prompt router APGR, locked subjects, 10% of each labelled in a table, on the other 90%",
        "router_learning",
        "apgr_locked_test_at_10pct_labels",
        3,
        ">= 0.60",
        "apgr_locked_test_at_10pct_labels_interval",
    ),
    Figure(
        "  the same, labels from traffic (exact_match judge, background retrain)",
        "router_learning",
        "apgr_locked_test_at_10pct_labels_traffic",
        3,
        ">= 0.60",
        "apgr_locked_test_at_10pct_labels_traffic_interval",
    ),
    Figure(
        "    the same minus prompt length, same rows (paired; target: not worse beyond its SE)",
        "router_learning",
        "apgr_locked_test_at_10pct_labels_traffic_minus_length",
        3,
        ">= -SE",
        se="apgr_locked_test_at_10pct_labels_traffic_minus_length_se",
    ),
    Figure(
        "prompt router's default cut: cloud share before generation, design tables (locked: in prose)",
        "router_learning",
        "prompt_router_default_cloud_share_design",
        3,
    ),
    Figure(
        "embeddings texts/s at batch 32, tandem / sentence-transformers (median of 3)",
        "embeddings",
        "ratio_vs_sentence_transformers_b32",
        2,
        ">= 1.0",
        "ratio_vs_sentence_transformers_b32_spread",
    ),
    Figure(
        "embeddings: smallest cosine to sentence-transformers' fp32 vector",
        "embeddings",
        "cosine_min_vs_fp32",
        4,
        ">= 0.98",
    ),
    Figure(
        "cloud serve, books in PostgreSQL / in the process, tok/s at 32 clients (median of 3)",
        "state_db",
        "ratio_output_tps_state_db_vs_local",
        2,
        ">= 0.95",
        "ratio_output_tps_state_db_vs_local_spread",
    ),
    Figure("  the same, PostgreSQL's CPU per request (ms)", "state_db", "cpu_ms_per_request.state_db.postgres.0", 2),
    Figure(
        "device drafts, cloud verifies: cloud CPU per token, drafted / alone, 1 client (median of 5)",
        "spec_cascade",
        "cloud_cpu_s_per_token_ratio_c1",
        2,
        "<= 0.6",
        "cloud_cpu_s_per_token_ratio_c1_spread",
    ),
    Figure(
        "  the same, 4 clients (their drafts on one device core here)",
        "spec_cascade",
        "cloud_cpu_s_per_token_ratio_c4",
        2,
        "<= 0.6",
        "cloud_cpu_s_per_token_ratio_c4_spread",
    ),
    Figure(
        "  time per output token, drafted / alone, 1 client, no added round trip",
        "spec_cascade",
        "tpot_ratio_vs_cloud_rtt0_c1",
        2,
        "<= 1.0",
        "tpot_ratio_vs_cloud_rtt0_c1_spread",
    ),
    Figure(
        "  the same, 20 ms round trip",
        "spec_cascade",
        "tpot_ratio_vs_cloud_rtt20_c1",
        2,
        "<= 1.0",
        "tpot_ratio_vs_cloud_rtt20_c1_spread",
    ),
    Figure(
        "  greedy answers identical to the cloud's own (cloud in float32)",
        "spec_cascade",
        "greedy_identical_fraction",
        2,
        ">= 1.0",
    ),
    Figure(
        "a fleet drafting, one cloud verifying: cloud output tokens per CPU second, drafted / alone, 16 devices",
        "draft_fleet",
        "cloud_tokens_per_cpu_s_ratio_c16",
        2,
        ">= 1.8",
        "cloud_tokens_per_cpu_s_ratio_c16_spread",
    ),
    Figure(
        "  the same, 32 devices",
        "draft_fleet",
        "cloud_tokens_per_cpu_s_ratio_c32",
        2,
        ">= 1.5",
        "cloud_tokens_per_cpu_s_ratio_c32_spread",
    ),
    Figure(
        "  time per output token p50, drafted / alone, 32 devices",
        "draft_fleet",
        "tpot_p50_ratio_c32",
        2,
        "<= 0.7",
        "tpot_p50_ratio_c32_spread",
    ),
    Figure(
        "  the same 32 devices drafting at a phone's speed: cloud output tokens per CPU second",
        "draft_fleet",
        "phone_cloud_tokens_per_cpu_s_ratio_c32",
        2,
        "",
        "phone_cloud_tokens_per_cpu_s_ratio_c32_spread",
    ),
    Figure(
        "  a smaller device model (agreement cut), 32 devices: cloud output tokens per CPU second",
        "draft_fleet",
        "smaller_cloud_tokens_per_cpu_s_ratio_c32",
        2,
        "",
        "smaller_cloud_tokens_per_cpu_s_ratio_c32_spread",
    ),
    Figure(
        "  greedy answers identical to the cloud's own (cloud in float32, 8 devices)",
        "draft_fleet",
        "greedy_identical_fraction",
        2,
        ">= 1.0",
    ),
    Figure("device KV in q8_0: mean KL against f16 (nats)", "kv_precision", "local_q8_0_mean_kl_nats", 4, "<= 0.01"),
    Figure("  tokens per GiB, q8_0 / f16", "kv_precision", "local_q8_0_tokens_per_gib_vs_f16", 2),
    Figure(
        "  confidence probe's held-out AUROC, q8_0 minus f16",
        "kv_precision",
        "local_shipped_probe_auroc_q8_0_minus_f16",
        3,
        ">= -SE",
        se="local_shipped_probe_auroc_q8_0_minus_f16_se",
    ),
    Figure(
        "  tandem serve vs llama-server, both with q8_0 KV: output tok/s at 8 clients (quick, median of 2)",
        "serve_local_vs_llama_server_q8_0_quick",
        "ratio_output_tps_vs_llama_server_c8",
        2,
        ">= 1.0",
        "ratio_output_tps_vs_llama_server_c8_spread",
    ),
    Figure(
        "  the same, TTFT p50",
        "serve_local_vs_llama_server_q8_0_quick",
        "ratio_ttft_p50_vs_llama_server_c8",
        2,
        "<= 1.0",
        "ratio_ttft_p50_vs_llama_server_c8_spread",
    ),
    Figure(
        "cloud decode step, 32 sequences: bytes read / (step time x read rate), float32 (quick)",
        "compiled_step_roofline_quick",
        "roofline_fraction_c32",
        2,
        ">= 0.8",
    ),
    Figure(
        "  the same with the KV cache in int8 (quick)",
        "compiled_step_roofline_int8_quick",
        "roofline_fraction_c32",
        2,
        ">= 0.8",
    ),
    Figure(
        "  the same with weights and KV cache in int8 (quick)",
        "compiled_step_int8_weights_kv_quick",
        "roofline_fraction_c32",
        2,
        ">= 0.8",
    ),
    Figure(
        "  the same on a native-bf16 CPU (AVX512-BF16), bf16 engine, weights and KV in int8 (quick)",
        "compiled_step_bf16_int8_weights_kv_quick",
        "roofline_fraction_c32",
        2,
        ">= 0.8",
    ),
    Figure(
        "    why: its flops / (step time x this machine's matmul rate, same run)",
        "compiled_step_bf16_int8_weights_kv_quick",
        "arithmetic_fraction_c32",
        2,
    ),
    Figure(
        "    the most any kernel could reach here (its arithmetic at that rate outlasts reading its bytes)",
        "compiled_step_bf16_int8_weights_kv_quick",
        "roofline_fraction_ceiling_c32",
        2,
    ),
    Figure(
        "cloud serve, weights and KV in int8, vs vLLM's fastest right-answering mode (bf16, native), TPOT p50 at 32 "
        "clients (median of 5)",
        "serve_cloud_vs_vllm_int8",
        "ratio_tpot_p50_vs_vllm_c32",
        2,
        "<= 0.7",
        "ratio_tpot_p50_vs_vllm_c32_spread",
    ),
    Figure(
        "  the same, output tok/s",
        "serve_cloud_vs_vllm_int8",
        "ratio_output_tps_vs_vllm_c32",
        2,
        ">= 1.4",
        "ratio_output_tps_vs_vllm_c32_spread",
    ),
    Figure(
        "  the same, tandem on one torch thread (two is the default), output tok/s",
        "serve_cloud_vs_vllm_int8",
        "tandem_t1_ratio_output_tps_vs_vllm_c32",
        2,
    ),
    Figure("cloud KV in int8: mean KL against float32 (nats)", "kv_precision", "cloud_int8_mean_kl_nats", 4, "<= 0.01"),
    Figure(
        "  tokens per GiB, int8 (scales included) / bf16",
        "kv_precision",
        "cloud_int8_tokens_per_gib_vs_bf16",
        2,
        ">= 1.9",
    ),
    Figure(
        "cloud weights and KV in int8: mean KL against float32 (nats)",
        "kv_precision_cloud_weights",
        "cloud_int8_weights_kv_mean_kl_nats",
        4,
        "<= 0.03",
    ),
    Figure(
        "  a decode step's matmuls with int8 weights / float32 F.linear, 1 sequence",
        "int8_linear",
        "step_r1_tandem_int8_vs_dense",
        2,
    ),
    Figure(
        "  the same, 32 sequences",
        "int8_linear",
        "step_r32_tandem_int8_vs_dense",
        2,
    ),
    Figure(
        "  bf16 activations on AVX512-BF16: int8 weights / bf16 F.linear, 32 sequences",
        "int8_linear_avx512bf16",
        "step_r32_tandem_int8_bf16_vs_dense_bf16",
        2,
    ),
)

# A figure in a page's prose is a link to the JSON it came from, so a reader can open it and a
# test can check it: [3.05](bench/results/engine_throughput.json#ratio_vs_hf_static) in README,
# [3.05](../bench/results/engine_throughput.json#ratio_vs_hf_static) in docs/. The key is a dotted
# path (list indices are numbers) with an optional scale, `*100` or `*1000` (a fraction written as
# a percentage, seconds as milliseconds); the written digits set the precision compared.
LINK = re.compile(
    r"\[(?P<number>[-+]?\d[\d,]*(?:\.\d+)?)\]\((?P<up>(?:\.\./)*)bench/results/(?P<bench>[\w.-]+)\.json"
    r"#(?P<key>[\w.-]+)(?:\*(?P<scale>\d+))?\)"
)
# A number in prose, with the unit of measure that may follow it. It reads as a measured
# figure when it is a decimal or has a unit; settings and inputs are written in code spans
# (`temperature 0.2`), which are not figures so long as they read as code (`BARE_SPAN`).
_DECIMAL = r"[-+]?\d[\d,]*(?:\.\d+)?"
_UNIT = r"\s?(?:x|%|ms|s|µs|tok/s|MiB|MB|GB|GFLOPS)(?![\w/])"
NUMBER = re.compile(rf"(?<![\w.#/-])(?P<number>{_DECIMAL})(?P<unit>{_UNIT})?")
# A code span is code when it says what its number is: a name, a flag or a key beside it
# (`--drain-grace-s 30`, `temperature 0.2`, `k=8`), a comparison (`target <= 1.2`, `≥ 0.95`),
# an expression or a version (`0.5 + gain / 2`, `1.9.1`). A span that holds nothing but a
# number or a range and its unit (`22 s`, `150-170 s`, `0.75`) says nothing of the kind: it is
# a figure typed in code font, and is checked like one in prose (a decimal or a unit makes it
# a figure; a bare integer such as a default `30` is not, in prose either).
BARE_SPAN = re.compile(rf"\s*(?P<number>{_DECIMAL}(?:\s?[-–]\s?{_DECIMAL})?)(?P<unit>{_UNIT})?\s*")
CODE_SPAN = re.compile(r"`([^`]*)`")


def pages() -> list[Path]:
    """The pages whose figures are checked: README.md, then docs/*.md."""
    return [README, *sorted(DOCS.glob("*.md"))]


def page_name(page: Path) -> str:
    return page.resolve().relative_to(REPO).as_posix()


def block_page() -> Path:
    """The one page that holds the rendered table between START and END."""
    holding = [page for page in pages() if START in page.read_text()]
    if len(holding) != 1:
        names = ", ".join(page_name(page) for page in holding) or "none"
        raise SystemExit(f"the block between {START!r} and {END!r} must be in exactly one page, found in: {names}")
    return holding[0]


def load(bench: str) -> dict:
    return json.loads((RESULTS / f"{bench}.json").read_text())


def lookup(data: dict, key: str) -> float:
    """The number at a dotted path; a key that itself holds dots ("0.5", "quantile_0.05") is found too."""
    return float(_walk(data, key.split(".")))


def _walk(data, parts: list[str]):
    if not parts:
        return data
    if isinstance(data, list):
        return _walk(data[int(parts[0])], parts[1:])
    for n in range(len(parts), 0, -1):  # the longest key first
        name = ".".join(parts[:n])
        if name in data:
            return _walk(data[name], parts[n:])
    raise KeyError(".".join(parts))


def machine(bench: str) -> str:
    m = load(bench).get("machine", {})
    return f"{m.get('cores', '?')} cores, {m.get('cpu_model', '?')}"


def render() -> str:
    rows = ["| figure | value | target | | measured at | machine | bench |", "|---|---|---|---|---|---|---|"]
    for fig in FIGURES:
        commit = load(fig.bench).get("machine", {}).get("git_commit") or "?"
        value = f"{fig.value():.{fig.digits}f}"
        rows.append(
            f"| {fig.label} | **{value}** | {fig.shown_target()} | {fig.met()} | {commit} | "
            f"{machine(fig.bench)} | `{fig.bench}`: `{fig.key}` |"
        )
    return "\n".join([START, *rows, END])


def readme_block(text: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0:
        raise SystemExit(f"no block between {START!r} and {END!r}")
    return text[start : end + len(END)]


def _formatted_like(written: str, value: float) -> str:
    """`value` with the digits, sign and thousands separator `written` has."""
    digits = len(written.split(".")[1]) if "." in written else 0
    return f"{value:{'+' if written[0] in '+-' else ''}{',' if ',' in written else ''}.{digits}f}"


def relink(text: str, benches: set[str]) -> str:
    """A page with every link into `benches`' JSONs showing the JSON's number again (after a re-run);
    the prose around the links is the author's to re-read."""

    def fresh(match: re.Match) -> str:
        if match["bench"] not in benches:
            return match[0]
        value = lookup(load(match["bench"]), match["key"]) * int(match["scale"] or 1)
        return match[0].replace(f"[{match['number']}]", f"[{_formatted_like(match['number'], value)}]", 1)

    return LINK.sub(fresh, text)


def link_mismatches(text: str, page: Path | None = None) -> list[str]:
    """Every figure a page links to a JSON that differs from it (or whose key is missing); with the
    page, also every link whose path does not reach bench/results/ from where the page is."""
    wrong = []
    where = page_name(page) if page else "the text"
    for match in LINK.finditer(text):
        written, bench, key, scale = match["number"], match["bench"], match["key"], int(match["scale"] or 1)
        target = f"{match['up']}bench/results/{bench}.json"
        if page and (page.parent / target).resolve() != (RESULTS / f"{bench}.json").resolve():
            wrong.append(f"{match[0]}: {where} links {target}, not the JSON in bench/results/")
            continue
        try:
            value = lookup(load(bench), key) * scale
        except (OSError, KeyError, IndexError, TypeError, ValueError) as error:
            wrong.append(f"{match[0]}: {type(error).__name__}: {error}")
            continue
        expected = _formatted_like(written, value)
        if written != expected:
            wrong.append(f"{bench}.{key}: {where} says {written}, the JSON {expected}")
    return wrong


def unlinked_figures(text: str) -> list[str]:
    """Figure-like numbers in a page that are neither linked to their JSON nor in the rendered table.
    Code (fenced blocks, and spans that read as code: commands, settings, targets, keys) is not a
    figure; a span that is only a number and its unit is (`BARE_SPAN`)."""
    if START in text:
        text = text.replace(readme_block(text), "")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = LINK.sub("", text)
    found = []
    for span in CODE_SPAN.finditer(text):
        bare = BARE_SPAN.fullmatch(span[1])
        if bare and (bare["unit"] or "." in bare["number"]):
            start, end = text.rfind("\n", 0, span.start()) + 1, text.find("\n", span.end())
            line = text[start : end if end >= 0 else len(text)]
            found.append(
                f"{span[0]!r} (a figure in a code span: link it, or name the setting) in: {line.strip()[:100]}"
            )
    text = CODE_SPAN.sub("", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # other links' targets
    for line in text.splitlines():
        found += [
            f"{m[0].strip()!r} in: {line.strip()[:100]}"
            for m in NUMBER.finditer(line)
            if m["unit"] or "." in m["number"]
        ]
    return found


def all_link_mismatches() -> list[str]:
    """`link_mismatches` over every page."""
    return [line for page in pages() for line in link_mismatches(page.read_text(), page)]


def all_unlinked_figures() -> list[str]:
    """`unlinked_figures` over every page, each finding prefixed with its page."""
    return [f"{page_name(page)}: {line}" for page in pages() for line in unlinked_figures(page.read_text())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace the block, in the page that holds it")
    parser.add_argument(
        "--relink",
        action="append",
        default=[],
        metavar="BENCH",
        help="after re-running BENCH: rewrite the numbers of every page's links into its JSON (repeatable)",
    )
    args = parser.parse_args()
    if args.relink:
        changed = []
        for page in pages():
            text = page.read_text()
            fresh = relink(text, set(args.relink))
            if fresh != text:
                page.write_text(fresh)
                changed.append(page_name(page))
        print(
            f"relinked {', '.join(args.relink)} in {', '.join(changed) or 'no page'}; "
            f"now disagreeing: {all_link_mismatches() or 'none'}"
        )
        return
    table = render()
    if not args.write:
        print(table)
        return
    page = block_page()
    text = page.read_text()
    page.write_text(text.replace(readme_block(text), table))
    print(
        f"{page_name(page)}: {len(FIGURES)} figures written; linked figures that disagree (all pages): "
        f"{all_link_mismatches() or 'none'}; figures without a link: {len(all_unlinked_figures())}"
    )


if __name__ == "__main__":
    main()
