"""Hypothesis strategies for the JSON Schema subset pydantic writes (objects, arrays, scalars,
anyOf, enum/const, local $refs, integer bounds): bodies an OpenAPI document says are valid.
(hypothesis-jsonschema does not work with the installed hypothesis.)"""

from __future__ import annotations

from hypothesis import strategies as st

_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # no lone surrogates: not UTF-8
_SCALARS = {
    "string": lambda s: _TEXT,
    "boolean": lambda s: st.booleans(),
    "null": lambda s: st.none(),
    "integer": lambda s: st.integers(s.get("minimum", -(2**63)), s.get("maximum", 2**63)),
    "number": lambda s: st.floats(s.get("minimum"), s.get("maximum"), allow_nan=False, allow_infinity=False),
}


def from_schema(schema: dict, root: dict | None = None, depth: int = 0) -> st.SearchStrategy:
    """Values valid under `schema`; `root` holds the document its "#/..." $refs point into."""
    root = root if root is not None else schema
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return from_schema(target, root, depth)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(option, root, depth) for option in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": one}, root, depth) for one in kind])
    if kind in _SCALARS:
        return _SCALARS[kind](schema)
    if kind == "array":
        items = from_schema(schema.get("items", {"type": "string"}), root, depth + 1)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=3 if depth < 2 else 1)
    if kind == "object" or "properties" in schema:
        return _object(schema, root, depth)
    return st.one_of(_TEXT, st.integers(-5, 5), st.booleans(), st.none())  # {}: anything JSON


def _object(schema: dict, root: dict, depth: int) -> st.SearchStrategy:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    fixed = {name: from_schema(sub, root, depth + 1) for name, sub in properties.items() if name in required}
    optional = {name: from_schema(sub, root, depth + 1) for name, sub in properties.items() if name not in required}
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and not properties:  # a map: dict[str, X]
        return st.dictionaries(_TEXT, from_schema(extra, root, depth + 1), max_size=3)
    return st.fixed_dictionaries(fixed, optional=optional)
