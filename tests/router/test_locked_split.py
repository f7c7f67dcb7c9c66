"""The locked test subjects are fixed by the hash rule: this list is what docs/benchmarks.md quotes, and a change
of rule or salt (which would let a recipe be tuned on the locked part) fails here."""

from __future__ import annotations

from pathlib import Path

from router.eval_tables import DEFAULT_DATA_DIR
from router.prompt_router.locked_split import is_locked, split_subjects

DATA = Path(DEFAULT_DATA_DIR) / "mmlu"
LOCKED = [
    "mmlu_abstract_algebra",
    "mmlu_business_ethics",
    "mmlu_college_medicine",
    "mmlu_college_physics",
    "mmlu_high_school_geography",
    "mmlu_high_school_physics",
    "mmlu_high_school_us_history",
    "mmlu_human_sexuality",
    "mmlu_machine_learning",
    "mmlu_philosophy",
    "mmlu_professional_law",
    "mmlu_public_relations",
    "mmlu_us_foreign_policy",
    "mmlu_virology",
]


def test_the_locked_subjects_are_the_hash_rules():
    subjects = [path.stem for path in DATA.glob("mmlu_*.csv")]
    assert len(subjects) == 38
    design, locked = split_subjects(subjects)
    assert locked == LOCKED
    assert len(design) == 24 and not set(design) & set(locked)


def test_only_mmlu_subjects_can_be_locked():
    assert not is_locked("gsm8k") and not is_locked("mt_bench")
    assert is_locked("mmlu_virology")
