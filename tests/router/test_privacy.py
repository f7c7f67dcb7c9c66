"""Privacy rules: PII detectors (positives and the numbers they must leave alone), user
regexes, chat messages with content parts, redaction, counters, and fuzzing."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.pii_detectors import BUILTIN_DETECTORS, iban_is_valid, luhn_is_valid
from router.privacy import PRIVATE_FLAG_REASON, PrivacyConfig, PrivacyRules
from router.privacy_counters import PrivacyCounters
from router.user_patterns import PrivacyConfigError


def make_rules(**config) -> PrivacyRules:
    return PrivacyRules.from_config({"detectors": list(BUILTIN_DETECTORS), **config})


def matched_texts(text: str, rules: PrivacyRules | None = None) -> list[tuple[str, str]]:
    rules = rules or make_rules()
    return [(m.rule, text[m.start : m.end]) for m in rules.check(text).matches]


@pytest.mark.parametrize(
    ("text", "rule", "found"),
    [
        ("write to john.doe+tag@example.co.uk today", "email", "john.doe+tag@example.co.uk"),
        ("Mail: ANNA_B@mail-server.org.", "email", "ANNA_B@mail-server.org"),
        ("call +1 (555) 123-4567 now", "phone", "+1 (555) 123-4567"),
        ("call (555) 123-4567", "phone", "(555) 123-4567"),
        ("or 555.123.4567", "phone", "555.123.4567"),
        ("toll free 1-800-555-0199", "phone", "1-800-555-0199"),
        ("London +44 20 7946 0958", "phone", "+44 20 7946 0958"),
        ("dial 0044 20 7946 0958", "phone", "0044 20 7946 0958"),
        ("office 020 7946 0958", "phone", "020 7946 0958"),
        ("Paris 01 23 45 67 89", "phone", "01 23 45 67 89"),
        ("mobile 07700900123", "phone", "07700900123"),
        ("compact +4915123456789", "phone", "+4915123456789"),
        ("visa 4111 1111 1111 1111 exp 12/27", "card", "4111 1111 1111 1111"),
        ("visa 4111-1111-1111-1111", "card", "4111-1111-1111-1111"),
        ("amex 3782 822463 10005", "card", "3782 822463 10005"),
        ("mc 5555555555554444 thanks", "card", "5555555555554444"),
        ("iban DE89 3704 0044 0532 0130 00 please", "iban", "DE89 3704 0044 0532 0130 00"),
        ("iban GB82WEST12345698765432", "iban", "GB82WEST12345698765432"),
    ],
)
def test_detectors_find_pii(text, rule, found):
    assert (rule, found) in matched_texts(text)


@pytest.mark.parametrize(
    "text",
    [
        "In 2023 we sold more than in 1999 2000 2001.",
        "It costs $1,234.56 or €1.234.567 in total, i.e. 1 234 567 units.",
        "$555-123-4567 was the budget",  # an amount, not a number to call
        "Meet on 2024-01-15 or 15.01.2024 or 01.02.2024 at 12:30.",
        "pi is 3.14159265 and 0.123456789 is small",
        "order 5551234567 shipped",  # unseparated without + or trunk 0
        "server 192.168.1.1 version 1.2.3",
        "4111-1111-1111-1112 fails Luhn",
        "1234567890123456 is random",
        "DE89 3704 0044 0532 0130 01 has a wrong checksum",
        "user at example dot com, not@anaddress",
    ],
)
def test_detectors_leave_plain_numbers_alone(text):
    assert matched_texts(text) == []


def test_checksums():
    assert luhn_is_valid("4111111111111111") and not luhn_is_valid("4111111111111112")
    assert iban_is_valid("DE89370400440532013000") and not iban_is_valid("DE89370400440532013001")


def test_luhn_valid_run_after_other_digits_still_found():
    assert matched_texts("4111111111111111 2024") == [("card", "4111111111111111")]


def test_default_detectors_leave_iban_off():
    rules = PrivacyRules()
    assert rules.rule_names == ("email", "phone", "card")
    assert not rules.check("GB82WEST12345698765432").private


def test_user_regex_rules_and_placeholders():
    rules = make_rules(patterns={"employee_id": r"EMP-\d{6}", "project": r"(?i)project\s+falcon"})
    verdict = rules.check("EMP-123456 works on Project  Falcon")
    assert verdict.private and verdict.rule_names == ("employee_id", "project")
    assert rules.redact("EMP-123456 works on Project  Falcon")[0] == "[EMPLOYEE_ID] works on [PROJECT]"


@pytest.mark.parametrize(
    ("patterns", "message_part"),
    [
        ({"bad": "(unclosed"}, "not a valid regular expression"),
        ({"empty": "a*"}, "matches the empty string"),
        ({"nested": r"x(a+)+y"}, "exponential"),
        ({"nested_branch": r"x(?:y|(z\w*))+"}, "exponential"),
        ({"huge": r"x(a{1,100}){1,100}"}, "exponential"),
        ({"9lives": "x"}, "rule name"),
        ({"email": "x"}, "built-in detector names"),
    ],
)
def test_invalid_user_rules_raise_clear_errors(patterns, message_part):
    with pytest.raises(PrivacyConfigError, match=message_part):
        make_rules(patterns=patterns)


def test_invalid_config_raises_clear_errors():
    with pytest.raises(PrivacyConfigError, match="unknown PII detectors"):
        PrivacyRules(PrivacyConfig(detectors=("email", "ssn")))
    with pytest.raises(PrivacyConfigError, match="unknown privacy settings"):
        PrivacyRules.from_config({"detector": ["email"]})


def test_safe_nesting_is_accepted():
    rules = make_rules(patterns={"us_phone": r"(\d{3}-){2}\d{4}", "possessive": r"x(a+)++y"})
    assert rules.check("555-123-4567").rule_names == ("phone", "us_phone")


def test_messages_with_content_parts_and_private_flag():
    rules = PrivacyRules()
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "assistant", "content": None, "tool_calls": []},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://x/a@b.com"}},
                {"type": "text", "text": "My mail is a@b.com"},
            ],
        },
    ]
    verdict = rules.check_messages(messages)
    assert verdict.private and verdict.reasons == ("email",)
    (match,) = verdict.matches
    assert (match.message_index, match.part_index, match.start, match.end) == (2, 1, 11, 18)
    clean = [{"role": "user", "content": "What is 2 + 2?"}]
    assert not rules.check_messages(clean).private
    flagged = rules.check_messages(clean, private=True)
    assert flagged.private and flagged.reasons == (PRIVATE_FLAG_REASON,)


def test_redact_messages_copies_and_replaces_only_text():
    rules = PrivacyRules()
    messages = [
        {"role": "user", "content": "call 020 7946 0958"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "a@b.com, a@b.com"}]},
    ]
    redacted, redactions = rules.redact_messages(messages)
    assert redacted[0]["content"] == "call [PHONE]"
    assert redacted[1]["content"][1] == {"type": "text", "text": "[EMAIL], [EMAIL]"}
    assert messages[0]["content"] == "call 020 7946 0958"  # the caller's messages are untouched
    assert [(r.rule, r.message_index, r.part_index) for r in redactions] == [
        ("phone", 0, None),
        ("email", 1, 1),
        ("email", 1, 1),
    ]


def test_overlapping_matches_merge_into_one_placeholder():
    rules = make_rules(patterns={"contact": r"mail a@b"})
    redacted, redactions = rules.redact("mail a@b.com now")
    assert redacted == "[CONTACT] now"
    assert [(r.rule, r.start, r.end) for r in redactions] == [("contact", 0, 12)]


def test_counters_count_requests_reasons_and_withheld_size():
    counters = PrivacyCounters()
    counters.record_kept_local(["email", "card", "email"], num_chars=40, num_tokens=11)
    counters.record_kept_local([PRIVATE_FLAG_REASON], num_chars=10)
    counters.record_redacted(num_redactions=2)
    snapshot = counters.snapshot().as_dict()
    assert snapshot == {
        "num_requests_kept_local": 2,
        "num_requests_redacted": 1,
        "num_redactions": 2,
        "num_chars_withheld": 50,
        "num_tokens_withheld": 11,
        "kept_local_by_reason": {"card": 1, "email": 1, "private_flag": 1},
    }
    with pytest.raises(ValueError, match="at least one reason"):
        counters.record_kept_local([], num_chars=1)


def test_hostile_inputs_scan_in_linear_time():
    rules = make_rules(patterns={"ticket": r"TCK-\d+"})
    hostile = ["a" * 50_000, "1 " * 25_000, "1-" * 25_000 + "x", "a." * 25_000 + "@", "A1" * 25_000]
    started = time.perf_counter()
    for text in hostile:
        rules.redact(text)
    assert time.perf_counter() - started < 10  # quadratic scans take minutes here


pii_fragments = st.sampled_from(
    [
        "a@b.com",
        "x.y@mail.example.org",
        "+44 20 7946 0958",
        "(555) 123-4567",
        "4111 1111 1111 1111",
        "DE89 3704 0044 0532 0130 00",
        "2024",
        "$12.50",
        " ",
        "-",
        ".",
        "(",
        ")",
        "+",
        "@",
        "0",
        "00",
    ]
)
digit_heavy_text = st.text(alphabet="0123456789 -.()+@aAEDGB$[]_", max_size=40)
fuzz_text = st.lists(st.one_of(st.text(max_size=12), digit_heavy_text, pii_fragments), max_size=8).map("".join)


def test_redaction_rechecks_the_context_it_changes():
    # The letters before "+" hide the phone number until the e-mail redaction removes them.
    rules = PrivacyRules()
    assert rules.check("0@0.AA+44 20 7946 0958").rule_names == ("email",)
    redacted, redactions = rules.redact("0@0.AA+44 20 7946 0958")
    assert redacted == "[EMAIL][PHONE]"
    assert [(r.rule, r.start, r.end) for r in redactions] == [("email", 0, 6), ("phone", 6, 22)]


@settings(max_examples=400, deadline=None)
@given(fuzz_text)
def test_fuzz_redaction_never_raises_and_leaves_no_match(text):
    rules = make_rules(patterns={"secret": r"(?i)secret-\w+"})
    verdict = rules.check(text)
    redacted, redactions = rules.redact(text)
    assert verdict.private == bool(redactions)
    assert not rules.check(redacted).private
    spans = [(r.start, r.end) for r in redactions]
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    for match in verdict.matches:  # every character of every match was replaced
        assert any(start <= match.start and match.end <= end for start, end in spans)
