"""Which grammar library should own constrained decoding: llguidance, xgrammar or outlines-core,
compared on this machine for the embedded SmolLM2 vocabulary (issue 22, part 1).

    bash scripts/setup.sh test,grammar-compare   # the three libraries (xgrammar pulls triton)
    python -m bench.grammar_libraries [--quick] --json bench/results/grammar_libraries.json

Every library gets the vocabulary the same way the local tier has it: the raw bytes of each
token id read from the GGUF through llama.cpp (special tokens marked as such), with llama.cpp
as the tokenizer; no transformers conversion and nothing from a model hub. For each schema of
a fixed set (one JSON Schema feature each, compact JSON, no free whitespace):

- `compile_ms`: building the constraint for the schema (the first matcher included, since
  llguidance compiles lazily);
- coverage: a valid instance (tokenized by llama.cpp) is accepted token by token and may end
  there, and an invalid one (the feature violated) is refused at some token or cannot end;
- `mask_us`: computing the allowed-token mask at each position of the valid instance, batch 1
  (one matcher) and batch 8 (8 matchers one after another, as a step of 8 constrained rows
  would; per row, so the two compare directly).

Keys: per library `coverage` (schemas right / total), `compile_ms_p50`, `mask_us_p50_b1`,
`mask_us_p50_b8_per_row`, `mask_us_p99_b1` (mostly the first mask: llguidance builds its lexer
then), `setup_ms` (the vocabulary prepared once) and `footprint` (declared requirements, import
time, whether importing it loads torch). The bench does not choose; docs/benchmarks.md says which and why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

from bench.json_schemas import ONE_FEATURE_SCHEMAS
from bench.repetitions import nearest_rank


@dataclass
class Vocabulary:
    """The GGUF's vocabulary as llama.cpp has it."""

    tokens: list[bytes]  # raw bytes per id ("" for special tokens)
    eos_token_id: int
    bos_token_id: int | None
    special_token_ids: list[int]
    tokenize: object  # bytes | str -> ids, no special tokens


def load_vocabulary() -> tuple[Vocabulary, object]:
    from local_runtime.config import LocalEngineConfig
    from local_runtime.engine import LocalEngine

    engine = LocalEngine(
        LocalEngineConfig(kv_cache_tokens=256, max_num_seqs=1, max_num_batched_tokens=64, max_model_len=128)
    )
    backend = engine.backend
    special = [i for i in range(backend.n_vocab) if backend.token_bytes(i) == b"" or backend.is_end_of_generation(i)]
    eos = next(i for i in range(backend.n_vocab) if backend.is_end_of_generation(i))

    def tokenize(text) -> list[int]:
        return engine.tokenize(text.decode("utf-8") if isinstance(text, bytes) else text, add_special=False)

    tokens = [backend.token_bytes(i) for i in range(backend.n_vocab)]
    return Vocabulary(tokens, eos, None, special, tokenize), engine


class _Llguidance:
    module = "llguidance"
    name = "llguidance"

    def __init__(self, vocab: Vocabulary):
        import llguidance

        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab))
        from llguidance.numpy import allocate_token_bitmask

        self.bitmask = allocate_token_bitmask(1, self.tokenizer.vocab_size)

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return lambda: self.llg.LLMatcher(self.tokenizer, grammar)

    def mask(self, matcher) -> None:
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(matcher, self.bitmask, 0)

    @staticmethod
    def advance(matcher, token: int) -> bool:
        return matcher.consume_token(token) and not matcher.is_error()

    @staticmethod
    def can_end(matcher) -> bool:
        return matcher.is_accepting()


