"""A source yields, the engine writes - checked in the providers' code, beside the import contracts
(`.importlinter` forbids a provider to import the ledger or the product's tables, but not to issue
a statement through a connection it is handed, nor to pass rows through to the engine):

* no provider module issues a statement of its own (`.sql(`, `.fetch_one(`, `.fetch_all(`,
  `.sql_rowcount(`, `.raw`): what a provider reads of the engine's or the product's tables it reads
  through the engine's functions (`holdings`, `definitions`, `ledger_reads`);
* field definitions are written by the engine alone (`engine_core.definitions`): no provider module
  defines a `write_definitions` or reads the stored book on its own (`book_from_db`).
"""
from __future__ import annotations

import ast
from pathlib import Path

PROVIDERS = Path(__file__).resolve().parents[1] / "engine_core" / "providers"
STATEMENTS = ("sql", "fetch_one", "fetch_all", "sql_rowcount", "raw")


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PROVIDERS)), ast.parse(p.read_text())) for p in sorted(PROVIDERS.rglob("*.py"))]


def test_no_provider_module_issues_a_statement_of_its_own():
    found = [f"{name}:{node.lineno} .{node.attr}"
             for name, tree in _modules() for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in STATEMENTS]
    assert not found, found


def test_field_definitions_are_written_by_the_engine_alone():
    found = [f"{name}:{node.lineno} {node.name}"
             for name, tree in _modules() for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef) and node.name in ("write_definitions", "book_from_db")]
    assert not found, found


def test_mails_sighting_rule_is_the_engines():
    """emails.py asks the engine (`write.seen_before`) what a listed message the ledger has needs
    before its body is fetched; it compares no versions and names no outcome of its own."""
    tree = ast.parse((PROVIDERS / "pipedrive" / "emails.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "seen_before" in names
    assert not names & {"newer", "ALREADY_HERE", "IMPORTED", "MATCHED"}, names & {"newer", "ALREADY_HERE", "IMPORTED", "MATCHED"}
