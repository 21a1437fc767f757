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


def test_mail_is_judged_and_written_by_the_engine():
    """emails.py asks the engine what its listed messages need before their bodies are fetched
    (`sighting.decide_page`) and writes them through the engine's page path
    (`write.write_mapped_page`, its windows and rules); it compares no versions, names no outcome
    of its own and calls no per-row writer or window of its own."""
    tree = ast.parse((PROVIDERS / "pipedrive" / "emails.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert {"decide_page", "write_mapped_page"} <= names, {"decide_page", "write_mapped_page"} - names
    own = names & {"newer", "seen_before", "ALREADY_HERE", "IMPORTED", "MATCHED", "write_mapped", "window_batch", "mail_batch"}
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert not own and "write_rows" not in calls, (own, calls & {"write_rows"})
