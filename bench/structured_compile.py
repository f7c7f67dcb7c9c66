"""bench.structured's compile figures: per constraint, building its matcher and its first mask.

Two sets, both on the local tier's vocabulary: the bench's own constraints (its cases' schemas and
tool grammars) and schemas no case was written around (bench.json_schemas' one-feature set and
structured_cases.OTHER_SCHEMAS), so the compile figure is not only that of schemas tuned for.
"""

from __future__ import annotations

import json
import statistics
import time

from bench.json_schemas import ONE_FEATURE_SCHEMAS
from bench.repetitions import nearest_rank
from bench.structured_cases import OTHER_SCHEMAS
from sdk.protocol.engine import StructuredOutput


def compile_times_ms(grammar, constraints: list) -> list[float]:
    """Per constraint: building its matcher and computing its first mask, in ms. llguidance builds a
    grammar's lexer lazily on the first mask, so a matcher alone leaves that work out; a request
    waits for both before its first constrained token."""
    grammar.allowed(
        grammar.matcher(StructuredOutput("json_object"))
    )  # the vocabulary's one-time preparation, not a compile
    times = []
    for constraint in constraints:
        start = time.perf_counter()
        grammar.allowed(grammar.matcher(constraint))
        times.append((time.perf_counter() - start) * 1000)
    return times


def other_constraints() -> list:
    """Schemas no case of this bench was written around: bench.json_schemas' one-feature set
    (bench.grammar_libraries' coverage) and OTHER_SCHEMAS, larger ones shaped like app forms."""
    schemas = [schema for _, schema, _, _ in ONE_FEATURE_SCHEMAS] + OTHER_SCHEMAS
    return [StructuredOutput("json_schema", json.dumps(schema)) for schema in schemas]


def grammar_compile_figures(grammar, bench_constraints: list) -> dict:
    """The report's compile keys: p50/p99/max over the bench's constraints, p50/p99 over the others."""
    ours = compile_times_ms(grammar, bench_constraints)
    others = compile_times_ms(grammar, other_constraints())
    return {
        "grammar_compile_p50_ms": statistics.median(ours),
        "grammar_compile_p99_ms": nearest_rank(ours, 0.99),
        "grammar_compile_max_ms": max(ours),
        "grammar_compile_other_schemas_p50_ms": statistics.median(others),
        "grammar_compile_other_schemas_p99_ms": nearest_rank(others, 0.99),
        "num_compiles": {"bench": len(ours), "other_schemas": len(others)},
    }
