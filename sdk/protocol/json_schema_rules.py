"""How tandem reads a JSON schema it constrains an answer to (response_format, a tool's parameters):
both engines' grammars (sdk.engine_common.grammar) and the tool-call formats (sdk.protocol.tool_formats)
build on these two rules, so they are part of the contract, not of one grammar library's use."""

from __future__ import annotations

# Whitespace between JSON tokens: at most 16 spaces or newlines per gap (a pretty-printer's
# indentation), never unbounded, so a small model cannot pad until max_tokens. Not compact: the
# 135M model was trained on pretty-printed JSON, and with no whitespace allowed its free object
# keys degenerated (`{"🌍🌍🌍...` until max_tokens on 5 of 5 json_object requests, greedy and
# sampled; with this pattern it writes `{\n  "name": "Luna",\n  "age": 12, ...`).
JSON_FORMAT = {"whitespace_flexible": False, "whitespace_pattern": r"[ \n]{0,16}"}


_OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def closed_objects(schema):
    """The schema with every object that lists `properties` and says nothing about others closed
    (`additionalProperties: false`), as vLLM's default grammar backend (xgrammar's strict mode)
    and OpenAI's strict schemas do. JSON Schema's own default is open, and a small model fills an
    open object with keys of its own (SmolLM2 added `"required": [...]` to a pydantic model's
    answer until max_tokens). A schema that sets any of additionalProperties, patternProperties or
    unevaluatedProperties keeps its choice; allOf branches, and objects that combine their
    properties with allOf or $ref, are left open (closing either part would refuse the other's keys)."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(sub) for sub in out[key]]
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), (dict, list)):
            out[key] = closed_objects(out[key])
    if isinstance(out.get("properties"), dict) and not any(k in out for k in (*_OPEN_KEYWORDS, "allOf", "$ref")):
        out["additionalProperties"] = False
    return out
