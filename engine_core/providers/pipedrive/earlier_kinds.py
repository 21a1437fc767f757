"""Parents of a kind an earlier run of the tenant imported: asked of the source like the run's own.

A tenant's runs may split its kinds: the six kinds a plain loader reads first, the archived deals
and leads alone later. A row of the later run whose parent the ledger does not know (a person
deleted at the source since nothing listed it, or created since the first run) must get the
outcome a single run of every kind gives it, whatever the split: imported with the link empty when
the source does not have the parent, a placeholder saying "exists at the source but is not written"
when it does. So a missing parent of a ledger kind the tenant's ledger holds (`ledger_reads.kinds_held`:
an earlier run took the kind) is asked of the source like a parent of a kind the run imports
(`writers.askable`, `writers.ask_source`: a kind's parents through its v2 list's `ids=`, up to 100 a
request, once per run and once more in the catch-up; leads through the archived leads' list from ten
on; paced and counted by the run's budgeted client).

Why asking, not a walk of the parent's lists by the catch-up (`walk_proof.proof_lists`): the
parents missing from the ledger are few (the tenant's earlier run wrote the rest), and a page asks
about them in at most one request per parent kind (an organizations' and a persons' `ids=` question
for a page of 500 archived deals), so the questions are bounded by the run's own pages; a walk costs
a page per 500 rows of every parent kind whatever the run lists (the sandbox's small account:
1,500 persons and 600 organizations, 5 pages, against the 1-2 questions its 99 archived deals and
44 archived leads ask: test_earlier_kinds), and would write the parents it finds changed, a sync's
work. A soft link to such a kind is not owed either (`engine_core.taken_before`).

A parent of a kind no run of the tenant took is not asked (the rule test_references pins): there
is nothing to link the row to either way - the product holds no row of that kind, gone at the
source or not - and a run of that kind settles the placeholder (it writes the parent, or proves it
gone, and takes the placeholder over).
"""
from __future__ import annotations

from collections.abc import Iterable

from engine_core import ledger_reads
from engine_core.context import TaskContext
from engine_core.providers.pipedrive.kinds import PARENT_PATHS, ledger_kind

Pair = tuple[str, str]  # (ledger kind, source id)


def earlier_kinds(ctx: TaskContext, pairs: Iterable[Pair]) -> frozenset[str]:
    """The ledger kinds of `pairs` (missing parents) the run does not import but the tenant's
    ledger holds (module docstring), among those the source answers by id (`PARENT_PATHS`).
    Reads the ledger (one index probe per such kind) only when some pair is of such a kind; holds
    no connection after."""
    imported = {ledger_kind(k) for k in ctx.run.kinds}
    others = sorted({kind for kind, _ in pairs if kind not in imported and kind in PARENT_PATHS})
    if not others:
        return frozenset()
    with ctx.db.connection() as conn:
        return frozenset(ledger_reads.kinds_held(conn, ctx.run.tenant_id, ctx.run.source, others))
