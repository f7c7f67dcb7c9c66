"""What bench.structured and its budget sweep ask and how they grade an answer."""

from __future__ import annotations

import json
import re


def schema_prompt(request: str, schema: dict) -> list[dict]:
    return [
        {
            "role": "user",
            "content": f"{request}\nAnswer with JSON only, matching this JSON Schema: {json.dumps(schema)}",
        }
    ]


def fits(text: str, finish_reason: str | None, schema: dict, free: bool) -> bool:
    import jsonschema

    if finish_reason != "stop":
        return False
    if free:  # the first {...} span: a fence or a sentence around the JSON is forgiven
        match = re.search(r"\{.*\}", text, re.DOTALL)
        text = match.group(0) if match else text
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True
