"""The fixed cases of bench.structured: extraction, classification and form-filling requests with a
JSON Schema each, and tool sets with one obvious tool per question (written for this bench)."""

from __future__ import annotations


def _obj(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": required or list(properties),
        "additionalProperties": False,
    }


STR = {"type": "string", "maxLength": 60}
SHORT = {"type": "string", "maxLength": 24}

# (name, user request, schema): the request states the task; the schema is given as response_format
# (constrained) or written into the request (free: the model must follow it unaided).
SCHEMA_CASES: list[tuple[str, str, dict]] = [
    (
        "person",
        "Invent a fictional person and give their name and age.",
        _obj({"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    ),
    (
        "sentiment",
        "Classify the sentiment of this review: 'The battery died after two days, very disappointing.'",
        _obj({"sentiment": {"enum": ["positive", "negative", "neutral"]}}),
    ),
    (
        "language",
        "Which language is this sentence in: 'Je voudrais un café, s'il vous plaît.'",
        _obj({"language": SHORT}),
    ),
    ("capital", "What is the capital of Japan?", _obj({"country": SHORT, "capital": SHORT})),
    ("math", "What is 12 plus 30?", _obj({"answer": {"type": "integer"}})),
    ("yes_no", "Is the sun a star? Answer yes or no.", _obj({"answer": {"enum": ["yes", "no"]}})),
    ("contact", "Extract the contact: 'Call Maria Lopez at 555-0134 tomorrow.'", _obj({"name": SHORT, "phone": SHORT})),
    (
        "event",
        "Extract the event: 'Team lunch on Friday at noon in the garden.'",
        _obj({"what": STR, "day": SHORT, "time": SHORT, "place": SHORT}),
    ),
    (
        "recipe",
        "List three ingredients of a pancake.",
        _obj({"ingredients": {"type": "array", "items": SHORT, "minItems": 3, "maxItems": 3}}),
    ),
    (
        "colours",
        "Name two colours of the rainbow.",
        _obj(
            {
                "colours": {
                    "type": "array",
                    "items": {"enum": ["red", "orange", "yellow", "green", "blue", "indigo", "violet"]},
                    "minItems": 2,
                    "maxItems": 2,
                }
            }
        ),
    ),
    (
        "priority",
        "Triage this ticket: 'The website is down for all customers.' Give a priority from 1 (low) to 5 (urgent).",
        _obj({"priority": {"type": "integer", "minimum": 1, "maximum": 5}, "reason": STR}),
    ),
    (
        "book",
        "Recommend a classic novel and give its title, author and year.",
        _obj({"title": STR, "author": SHORT, "year": {"type": "integer", "minimum": 1000, "maximum": 2030}}),
    ),
    (
        "address",
        "Parse this address: '221B Baker Street, London NW1 6XE'.",
        _obj({"street": STR, "city": SHORT, "postcode": SHORT}),
    ),
    (
        "product",
        "Describe a product for an online shop: name, price in euros and whether it is in stock.",
        _obj({"name": SHORT, "price": {"type": "number", "minimum": 0}, "in_stock": {"type": "boolean"}}),
    ),
    (
        "weather",
        "Report the weather as if it were sunny and 24 degrees Celsius in Rome.",
        _obj(
            {"city": SHORT, "celsius": {"type": "number"}, "condition": {"enum": ["sunny", "cloudy", "rain", "snow"]}}
        ),
    ),
    (
        "todo",
        "Make a to-do list with two tasks for cleaning a kitchen.",
        _obj(
            {
                "tasks": {
                    "type": "array",
                    "items": _obj({"task": STR, "done": {"type": "boolean"}}),
                    "minItems": 2,
                    "maxItems": 2,
                }
            }
        ),
    ),
    (
        "nested",
        "Give a user with an id and a settings object that says whether dark mode is on.",
        _obj({"id": {"type": "integer"}, "settings": _obj({"dark_mode": {"type": "boolean"}})}),
    ),
    (
        "optional",
        "Describe a city; the population is optional.",
        _obj({"city": SHORT, "population": {"type": "integer", "minimum": 0}}, required=["city"]),
    ),
    (
        "pattern",
        "Make up a flight number like 'AB123'.",
        _obj({"flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}),
    ),
    (
        "anyof",
        "How many legs does a spider have? Give a number, or null if unknown.",
        _obj({"legs": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}),
    ),
    (
        "ref",
        "Give the start and end points of a line, each with x and y.",
        {
            "$defs": {"point": _obj({"x": {"type": "number"}, "y": {"type": "number"}})},
            **_obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}),
        },
    ),
    (
        "tags",
        "Give up to three tags for an article about electric cars.",
        _obj({"tags": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 3}}),
    ),
]


def _function(name: str, description: str, properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": _obj(properties)}}


ASSISTANT_TOOLS = [
    _function("get_weather", "Get the current weather in a city", {"city": SHORT}),
    _function(
        "convert_currency",
        "Convert an amount of money from one currency to another",
        {"amount": {"type": "number"}, "from_currency": SHORT, "to_currency": SHORT},
    ),
    _function("send_email", "Send an email to a recipient", {"to": SHORT, "subject": STR, "body": STR}),
    _function("search_web", "Search the web for a query", {"query": STR}),
]
HOME_TOOLS = [
    _function("set_timer", "Start a countdown timer", {"minutes": {"type": "integer", "minimum": 1}}),
    _function("play_music", "Play music by an artist or of a genre", {"query": SHORT}),
    _function("turn_on_lights", "Turn on the lights in a room", {"room": SHORT}),
]
CALENDAR_TOOLS = [
    _function("create_event", "Add an event to the calendar", {"title": STR, "date": SHORT}),
    _function("list_events", "List the calendar's events on a date", {"date": SHORT}),
]

# (question, tools, the one obvious tool)
TOOL_CASES: list[tuple[str, list[dict], str]] = [
    ("What's the weather like in Paris?", ASSISTANT_TOOLS, "get_weather"),
    ("Convert 100 US dollars to euros.", ASSISTANT_TOOLS, "convert_currency"),
    ("Email bob@example.com that the meeting moved to 3pm.", ASSISTANT_TOOLS, "send_email"),
    ("Search the web for the latest news about Mars rovers.", ASSISTANT_TOOLS, "search_web"),
    ("How hot is it in Tokyo right now?", ASSISTANT_TOOLS, "get_weather"),
    ("How many yen is 50 pounds?", ASSISTANT_TOOLS, "convert_currency"),
    ("Look up who won the 2018 World Cup.", ASSISTANT_TOOLS, "search_web"),
    ("Set a timer for 10 minutes.", HOME_TOOLS, "set_timer"),
    ("Play some jazz.", HOME_TOOLS, "play_music"),
    ("Turn on the lights in the kitchen.", HOME_TOOLS, "turn_on_lights"),
    ("Add a dentist appointment on March 3 to my calendar.", CALENDAR_TOOLS, "create_event"),
    ("What do I have on my calendar on Monday?", CALENDAR_TOOLS, "list_events"),
]

# Larger schemas shaped like app forms and API payloads, written apart from SCHEMA_CASES and never
# generated from (bench.structured times their grammar compile only): many properties, nesting,
# arrays of objects, enums, numeric bounds, optional fields.
_ADDRESS = {
    "type": "object",
    "properties": {
        "street": STR,
        "city": SHORT,
        "postcode": {"type": "string", "pattern": "^[0-9A-Z -]{3,10}$"},
        "country": {"enum": ["DE", "FR", "GB", "US", "JP", "BR"]},
    },
    "required": ["street", "city", "country"],
}
OTHER_SCHEMAS: list[dict] = [
    {
        "type": "object",
        "properties": {f"field_{i}": [STR, {"type": "integer"}, {"type": "boolean"}][i % 3] for i in range(24)},
        "required": [f"field_{i}" for i in range(0, 24, 2)],
    },
    {
        "type": "object",
        "properties": {
            "customer": {
                "type": "object",
                "properties": {"name": STR, "email": SHORT, "address": _ADDRESS},
                "required": ["name", "address"],
            },
            "lines": {
                "type": "array",
                "minItems": 1,
                "maxItems": 20,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": SHORT,
                        "quantity": {"type": "integer", "minimum": 1},
                        "unit_price": {"type": "number", "minimum": 0},
                    },
                    "required": ["sku", "quantity", "unit_price"],
                },
            },
            "currency": {"enum": ["EUR", "USD", "GBP", "JPY"]},
            "notes": STR,
        },
        "required": ["customer", "lines", "currency"],
    },
    {
        "type": "object",
        "properties": {
            "events": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "title": STR,
                        "start": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}$"},
                        "attendees": {"type": "array", "items": SHORT, "maxItems": 8},
                        "recurrence": {"anyOf": [{"type": "null"}, {"enum": ["daily", "weekly", "monthly"]}]},
                    },
                    "required": ["title", "start"],
                },
            }
        },
        "required": ["events"],
    },
    {
        "type": "object",
        "properties": {
            "tree": {
                "type": "object",
                "properties": {
                    "label": SHORT,
                    "children": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "label": SHORT,
                                "children": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {"label": SHORT, "weight": {"type": "number"}},
                                        "required": ["label"],
                                    },
                                },
                            },
                            "required": ["label"],
                        },
                    },
                },
                "required": ["label", "children"],
            }
        },
        "required": ["tree"],
    },
]

# Free json_object requests for bench.structured's budget sweep (issue 41), asked as a new user
# would; none of them names a schema, so nothing bounds the object but max_tokens.
LOOSE_JSON_PROMPTS: list[str] = [
    "A JSON object for a pet shop's hamster.",
    "Give me my morning routine as JSON.",
    "JSON describing a bicycle.",
    "Return a JSON object about the moon.",
    "Summarise a football match as JSON.",
    "A JSON object with a user's profile.",
    "Create a JSON config for a web server.",
    "Describe a pizza order in JSON.",
]
