"""Compiling the privacy rules users write as regexes, refusing the ones that can hang.

Python's `re` backtracks, so a repetition nested inside another repetition (`(a+)+`,
`(\\w*\\s?)*`) can take exponential time on a crafted prompt, and prompts are untrusted
input. We parse the pattern and refuse an unbounded repetition nested in a repetition,
or bounded nests whose combined repeat count is large. Possessive quantifiers (`a++`)
never give back, so they do not count as an outer repetition. Not caught: overlapping
alternatives under a repetition (`(a|a)*`); keep alternatives distinct.
"""

from __future__ import annotations

import re

try:  # the parser is private; its home moved in Python 3.11
    from re import _constants as sre_constants, _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_BACKTRACKING_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT}
_POSSESSIVE_REPEAT = getattr(sre_constants, "POSSESSIVE_REPEAT", None)
_UNBOUNDED = sre_constants.MAXREPEAT
# Above this many nested repeats a bounded nest can still take seconds per position.
MAX_NESTED_REPEAT_PRODUCT = 1000
_RULE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


class PrivacyConfigError(ValueError):
    """A privacy rule in the configuration is invalid; the message says how to fix it."""


def compile_user_pattern(name: str, pattern: str) -> re.Pattern[str]:
    """Compile a named user rule, raising PrivacyConfigError if it is invalid or unsafe."""
    if not isinstance(name, str) or not _RULE_NAME.fullmatch(name):
        raise PrivacyConfigError(
            f"privacy rule name {name!r} is invalid: use a letter followed by letters, digits or "
            "underscores (at most 64), e.g. 'employee_id'"
        )
    if not isinstance(pattern, str) or not pattern:
        raise PrivacyConfigError(f"privacy rule {name!r}: the pattern must be a non-empty string")
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise PrivacyConfigError(
            f"privacy rule {name!r}: {pattern!r} is not a valid regular expression ({error})"
        ) from None
    if compiled.fullmatch(""):
        raise PrivacyConfigError(
            f"privacy rule {name!r}: {pattern!r} matches the empty string, so it would match every "
            "request; require at least one character (e.g. '+' instead of '*')"
        )
    problem = _nested_repeat_problem(sre_parse.parse(pattern), outer_max=1)
    if problem:
        raise PrivacyConfigError(
            f"privacy rule {name!r}: {pattern!r} {problem}, which can make matching take exponential "
            "time on some inputs; remove the nesting (e.g. '(ab)+' instead of '(a+b?)+') or make the "
            "inner repetition possessive ('a++')"
        )
    return compiled


def _nested_repeat_problem(items, outer_max: int) -> str | None:
    """Why the parsed pattern nests repetitions dangerously, or None if it does not."""
    for op, arg in items:
        if op in _BACKTRACKING_REPEATS:
            _, max_count, body = arg
            if outer_max > 1 and max_count > 1:
                if outer_max == _UNBOUNDED or max_count == _UNBOUNDED:
                    return "repeats a repetition without bound"
                if outer_max * max_count > MAX_NESTED_REPEAT_PRODUCT:
                    return f"nests repetitions up to {outer_max * max_count} times"
            inner_max = _combine(outer_max, max_count)
            problem = _nested_repeat_problem(body, inner_max)
        elif op == _POSSESSIVE_REPEAT:
            problem = _nested_repeat_problem(arg[2], outer_max)
        else:
            problem = None
            for sub in _subpatterns(op, arg):
                problem = problem or _nested_repeat_problem(sub, outer_max)
        if problem:
            return problem
    return None


def _combine(outer_max: int, max_count: int) -> int:
    if outer_max == _UNBOUNDED or max_count == _UNBOUNDED:
        return _UNBOUNDED
    return outer_max * max_count


def _subpatterns(op, arg) -> list:
    """The parsed sub-patterns inside a group, branch, lookaround or conditional."""
    if op == sre_constants.BRANCH:
        return list(arg[1])
    if op == sre_constants.SUBPATTERN:
        return [arg[-1]]
    if op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
        return [arg[1]]
    if op == sre_constants.GROUPREF_EXISTS:
        return [sub for sub in arg[1:] if sub is not None]
    if op == getattr(sre_constants, "ATOMIC_GROUP", None):
        return [arg]
    return []