class _Xgrammar:
    module = "xgrammar"
    name = "xgrammar"

    def __init__(self, vocab: Vocabulary):
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo(
            vocab.tokens,
            vocab_type=xgrammar.VocabType.RAW,
            vocab_size=len(vocab.tokens),
            stop_token_ids=[vocab.eos_token_id],
        )
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, len(vocab.tokens))
        self.eos = vocab.eos_token_id

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
        )
        return lambda: self.xgr.GrammarMatcher(compiled)

    def mask(self, matcher) -> None:
        matcher.fill_next_token_bitmask(self.bitmask)

    @staticmethod
    def advance(matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def can_end(self, matcher) -> bool:
        return matcher.accept_token(self.eos)


class _OutlinesCore:
    module = "outlines_core"
    name = "outlines-core"

    def __init__(self, vocab: Vocabulary):
        from outlines_core import Vocabulary as OcVocabulary

        by_bytes: dict[bytes, list[int]] = {}
        for token_id, raw in enumerate(vocab.tokens):
            if token_id not in vocab.special_token_ids and raw:
                by_bytes.setdefault(raw, []).append(token_id)
        self.vocabulary = OcVocabulary(vocab.eos_token_id, by_bytes)
        self.eos = vocab.eos_token_id

    def compile(self, schema: dict):
        from outlines_core import Guide, Index
        from outlines_core.json_schema import build_regex_from_schema

        index = Index(build_regex_from_schema(json.dumps(schema), whitespace_pattern=""), self.vocabulary)
        return lambda: Guide(index)

    @staticmethod
    def mask(matcher) -> None:
        matcher.get_tokens()

    @staticmethod
    def advance(matcher, token: int) -> bool:
        if token not in matcher.get_tokens():
            return False
        matcher.advance(token)
        return True

    def can_end(self, matcher) -> bool:
        return matcher.is_finished() or self.eos in matcher.get_tokens()


LIBRARIES = (_Llguidance, _Xgrammar, _OutlinesCore)


def _accepts(library, new_matcher, tokens: list[int]) -> bool:
    matcher = new_matcher()
    return all(library.advance(matcher, token) for token in tokens) and library.can_end(matcher)


def _mask_times_us(library, new_matcher, tokens: list[int], rows: int) -> list[float]:
    """Per row and position: the time to compute the masks of `rows` matchers at that position."""
    matchers = [new_matcher() for _ in range(rows)]
    times = []
    for token in tokens:
        start = time.perf_counter()
        for matcher in matchers:
            library.mask(matcher)
        times.append((time.perf_counter() - start) / rows * 1e6)
        for matcher in matchers:
            library.advance(matcher, token)
    return times


def measure(library_cls, vocab: Vocabulary, repeats: int) -> dict:
    start = time.perf_counter()
    library = library_cls(vocab)
    setup_ms = (time.perf_counter() - start) * 1e3
    per_schema, compile_ms, mask_b1, mask_b8 = {}, [], [], []
    for name, schema, valid, invalid in ONE_FEATURE_SCHEMAS:
        valid_ids = vocab.tokenize(json.dumps(valid, separators=(",", ":")))
        invalid_ids = vocab.tokenize(json.dumps(invalid, separators=(",", ":")))
        try:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                new_matcher = library.compile(schema)
                new_matcher()
                times.append((time.perf_counter() - start) * 1e3)
        except Exception as exc:  # noqa: BLE001  (a schema the library refuses is a coverage finding)
            per_schema[name] = {"compiled": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        accepts_valid, refuses_invalid = (
            _accepts(library, new_matcher, valid_ids),
            not _accepts(library, new_matcher, invalid_ids),
        )
        b1 = _mask_times_us(library, new_matcher, valid_ids, 1)
        b8 = _mask_times_us(library, new_matcher, valid_ids, 8)
        compile_ms.append(statistics.median(times))
        mask_b1 += b1
        mask_b8 += b8
        per_schema[name] = {
            "compiled": True,
            "compile_ms": statistics.median(times),
            "accepts_valid": accepts_valid,
            "refuses_invalid": refuses_invalid,
            "right": accepts_valid and refuses_invalid,
            "mask_us_median_b1": statistics.median(b1),
        }
    right = sum(1 for entry in per_schema.values() if entry.get("right"))
    return {
        "setup_ms": setup_ms,
        "coverage": right / len(ONE_FEATURE_SCHEMAS),
        "schemas_right": right,
        "compile_ms_p50": statistics.median(compile_ms) if compile_ms else None,
        "mask_us_p50_b1": _quantile(mask_b1, 0.5),
        "mask_us_p99_b1": _quantile(mask_b1, 0.99),
        "mask_us_p50_b8_per_row": _quantile(mask_b8, 0.5),
        "per_schema": per_schema,
    }


def footprint(distribution: str, module: str) -> dict:
    """What installing and importing the library brings: its declared requirements, and whether a
    fresh interpreter that imports it has torch loaded afterwards (the on-device tier has no torch)."""
    import importlib.metadata
    import subprocess

    probe = (
        f"import sys, time; t = time.perf_counter(); import {module}; "
        "print(time.perf_counter() - t, 'torch' in sys.modules)"
    )
    seconds, torch_loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    requires = [
        r for r in importlib.metadata.requires(distribution) or [] if "extra ==" not in r
    ]  # what a plain install pulls
    return {"requires": requires, "import_s": float(seconds), "imports_torch": torch_loaded == "True"}


def _quantile(values: list[float], q: float) -> float | None:
    return nearest_rank(values, q) if values else None  # None: the library compiled nothing


def main() -> None:
    import importlib.metadata
    import importlib.util

    from bench.machine import report_header, write_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="one compile per schema instead of five")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="as --quick, and the libraries not installed (the "
        "grammar-compare extra) are listed as skipped: checks the bench works",
    )
    args = parser.parse_args()
    libraries, skipped = LIBRARIES, {}
    if args.smoke:  # only the smoke run may go without the extra: a real run compares all three or fails
        libraries = [cls for cls in LIBRARIES if importlib.util.find_spec(cls.module) is not None]
        skipped = {
            cls.name: "not installed (bash scripts/setup.sh test,grammar-compare)"
            for cls in LIBRARIES
            if cls not in libraries
        }
    vocab, engine = load_vocabulary()
    results = {}
    try:
        for library_cls in libraries:
            results[library_cls.name] = measure(library_cls, vocab, repeats=1 if args.quick or args.smoke else 5)
            results[library_cls.name]["footprint"] = footprint(library_cls.name, library_cls.module)
            print(
                library_cls.name,
                json.dumps({k: v for k, v in results[library_cls.name].items() if k != "per_schema"}),
                flush=True,
            )
    finally:
        engine.close()
    report = {
        **report_header("grammar_libraries", smoke=args.smoke),
        "versions": {cls.name: importlib.metadata.version(cls.name) for cls in libraries},
        "skipped": skipped,
        "vocabulary": f"SmolLM2-135M-Instruct GGUF through llama.cpp: {len(vocab.tokens)} tokens as raw bytes",
        "schemas": [name for name, *_ in ONE_FEATURE_SCHEMAS],
        "libraries": results,
    }
    write_report(args.json, report, ("libraries",))


if __name__ == "__main__":
    main()
