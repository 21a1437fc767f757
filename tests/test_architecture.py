"""The house's rules, checked on every `make test`: no import cycle among the project's modules
(imports inside functions counted), and the layer contracts in `.importlinter`.

Why: a cycle ties modules that must change together into one, and an import hidden inside a
function still is one (ARCHITECTURE.md, "The house"). Imports under `if TYPE_CHECKING:` are left
out: they never run.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine_core", "migration_pipeline", "pipedrive_sandbox")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node of `graph` (module -> modules it
    imports), each sorted, by Tarjan's algorithm (iterative: no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its file (function bodies included,
    `if TYPE_CHECKING:` blocks left out), read statically by grimp (import-linter's graph)."""
    g = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    return {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}


def test_strongly_connected_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycle_among_project_modules():
    cycles = strongly_connected(import_graph())
    assert not cycles, "import cycles (function-level imports counted): " + "; ".join(" <-> ".join(c) for c in cycles)


CONTRACTS = ("engine-alone", "engine-no-provider", "providers-no-run-machinery", "face-through-registry",
             "sandbox-alone")


@pytest.mark.parametrize("contract", CONTRACTS)
def test_layer_contract_holds(contract: str) -> None:
    """A contract of `.importlinter` at the repository root: the engine imports no Dagster, no
    sandbox and (outside its providers) no provider; providers import no run machinery, ledger or
    product tables; the face reaches a provider only through the registry; the sandbox stands alone."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter"), "--no-cache", "--contract", contract],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
