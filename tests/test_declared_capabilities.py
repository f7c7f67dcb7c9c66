"""What a cloud or an engine can do is declared in its contract, never sniffed (issues 39 and 68).

`CloudBackend` says whether a backend verifies outside drafts (`verifies_drafts`, `generate_with_drafts`);
`EngineProtocol` says whether an engine takes them (`max_draft_tokens`, `offer_draft`). So no code in
`sdk/`, `cloud_engine/` or `local_runtime/` asks an object with `hasattr` or `getattr` for a member either
contract names: it asks the contract. (A `getattr` for an async iterator's `aclose` is Python's protocol,
not one of ours, and may stay.)"""

from __future__ import annotations

import ast
from pathlib import Path

from sdk.protocol.cloud_backend import CloudBackend
from sdk.protocol.engine import EngineProtocol

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("sdk", "cloud_engine", "local_runtime")


def contract_members() -> set[str]:
    return {name for contract in (CloudBackend, EngineProtocol) for name in vars(contract) if not name.startswith("_")}


def sniffs(source: str, members: set[str]) -> list[tuple[int, str]]:
    """(line, member) of each hasattr/getattr whose attribute is a literal naming a contract member."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in members
        ):
            found.append((node.lineno, node.args[1].value))
    return found


def test_the_contracts_declare_drafting():
    members = contract_members()
    assert {"verifies_drafts", "generate_with_drafts", "max_draft_tokens", "offer_draft"} <= members


def test_no_code_sniffs_a_capability_the_contracts_declare():
    members = contract_members()
    found = [
        f"{path.relative_to(ROOT)}:{line} asks for {member!r}"
        for package in SCANNED
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, member in sniffs(path.read_text(), members)
    ]
    assert not found, "ask the contract instead:\n" + "\n".join(found)


def test_a_planted_sniff_is_found():
    planted = 'if hasattr(cloud, "generate_with_drafts"):\n    pass\noffer = getattr(engine, "offer_draft", None)\n'
    assert sniffs(planted, contract_members()) == [(1, "generate_with_drafts"), (3, "offer_draft")]
    assert sniffs('close = getattr(stream, "aclose", None)\n', contract_members()) == []
