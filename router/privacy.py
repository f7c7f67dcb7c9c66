"""Privacy rules: what must never leave the device, and how to redact it if allowed to.

A request stays local when the app marks it private or when its text matches a rule:
a built-in PII detector ("email", "phone", "card", "iban"; see `router.pii_detectors`)
or a named user regex. The router may instead escalate a matching request with every
match replaced by a typed placeholder ("[EMAIL]") when the deployment allows redaction;
a request flagged private is never escalated, redacted or not.

Only text is checked: string contents and OpenAI content parts of type "text". Other
parts (images, audio) cannot be inspected here; a policy that escalates them must decide
separately.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from router.chat_text import iter_message_texts, message_as_dict, part_as_dict
from router.pii_detectors import BUILTIN_DETECTORS, DEFAULT_DETECTORS
from router.redaction import Redaction, redact_text
from router.user_patterns import PrivacyConfigError, compile_user_pattern

# The reason recorded when the request itself asked to stay on the device.
PRIVATE_FLAG_REASON = "private_flag"


@dataclass(frozen=True)
class PrivacyConfig:
    """Which rules run; validated when `PrivacyRules` is built from it."""

    detectors: tuple[str, ...] = DEFAULT_DETECTORS  # built-in PII detectors, by name
    patterns: Mapping[str, str] = field(default_factory=dict)  # user rules: name -> regex
    redact_before_escalation: bool = False  # escalate matching requests with placeholders

    @classmethod
    def from_dict(cls, config: Mapping) -> PrivacyConfig:
        """Build from a config mapping with the same keys, refusing unknown ones."""
        unknown = set(config) - {"detectors", "patterns", "redact_before_escalation"}
        if unknown:
            raise PrivacyConfigError(
                f"unknown privacy settings {sorted(unknown)}; known: detectors, patterns, redact_before_escalation"
            )
        detectors = config.get("detectors", DEFAULT_DETECTORS)
        if not isinstance(detectors, (list, tuple)):
            raise PrivacyConfigError("privacy 'detectors' must be a list of names, e.g. ['email', 'card']")
        patterns = config.get("patterns", {})
        if not isinstance(patterns, Mapping):
            raise PrivacyConfigError("privacy 'patterns' must map rule names to regexes")
        return cls(tuple(detectors), dict(patterns), bool(config.get("redact_before_escalation", False)))


@dataclass(frozen=True)
class PrivacyMatch:
    """One piece of text a rule flagged; indexes locate it in a request's messages."""

    rule: str  # detector or user rule name
    start: int  # offset in the text (of the message content or content part)
    end: int
    message_index: int | None = None  # None when a bare text was checked
    part_index: int | None = None  # None when the content is a string


@dataclass(frozen=True)
class PrivacyVerdict:
    """Whether a request must stay on the device, and why."""

    private: bool
    rule_names: tuple[str, ...] = ()  # rules that matched, sorted, each once
    matches: tuple[PrivacyMatch, ...] = ()
    flagged_private: bool = False  # the request itself asked to stay local

    @property
    def reasons(self) -> tuple[str, ...]:
        """What kept it local, for counters and the response metadata."""
        return ((PRIVATE_FLAG_REASON,) if self.flagged_private else ()) + self.rule_names


class PrivacyRules:
    """The compiled rules of one `PrivacyConfig`; stateless, safe to share."""

    def __init__(self, config: PrivacyConfig | None = None):
        self.config = config or PrivacyConfig()
        unknown = [name for name in self.config.detectors if name not in BUILTIN_DETECTORS]
        if unknown:
            raise PrivacyConfigError(f"unknown PII detectors {unknown}; choose from {sorted(BUILTIN_DETECTORS)}")
        clashes = sorted(set(self.config.patterns) & set(BUILTIN_DETECTORS))
        if clashes:
            raise PrivacyConfigError(f"privacy rule names {clashes} are built-in detector names; rename them")
        self._detectors = {name: BUILTIN_DETECTORS[name] for name in dict.fromkeys(self.config.detectors)}
        self._user_patterns: dict[str, re.Pattern[str]] = {
            name: compile_user_pattern(name, pattern) for name, pattern in self.config.patterns.items()
        }

    @classmethod
    def from_config(cls, config: Mapping | PrivacyConfig | None) -> PrivacyRules:
        """Rules from a `PrivacyConfig` or its dict form (None: the defaults)."""
        if config is None or isinstance(config, PrivacyConfig):
            return cls(config)
        return cls(PrivacyConfig.from_dict(config))

    @property
    def rule_names(self) -> tuple[str, ...]:
        return (*self._detectors, *self._user_patterns)

    def find(self, text: str) -> list[PrivacyMatch]:
        """Every rule's matches in text, sorted by position; rules may overlap."""
        found = [PrivacyMatch(name, s, e) for name, detect in self._detectors.items() for s, e in detect(text)]
        for name, pattern in self._user_patterns.items():
            # Zero-width matches (lookarounds, \b) flag nothing a placeholder could replace.
            found += [PrivacyMatch(name, *m.span()) for m in pattern.finditer(text) if m.end() > m.start()]
        return sorted(found, key=lambda match: (match.start, -match.end, match.rule))

    def matched_rule_names(self, text: str) -> tuple[str, ...]:
        """Names of the rules text matches (empty: nothing private), e.g. for PrivateFirst."""
        return tuple(sorted({match.rule for match in self.find(text)}))

    def check(self, text: str, private: bool = False) -> PrivacyVerdict:
        """The verdict on one text (a raw prompt); `private=True` (the request's flag) forces local."""
        return _verdict(self.find(text), flagged_private=private)

    def check_messages(self, messages: Iterable, private: bool = False) -> PrivacyVerdict:
        """The verdict on a chat request; `private=True` (the request's flag) forces local."""
        matches = [
            PrivacyMatch(m.rule, m.start, m.end, message_index, part_index)
            for message_index, part_index, text in iter_message_texts(messages)
            for m in self.find(text)
        ]
        return _verdict(matches, flagged_private=private)

    def redact(self, text: str) -> tuple[str, list[Redaction]]:
        """Text with every match replaced by its rule's placeholder, and what was replaced
        (offsets in `text`); see `router.redaction` for how overlaps and context are handled."""
        return redact_text(text, self.find)

    def redact_messages(self, messages: Iterable) -> tuple[list[dict], list[Redaction]]:
        """Copies of the messages (as dicts) with every text redacted, and what was replaced."""
        redacted_messages = [message_as_dict(message) for message in messages]
        all_redactions: list[Redaction] = []
        for message_index, part_index, text in iter_message_texts(redacted_messages):
            redacted, redactions = self.redact(text)
            if not redactions:
                continue
            message = redacted_messages[message_index]
            if part_index is None:
                message["content"] = redacted
            else:
                parts = message["content"] = list(message["content"])
                parts[part_index] = {**part_as_dict(parts[part_index]), "text": redacted}
            all_redactions += [
                Redaction(r.rule, r.placeholder, r.start, r.end, message_index, part_index) for r in redactions
            ]
        return redacted_messages, all_redactions


def _verdict(matches: list[PrivacyMatch], flagged_private: bool) -> PrivacyVerdict:
    rule_names = tuple(sorted({match.rule for match in matches}))
    return PrivacyVerdict(bool(matches) or flagged_private, rule_names, tuple(matches), flagged_private)
