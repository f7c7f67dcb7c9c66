"""JSON Schemas that each exercise one feature, with an instance that fits and one that breaks the
feature: the coverage set of bench.grammar_libraries (and a start for bench.structured)."""

from __future__ import annotations

# (name, schema, valid instance, invalid instance): one feature each.
ONE_FEATURE_SCHEMAS: list[tuple[str, dict, object, object]] = [
    (
        "object_required",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Ann", "age": 31},
        {"name": "Ann"},
    ),
    (
        "nested_object",
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}},
                    "required": ["id"],
                    "additionalProperties": False,
                }
            },
            "required": ["user"],
            "additionalProperties": False,
        },
        {"user": {"id": 7}},
        {"user": {"id": "7"}},
    ),
    (
        "enum",
        {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green", "blue"]}},
            "required": ["colour"],
            "additionalProperties": False,
        },
        {"colour": "green"},
        {"colour": "pink"},
    ),
    (
        "const",
        {
            "type": "object",
            "properties": {"kind": {"const": "event"}},
            "required": ["kind"],
            "additionalProperties": False,
        },
        {"kind": "event"},
        {"kind": "events"},
    ),
    (
        "anyOf",
        {
            "type": "object",
            "properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}},
            "required": ["v"],
            "additionalProperties": False,
        },
        {"v": True},
        {"v": "yes"},
    ),
    (
        "oneOf",
        {
            "type": "object",
            "properties": {"v": {"oneOf": [{"type": "string"}, {"type": "null"}]}},
            "required": ["v"],
            "additionalProperties": False,
        },
        {"v": None},
        {"v": 3},
    ),
    (
        "ref_defs",
        {
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["x", "y"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/point"}},
            "required": ["a"],
            "additionalProperties": False,
        },
        {"a": {"x": 1.5, "y": -2}},
        {"a": {"x": 1.5}},
    ),
    (
        "pattern",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
            "required": ["code"],
            "additionalProperties": False,
        },
        {"code": "ABC-12"},
        {"code": "abc-12"},
    ),
    (
        "array_min_max_items",
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}},
            "required": ["tags"],
            "additionalProperties": False,
        },
        {"tags": ["a", "b"]},
        {"tags": ["a", "b", "c"]},
    ),
    (
        "string_length",
        {
            "type": "object",
            "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4}},
            "required": ["s"],
            "additionalProperties": False,
        },
        {"s": "abc"},
        {"s": "abcdef"},
    ),
    (
        "integer_range",
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["n"],
            "additionalProperties": False,
        },
        {"n": 5},
        {"n": 12},
    ),
    (
        "nullable_type_list",
        {
            "type": "object",
            "properties": {"note": {"type": ["string", "null"]}},
            "required": ["note"],
            "additionalProperties": False,
        },
        {"note": None},
        {"note": 1},
    ),
    (
        "array_of_objects",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
        {"items": [{"sku": "A1", "qty": 2}, {"sku": "B2", "qty": 1}]},
        {"items": [{"sku": "A1"}]},
    ),
    (
        "format_date",
        {
            "type": "object",
            "properties": {"day": {"type": "string", "format": "date"}},
            "required": ["day"],
            "additionalProperties": False,
        },
        {"day": "2026-11-23"},
        {"day": "23/11/2026"},
    ),
]
