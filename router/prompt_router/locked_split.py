"""The router's locked test subjects: fixed by a hash of the subject's name, never tuned on
(one choice was made on them by a rule fixed before they were scored: below).

Every choice a router recipe makes (features, ridge alpha, k, blend weights) is made by grouped
cross-validation inside the design subjects; the locked subjects are scored once per recipe
that ships, and docs/benchmarks.md quotes that figure (issue 37). One choice was made on the locked
subjects: whether the default router uses the recipe the CV selected (cold_recipe.SELECTED) or
prompt length (LENGTH). It was made by a rule written down before either was scored (SELECTED
ships only when it beats length's pooled APGR by more than the standard error of the paired
difference; cold_recipe), and each was scored once, but the shipped router's locked figure is
still the better of two candidates scored there, so it leans optimistic.

The split is a salted SHA-256 of the name, so it needs no list, and a subject added to the tables later
falls on a side by the same rule. The salt was written down before the split was looked at
and is not to be changed to move a subject: the split it gave (14 of the 38 MMLU subjects in
shared/data locked) is what it is. GSM8K and any non-MMLU table are design data only.

The MMLU subjects RouteLLM publishes beyond shared/data are not used at all: they are how the
product is checked from outside.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from router.eval_tables import RoutingExample
from router.prompt_router.cross_validation import group_of

SALT = "tandem-router-locked-v1:"
LOCKED_ONE_IN = 4  # a subject is locked when its hash is 0 mod this
# Tables whose labels are not what they claim, left out of training and scoring alike. Found by
# reading the design tables' accuracies (before any locked figure was computed), not by a score.
DEFECTIVE_TABLES = {
    "mmlu_high_school_mathematics": "GPT-4 is right on 3% and Mixtral on 32%: the strong column failed to parse "
    "GPT-4's answers, so training on it teaches 'math needs the weak tier' (its gap is -0.29)",
}


def is_locked(subject: str) -> bool:
    """Whether an MMLU subject (`mmlu_<name>`, as the routing tables name their groups) is locked."""
    if not subject.startswith("mmlu_"):
        return False
    digest = hashlib.sha256((SALT + subject).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % LOCKED_ONE_IN == 0


def split_subjects(subjects: Iterable[str]) -> tuple[list[str], list[str]]:
    """(design subjects, locked subjects), each sorted."""
    names = sorted(set(subjects))
    return [s for s in names if not is_locked(s)], [s for s in names if is_locked(s)]


def split_rows(examples: Sequence[RoutingExample]) -> tuple[list[int], list[int]]:
    """(design rows, locked rows): indices into `examples`; the defective tables' rows are in neither."""
    design, locked = [], []
    for index, example in enumerate(examples):
        subject = group_of(example)
        if subject not in DEFECTIVE_TABLES:
            (locked if is_locked(subject) else design).append(index)
    return design, locked


def design_examples(examples: Sequence[RoutingExample]) -> list[RoutingExample]:
    """What every router choice and the shipped router are made from: all rows but the locked
    subjects' and the defective tables'."""
    return [examples[i] for i in split_rows(examples)[0]]


def locked_examples(examples: Sequence[RoutingExample]) -> list[RoutingExample]:
    """The locked subjects' rows: scored once per recipe that ships, never trained or tuned on."""
    return [examples[i] for i in split_rows(examples)[1]]
