"""What to do about skipped rows that a run of the tenant can still bring, in the places a user
looks: the lines `migrate run` and `migrate sync` end with (`what_now`'s `remedies`), and
`migrate explain` of such a row or of its missing parent.

Two cases, read from the ledger:

* A row skipped for a parent the source serves only through a list no run of the tenant took -
  Pipedrive's archived deals and leads, when a run picked the active lists alone (the six kinds a
  plain loader reads): its reason names that list (`skip_reason.UNTAKEN`). The remedy is a run of
  that list alone (`migrate run --tenant T --kinds deals_archived,leads_archived`: a new run,
  since no run took those kinds), then `migrate sync T`. The run writes the parents; the sync
  walks every list of the kinds the tenant took (`runs.synced_kinds`) and takes the placeholders
  over now that their parents are written (`inventory_ledger.needs_write`). A `migrate run` of the
  skipped kinds is refused (the tenant is migrated), and the run of the lists alone does not read
  the children again: the sync does.
* A skipped row whose every parent is written now (`ledger_reads.takeable`): a sync takes it.
"""
from __future__ import annotations

from typing import Any

from engine_core import db as dbmod
from engine_core import ledger_reads, runs_reads
from engine_core.providers.registry import provider_for
from engine_core.skip_reason import untaken_lists, untaken_mark
from engine_core.source import ledger_lists


def untaken_by_tenant(db: dbmod.Database | dbmod.Conn, tenant: str, source: str) -> dict[str, tuple[str, ...]]:
    """Per ledger kind of `source` listed through several kinds, those no run of the tenant took
    (dry runs aside) while some run took another list of it: {"deals": ("deals_archived",)} after
    a run of the six kinds. {} when the source's provider no longer loads."""
    try:
        provider = provider_for(source)
    except Exception:  # noqa: BLE001 - a source that no longer loads: nothing to advise
        return {}
    return untaken_lists(ledger_lists(provider), runs_reads.kinds_taken(db, tenant, source))  # type: ignore[arg-type]


def take_lists(tenant: str, lists: list[str] | tuple[str, ...]) -> str:
    """The command that takes `lists` alone for the tenant: "migrate run --tenant acme --kinds
    deals_archived,leads_archived" (plain names: exactly those kinds; `+kind` would walk every default
    kind again)."""
    return f"migrate run --tenant {tenant} --kinds {','.join(lists)}"


def remedies(db: dbmod.Database | dbmod.Conn, tenant: str, source: str) -> list[tuple[str, str]]:
    """(command, what it does) for `what_now`, in the order to type them: the run of the lists the
    tenant's skipped rows wait for (with the sync after it said), or - once those are taken - the
    sync that takes the skipped rows whose parents are written now. [] when neither applies."""
    lists = [k for ks in untaken_by_tenant(db, tenant, source).values() for k in ks]
    waiting = ledger_reads.skipped_naming(db, tenant, source, [untaken_mark(k) for k in lists]) if lists else 0
    if waiting:
        named = [k for k in lists if ledger_reads.skipped_naming(db, tenant, source, [untaken_mark(k)])]
        return [(take_lists(tenant, named),
                 f"takes {', '.join(named)}, which {waiting} skipped row(s) wait for (their reasons name "
                 f"{'it' if len(named) == 1 else 'them'}); then `migrate sync {tenant}` takes those rows")]
    skipped = [k for k, v in ledger_reads.bad_row_counts(db, tenant).items() if v["skipped"]]
    takeable = len(ledger_reads.takeable(db, tenant, source, skipped)) if skipped else 0
    if takeable:
        return [(f"migrate sync {tenant}", f"takes the {takeable} skipped row(s) whose parents are written now")]
    return []


def for_row(db: dbmod.Database, tenant: str, story: dict[str, Any]) -> str | None:
    """`migrate explain`'s line for a skipped row (`row_story.explain`'s `story`) that a run of the
    tenant can still bring: its parents are written now (a sync takes it), or its reason names a
    list no run of the tenant took (that list's run, then a sync). None otherwise."""
    if story.get("action") != "skipped" or story.get("unreadable"):
        return None
    source, kind, sid = story["source"], story["kind"], story["source_id"]
    if ledger_reads.takeable(db, tenant, source, [kind], source_id=sid):
        return f"its parents are written now: `migrate sync {tenant}` takes it"
    reason = story.get("reason") or ""
    named = [k for ks in untaken_by_tenant(db, tenant, source).values() for k in ks if untaken_mark(k) in reason]
    if not named:
        return None
    return (f"to link it: `{take_lists(tenant, named)}` takes {', '.join(named)} (no run of the tenant took "
            f"{'it' if len(named) == 1 else 'them'}), then `migrate sync {tenant}` takes this row "
            f"(a `migrate run` of {kind} is refused: the tenant is migrated)")


def for_absent(db: dbmod.Database, tenant: str, kind: str, source_id: str) -> str | None:
    """`migrate explain`'s words for a row of ledger kind `kind` the ledger does not hold, when some
    list of that kind was part of no run of the tenant: the row may be served there alone (an
    archived deal), so the list and the command that takes it are named, and the rows skipped for
    it (`ledger_reads.skipped_for_parent`), which a sync then takes. None otherwise."""
    for source in runs_reads.tenant_sources(db, tenant):
        lists = untaken_by_tenant(db, tenant, source).get(kind)
        if not lists:
            continue
        children = ledger_reads.skipped_for_parent(db, tenant, source, kind, source_id)
        waiting = (f"; {sum(children.values())} skipped row(s) wait for it "
                   f"({', '.join(f'{n} {k}' for k, n in children.items())}), which `migrate sync {tenant}` takes "
                   "once it is written") if children else ""
        return (f"{', '.join(lists)} {'was' if len(lists) == 1 else 'were'} part of no run of the tenant, and a row "
                f"of {kind} listed only there (an archived one) is taken by no other list: "
                f"`{take_lists(tenant, lists)}` takes it{waiting}")
    return None
