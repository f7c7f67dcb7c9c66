"""How a config dataclass declares its settings on its own fields, so each setting is written once.

    @dataclass
    class LocalEngineConfig:
        max_num_seqs: int = setting(16, "Sequences decoded together.", check=at_least(1), optional=True)

sdk.settings reads the declarations (`declared`) into its table of settings (section, key, env
variable, help, check), from which the TOML file, the TANDEM_* variables, the command-line options
and `tandem config show` all come. A contract, so the engines' configs can declare theirs without
importing the product; what a value means stays the dataclass's own (`__post_init__`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Check = Callable[[Any], object]  # raises ValueError (or TypeError) saying what is allowed
_METADATA_KEY = "tandem.setting"


@dataclass(frozen=True)
class OneOf:
    """A check that a value is one of `choices` (a command-line option offers them as its choices)."""

    choices: tuple[str, ...]

    def __call__(self, value: str) -> None:
        if value not in self.choices:
            raise ValueError(f"must be one of: {', '.join(self.choices)}")


def one_of(*choices: str) -> Check:
    return OneOf(choices)


def at_least(low: float, inclusive: bool = True, high: float | None = None) -> Check:
    def check(value: float) -> None:
        # Written as "not (ok)" so NaN fails too.
        if not ((value >= low if inclusive else value > low) and (high is None or value <= high)):
            raise ValueError(
                f"must be {'>=' if inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
            )

    return check


@dataclass(frozen=True)
class Declared:
    """What a dataclass field says about its setting; its type and default are the field's own."""

    help: str
    check: Check | None = None
    unset: str = ""  # what an unset value means (optional settings)
    env: str | bool = True  # True: the section's prefix + KEY; a name: that variable; False: file and flags only
    key: str | None = None  # the setting's key when it is not the field's name
    optional: bool = False  # unset by default, so the dataclass's own default (or None) applies
    secret: bool = False  # shown as "***"


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    check: Check | None = None,
    unset: str = "",
    env: str | bool = True,
    key: str | None = None,
    optional: bool = False,
    secret: bool = False,
) -> Any:
    """A dataclass field that is also a setting (see the module's docstring)."""
    metadata = {_METADATA_KEY: Declared(help, check, unset, env, key, optional, secret)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declared(field: dataclasses.Field) -> Declared | None:
    """The setting a dataclass field declares, if any."""
    return field.metadata.get(_METADATA_KEY)
