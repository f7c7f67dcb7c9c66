"""The budgets file (TOML), reloaded by the server when it changes:

    [default]                 # every API key (every client address when the server has no keys)
    usd_per_day = 5.0         # hard: over it, model "cloud" gets 429 insufficient_quota, "auto" answers locally
    soft_usd_per_day = 4.0    # soft: answered as usual, with an x-tandem-budget-warning header
    cloud_share_per_month = 0.5   # cloud tokens / all tokens of the month

    [per_user]                # every `user` value within a key (the request's OpenAI `user` field)
    usd_per_day = 0.5

    [keys.3f2a9c1d0b7e5a41]   # one key, by its id as the server logs it: replaces [default] for it
    usd_per_month = 100.0

Limits: usd_per_day, usd_per_month, cloud_share_per_day, cloud_share_per_month, each also
as soft_<name>. Unknown names, negative values and shares outside [0, 1] are refused naming
the key. Periods are UTC days and months.

A key's id is the SHA-256 of the key (sdk.serving.api_keys.key_fingerprint, 64 hex digits);
`[keys.<id>]` takes the whole id or any prefix of at least MIN_ID_DIGITS digits (the server logs
16). A shorter one (such as the 8-digit fingerprints of earlier versions) and two entries that
could name one key (one a prefix of the other) are refused naming them: either would let a
table meant for one key reach another.
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PERIODS = ("day", "month")
KINDS = ("usd", "cloud_share")
LIMIT_NAMES = tuple(f"{kind}_per_{period}" for kind in KINDS for period in PERIODS)
MIN_ID_DIGITS = 16  # of a key id's prefix in [keys.<id>]: 64 bits, so configured keys never share one
ID_DIGITS = 64
_HEX = re.compile(r"[0-9a-f]+")


class BudgetConfigError(ValueError):
    """A budgets file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Limit:
    kind: str  # "usd" or "cloud_share"
    period: str  # "day" or "month"
    value: float
    hard: bool

    @property
    def name(self) -> str:
        return f"{'' if self.hard else 'soft_'}{self.kind}_per_{self.period}"


@dataclass(frozen=True)
class Limits:
    limits: tuple[Limit, ...] = ()

    @property
    def uses_usd(self) -> bool:
        return any(limit.kind == "usd" for limit in self.limits)

    def __bool__(self) -> bool:
        return bool(self.limits)


@dataclass(frozen=True)
class BudgetConfig:
    default: Limits = field(default_factory=Limits)
    per_user: Limits = field(default_factory=Limits)
    keys: dict[str, Limits] = field(default_factory=dict)  # a key's id, or a prefix of it -> its limits
    source: str = ""
    # The entries of `keys` by their first MIN_ID_DIGITS digits: one dict look-up per request.
    _by_head: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for entry in self.keys:
            self._by_head.setdefault(entry[:MIN_ID_DIGITS], []).append(entry)

    def for_key(self, fingerprint: str | None) -> Limits:
        """The limits of the key with this id: its [keys.<id>] table (the entry its id starts with), else [default]."""
        for entry in self._by_head.get((fingerprint or "")[:MIN_ID_DIGITS], ()):
            if fingerprint.startswith(entry):
                return self.keys[entry]
        return self.default

    @property
    def uses_usd(self) -> bool:
        return self.default.uses_usd or self.per_user.uses_usd or any(limits.uses_usd for limits in self.keys.values())

    @property
    def active(self) -> bool:
        return bool(self.default or self.per_user or any(self.keys.values()))


def _limits(table, where: str) -> Limits:
    if not isinstance(table, dict):
        raise BudgetConfigError(f"{where} must be a table of limits ({', '.join(LIMIT_NAMES)})")
    limits = []
    for name, value in table.items():
        hard = not name.startswith("soft_")
        base = name if hard else name[len("soft_") :]
        if base not in LIMIT_NAMES:
            raise BudgetConfigError(f"{where}.{name}: unknown limit; known: {', '.join(LIMIT_NAMES)} (and soft_ each)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise BudgetConfigError(f"{where}.{name} must be a number >= 0, got {value!r}")
        kind, _, period = base.partition("_per_")
        if kind == "cloud_share" and value > 1:
            raise BudgetConfigError(f"{where}.{name} is a share of tokens in [0, 1], got {value}")
        limits.append(Limit(kind, period, float(value), hard))
    return Limits(tuple(limits))


def parse_budgets(document: dict, source: str = "budgets") -> BudgetConfig:
    unknown = sorted(set(document) - {"default", "per_user", "keys"})
    if unknown:
        raise BudgetConfigError(f"{source}: unknown section(s) {unknown}; known: default, per_user, keys")
    keys = document.get("keys", {})
    if not isinstance(keys, dict):
        raise BudgetConfigError(f"{source}: [keys] must hold one table per key id")
    _check_key_ids(list(keys), source)
    return BudgetConfig(
        default=_limits(document.get("default", {}), f"{source}: default"),
        per_user=_limits(document.get("per_user", {}), f"{source}: per_user"),
        keys={entry.lower(): _limits(table, f"{source}: keys.{entry}") for entry, table in keys.items()},
        source=source,
    )


def _check_key_ids(entries: list[str], source: str) -> None:
    """Each [keys.<id>] names one key: hex, between MIN_ID_DIGITS and ID_DIGITS digits, and no entry a
    prefix of another (both would match that key's id)."""
    for entry in entries:
        if not _HEX.fullmatch(entry.lower()) or len(entry) > ID_DIGITS:
            raise BudgetConfigError(
                f"{source}: keys.{entry}: a key's id is hex digits (the SHA-256 of the key, {ID_DIGITS} digits, as "
                "the server logs its start)"
            )
        if len(entry) < MIN_ID_DIGITS:
            raise BudgetConfigError(
                f"{source}: keys.{entry}: {len(entry)} hex digits could name more than one key; give the key's whole "
                f"id ({ID_DIGITS} digits) or at least its first {MIN_ID_DIGITS}, as the server logs them"
            )
    ordered = sorted(entry.lower() for entry in entries)
    for shorter, longer in itertools.pairwise(ordered):  # sorted: a prefix comes right before what it prefixes
        if longer.startswith(shorter):
            raise BudgetConfigError(
                f"{source}: keys.{shorter} and keys.{longer} would both be the budget of a key whose id starts with "
                f"{longer}; keep one"
            )


def load_budgets(path: str | Path) -> BudgetConfig:
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BudgetConfigError(f"cannot read the budgets file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise BudgetConfigError(f"{path} is not valid TOML: {exc}") from exc
    return parse_budgets(document, str(path))
