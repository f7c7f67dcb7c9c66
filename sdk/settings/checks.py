"""The checks a setting's value goes through (sdk.settings.fields): each raises ValueError (or
TypeError) saying what is allowed; `OneOf` also tells a command-line option its choices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Check = Callable[[Any], object]  # raises ValueError (or TypeError) saying what is allowed


@dataclass(frozen=True)
class OneOf:
    """A check that a value is one of `choices` (a command-line option offers them as its choices)."""

    choices: tuple[str, ...]

    def __call__(self, value: str) -> None:
        if value not in self.choices:
            raise ValueError(f"must be one of: {', '.join(self.choices)}")


def one_of(*choices: str) -> Check:
    return OneOf(choices)


def speculative(value: str) -> None:
    from cloud_engine.spec_decode.config import parse_speculative

    parse_speculative(value)


def at_least(low: float, inclusive: bool = True, high: float | None = None) -> Check:
    def check(value: float) -> None:
        # Written as "not (ok)" so NaN fails too.
        if not ((value >= low if inclusive else value > low) and (high is None or value <= high)):
            raise ValueError(
                f"must be {'>=' if inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
            )

    return check
