"""One setting (`SettingField`: section, key, type, default, env variable, help, check), and the way a
config dataclass declares its settings on its own fields (`setting(...)`, read back by `fields_of`),
so a key is written once: as the field of the object the server is configured with.

    @dataclass(frozen=True)
    class ListenerConfig:
        port: int = setting(8000, "TCP port of the OpenAI HTTP API.", check=at_least(0, high=65535))

    SERVER_FIELDS = fields_of(ListenerConfig, "server", env_prefix="TANDEM_")
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any

from sdk.settings.checks import Check

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a table"}
_METADATA_KEY = "tandem.setting"


class SettingsError(ValueError):
    """A bad config file, value or key; the message names the key, where it came from and what is allowed."""


@dataclass(frozen=True)
class SettingField:
    """One setting. `None` as default means optional: unset, and `unset` says what that means."""

    section: str
    key: str
    type: type  # str, int, float, bool or dict (a TOML table)
    default: Any
    env: str | None  # None: set only in the TOML file (or by a command-line option)
    help: str
    unset: str = ""  # what an unset (None) value means
    check: Check | None = None
    target: str | None = None  # the field of LocalEngineConfig / CloudEngineConfig / CascadeConfig it feeds
    secret: bool = False  # printed as "***"

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def optional(self) -> bool:
        return self.default is None

    @property
    def kind(self) -> str:
        return _KINDS[self.type] + (" (or unset)" if self.optional else "")

    def coerce(self, value: Any) -> Any:
        """`value` (from TOML or the command line) as this key's type, checked; ValueError says what is allowed."""
        if isinstance(value, enum.Enum):  # typer passes Enum choices
            value = value.value
        if value is None and self.optional:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # TOML writes 1 for 1.0
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise ValueError(f"must be {self.kind}, got {type(value).__name__}")
        if self.check is not None:
            self.check(value)
        return value

    def parse_env(self, raw: str) -> Any:
        """An env var's text as this key's value; empty means unset (optional keys only)."""
        text = raw.strip()
        if not text:
            if self.optional:
                return None
            raise ValueError(f"is empty; must be {self.kind} (unset the variable to use the default)")
        if self.type is dict:
            raise ValueError("is a table: set it in the TOML file")
        if self.type is bool:
            if text.lower() not in _BOOL_WORDS:
                raise ValueError("must be true/false, 1/0 or yes/no")
            return _BOOL_WORDS[text.lower()]
        try:
            value = self.type(text)
        except ValueError:
            raise ValueError(f"must be {self.kind}") from None
        return self.coerce(value)


@dataclass(frozen=True)
class Declared:
    """What a dataclass field says about its setting (the rest, key, type and default, is the field's own)."""

    help: str
    check: Check | None = None
    unset: str = ""
    env: bool = True  # False: set only in the TOML file (or by a command-line option)
    secret: bool = False


def setting(
    default: Any, help: str, *, check: Check | None = None, unset: str = "", env: bool = True, secret: bool = False
) -> Any:
    """A dataclass field that is also a setting; `default` None means optional (and `unset` says what that means)."""
    declared = Declared(help, check, unset, env, secret)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: declared})


def fields_of(
    config: type, section: str, env_prefix: str, changes: dict[str, dict[str, Any]] | None = None
) -> tuple[SettingField, ...]:
    """The settings a config dataclass declares (`setting(...)` fields, in their order), as [section]'s
    keys with env variables `env_prefix + KEY`. `changes` maps a key to SettingField attributes this
    section sets otherwise (a check or a help text of its own)."""
    hints = typing.get_type_hints(config)
    rows = []
    for field in dataclasses.fields(config):
        declared = field.metadata.get(_METADATA_KEY)
        if declared is None:
            continue
        row = SettingField(
            section,
            field.name,
            _value_type(hints[field.name]),
            field.default,
            f"{env_prefix}{field.name.upper()}" if declared.env else None,
            declared.help,
            unset=declared.unset,
            check=declared.check,
            target=field.name,
            secret=declared.secret,
        )
        rows.append(dataclasses.replace(row, **(changes or {}).get(field.name, {})))
    unknown = set(changes or {}) - {row.key for row in rows}
    if unknown:
        raise KeyError(f"{config.__name__} declares no setting {sorted(unknown)}")
    return tuple(rows)


def _value_type(hint: Any) -> type:
    """`int`, or `int | None` (an optional setting): the setting's type."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return kind
    return hint
