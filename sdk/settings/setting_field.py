"""One setting (`SettingField`: section, key, type, default, env variable, help, check), and the rows a
config dataclass declares on its own fields (sdk.protocol.config_fields.setting, read back by `fields_of`),
so a key is written once: as the field of the object it configures.

    @dataclass(frozen=True)
    class ListenerConfig:
        port: int = setting(8000, "TCP port of the OpenAI HTTP API.", check=at_least(0, high=65535))

    SERVER_FIELDS = fields_of(ListenerConfig, "server", env_prefix="TANDEM_")
"""

from __future__ import annotations

import dataclasses
import sys
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any

from sdk.protocol.config_fields import Check, declared

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a table"}


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


def fields_of(
    config: type, section: str, env_prefix: str, changes: dict[str, dict[str, Any]] | None = None
) -> tuple[SettingField, ...]:
    """The settings a config dataclass declares (sdk.protocol.config_fields.setting, in field order) as
    [section]'s keys, each with the env variable its declaration names (by default `env_prefix + KEY`).
    `changes` maps a key to SettingField attributes this section sets otherwise (a check or help of its own)."""
    namespace = vars(sys.modules[config.__module__])
    rows = []
    for field in dataclasses.fields(config):
        declaration = declared(field)
        if declaration is None:
            continue
        key = declaration.key or field.name
        if declaration.optional:
            default = None
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = field.default
        env = declaration.env
        row = SettingField(
            section,
            key,
            _value_type(eval(field.type, namespace) if isinstance(field.type, str) else field.type),
            default,
            f"{env_prefix}{key.upper()}" if env is True else env or None,
            declaration.help,
            unset=declaration.unset,
            check=declaration.check,
            target=field.name,
            secret=declaration.secret,
        )
        rows.append(dataclasses.replace(row, **(changes or {}).get(key, {})))
    unknown = set(changes or {}) - {row.key for row in rows}
    if unknown:
        raise KeyError(f"{config.__name__} declares no setting {sorted(unknown)}")
    return tuple(rows)


def _value_type(hint: Any) -> type:
    """`int`, or `int | None` (an optional setting): the setting's type."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        hint = kind
    return typing.get_origin(hint) or hint  # dict[str, float] -> dict
