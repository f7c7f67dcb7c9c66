"""Finding tandem's TOML file and reading it (or any {section: {key: value}} mapping) into the
(field, value) pairs sdk.settings.loading layers, refusing unknown sections and keys."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import tomllib

from sdk.settings.fields import FIELDS, SECTIONS, SettingField, SettingsError


def config_file(config_path: str | os.PathLike | None, env: Mapping[str, str]) -> str | None:
    """The file to read: explicit (must exist), else the default location when it exists."""
    explicit, origin = (
        (config_path, "--config") if config_path is not None else (env.get("TANDEM_CONFIG") or None, "TANDEM_CONFIG")
    )
    if explicit is not None:
        path = os.path.abspath(os.fspath(explicit))
        if not os.path.isfile(path):
            raise SettingsError(f"config file {path} (from {origin}) does not exist or is not a file")
        return path
    path = default_config_path(env)
    return path if os.path.isfile(path) else None


def default_config_path(env: Mapping[str, str]) -> str:
    """$XDG_CONFIG_HOME/tandem/config.toml (~/.config when unset), whether or not it exists."""
    base = env.get("XDG_CONFIG_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec says to ignore relative values
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return os.path.join(base, "tandem", "config.toml")


def read_file(path: str) -> list[tuple[SettingField, Any]]:
    """The (field, value) pairs of a TOML file, refusing unknown sections and keys."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"config file {path}: cannot read it as TOML: {exc}") from exc
    return pairs_of(data, f"config file {path}")


def pairs_of(data: Mapping, origin: str) -> list[tuple[SettingField, Any]]:
    """The (field, value) pairs of a {section: {key: value}} mapping, refusing unknown sections and keys."""
    if not isinstance(data, Mapping):
        raise SettingsError(f"{origin}: must be an object of sections, got {type(data).__name__}")
    top_level = [name for name in SECTIONS if "." not in name]  # [local.sampling] arrives inside [local]
    unknown = [name for name in data if name not in top_level]
    if unknown:
        raise SettingsError(f"{origin}: unknown sections {unknown}; known sections: {', '.join(top_level)}")
    pairs = []
    tables = list(data.items())
    while tables:
        section, table = tables.pop(0)
        if not isinstance(table, Mapping):
            raise SettingsError(f"{origin}: {section!r} must be a table ([{section}]), got {table!r}")
        # A sub-table such as [local.sampling] arrives nested: {"local": {"sampling": {...}}}.
        tables += [(f"{section}.{key}", value) for key, value in table.items() if f"{section}.{key}" in SECTIONS]
        known = [f.key for f in SECTIONS[section]] + [
            s.rpartition(".")[2] for s in SECTIONS if s.rpartition(".")[0] == section
        ]
        unknown = [key for key in table if key not in known]
        if unknown:
            raise SettingsError(f"{origin}: unknown keys {unknown} in [{section}]; known keys: {', '.join(known)}")
        pairs += [(FIELDS[f"{section}.{key}"], value) for key, value in table.items() if f"{section}.{key}" in FIELDS]
    return pairs
