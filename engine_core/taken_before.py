"""The kinds an earlier run of a tenant took: a row's soft link to one of them is not owed.

A soft link whose parent is not found is recorded as owed (`rows.owed_links`, `skip_reason.OWED`:
"persons not taken yet (a run of persons fills it)") when its parent's kind is one no run writes
yet, so that the run that writes the kind fills it (`owed_links.fill`). A kind an earlier run of
the tenant took is written already: a parent of it the ledger does not have was not written (it
failed, or is gone at the source) and no later run of that kind fills the link. Such a link stays
empty and unrecorded, as in a run that takes the kind itself, so a row's outcome does not depend on
how the tenant split its kinds between runs (the six kinds first, the archived lists later).
"""
from __future__ import annotations

from collections.abc import Iterable

from engine_core import ledger_reads
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.rows import Mapped


def taken_before(conn: Conn, run: Run, mapped: Iterable[Mapped | None]) -> frozenset[str]:
    """The ledger kinds of the soft links of `mapped` that `run` does not take and the tenant's
    ledger holds (`ledger_reads.kinds_held`: an earlier run took them); empty, without a query, when
    every link's kinds are the run's."""
    taken = set(run.kinds)
    kinds = {k for m in mapped if m is not None for ref in m.links if taken.isdisjoint(ref.kinds) for k in ref.kinds}
    if not kinds:
        return frozenset()
    return frozenset(ledger_reads.kinds_held(conn, run.tenant_id, run.source, sorted(kinds)))
