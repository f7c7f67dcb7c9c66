"""Command-line options made from sdk.settings' field table: a command names the settings it takes,
and each becomes an option with the field's type, help, env variable and default (the field's own
check validates the value, in load_settings, like the same key from the TOML file or the env).

    serve.__signature__ = command_signature(SERVE_SETTINGS, own=[...])

A key `section.name` is the flag `--name` (underscores as dashes) unless the command renames it;
a bool key is `--name/--no-name`. An option left out is None, so the layers below it apply.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import typer

from sdk.settings.checks import OneOf
from sdk.settings.fields import FIELDS, SettingField


def flag_name(dotted: str, renamed: Mapping[str, str]) -> str:
    return renamed.get(dotted) or dotted.rpartition(".")[2].replace("_", "-")


def option_help(field: SettingField) -> str:
    default = field.unset if field.optional else field.default
    default_text = f" Default: {default}." if default not in ("", None) else ""
    env = f" [env: {field.env}]" if field.env else ""
    return f"{field.help}{default_text}{env}"


def option(name: str, annotation: Any, *declarations: str, **settings: Any) -> inspect.Parameter:
    """A keyword parameter typer reads as the option `declarations` (typer.Option's settings)."""
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=annotation,
        default=typer.Option(None, *declarations, **settings),
    )


def setting_parameters(keys: Sequence[str], renamed: Mapping[str, str] = {}) -> list[inspect.Parameter]:
    """One keyword parameter per setting: typer reads its option from the default."""
    parameters = []
    for dotted in keys:
        field, flag = FIELDS[dotted], flag_name(dotted, renamed)
        declarations = [f"--{flag}/--no-{flag}"] if field.type is bool else [f"--{flag}"]
        kind: type = field.type
        if isinstance(field.check, OneOf):  # offered as choices (any case), checked again by the field
            kind = enum.Enum(f"{flag}_choices", {choice: choice for choice in field.check.choices}, type=str)
        parameters.append(
            option(
                flag.replace("-", "_"),
                Optional[kind],
                *declarations,
                help=option_help(field),
                show_default=False,
                case_sensitive=False,
            )
        )
    return parameters


def command_signature(
    keys: Sequence[str], own: Sequence[inspect.Parameter] = (), renamed: Mapping[str, str] = {}
) -> inspect.Signature:
    """The command's own options first, then one per setting."""
    return inspect.Signature([*own, *setting_parameters(keys, renamed)])


def settings_given(
    options: Mapping[str, Any],
    keys: Sequence[str],
    renamed: Mapping[str, str] = {},
    also: Mapping[str, Sequence[str]] = {},
) -> dict[str, Any]:
    """{dotted key: value} of the options given on the command line (`also`: keys one option sets too)."""
    given = {}
    for dotted in keys:
        value = options.get(flag_name(dotted, renamed).replace("-", "_"))
        if value is not None:
            for key in (dotted, *also.get(dotted, ())):
                given[key] = value
    return given
