"""docs/architecture.md's "A request's path": at most 12 stops, each a `file:function` that exists (a method as
Class.method), and every other `file`'s `name` a stop mentions too, so the page follows the code it describes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STOP = re.compile(r"^\d+\. `(?P<file>[\w/]+\.py):(?P<name>[\w.]+)`", re.M)
MENTION = re.compile(r"`(?P<file>[\w/]+\.py)`'s `(?P<name>[\w.]+)`")


def section() -> str:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    return text.split("## A request's path", 1)[1].split("\n## ", 1)[0]


def defined(path: Path) -> set[str]:
    """Every function and method a module defines, methods as Class.method."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return names


def test_the_request_path_names_real_functions():
    text = section()
    stops = [(m["file"], m["name"]) for m in STOP.finditer(text)]
    assert 6 <= len(stops) <= 12, stops
    mentioned = [(m["file"], m["name"]) for m in MENTION.finditer(text)]
    missing = [f"{file}:{name}" for file, name in stops + mentioned if name not in defined(REPO / file)]
    assert missing == []


def test_a_missing_function_is_caught(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    async def run(self): ...\n\ndef f(): ...\n")
    assert defined(module) == {"A.run", "f"}
