"""The checks a setting's value goes through: each raises ValueError (or TypeError) saying what is
allowed. The general ones are the contracts' (sdk.protocol.config_fields), so the engines' configs
can name them; `speculative` asks the cloud engine's own parser."""

from __future__ import annotations

from sdk.protocol.config_fields import Check, OneOf, at_least, one_of

__all__ = ["Check", "OneOf", "at_least", "one_of", "speculative"]


def speculative(value: str) -> None:
    from cloud_engine.spec_decode.config import parse_speculative

    parse_speculative(value)
