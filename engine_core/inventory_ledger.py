"""The ledger's side of a catch-up listing: which listed rows the engine must write.

A source's catch-up lists every id it serves now with the row's version (`source_version`) and
hands each page here: `to_write` records the ids as seen by the run (`migration_inventory`, what
a kind's deletion check later compares the ledger with) and says which rows the ledger does not
hold at that version (`needs_write`). `forget_older` drops the inventories of the tenant's ended
runs. `waiting_at` and `unlisted` are what the provider's proof that a parent is gone reads (a
placeholder listed again at the version it was skipped at, a parent the whole walk did not serve);
`waiting` which records are left to the walk at all (their fan-out is the catch-up's too).
The statements are named queries (`sql/queries.sql`); reads of the inventory after the listing
(`unseen_live`, `unseen_skipped`) are in `ledger_reads`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine_core import ledger
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.rows import WAITS_FOR_WALK, newer, same_version

WRITTEN = ("created", "matched")


def needs_write(entry: Mapping[str, Any] | None, version: str, run: Run | None = None) -> bool:
    """Whether a listed row at `version` is written: when the ledger lacks it (`entry` None),
    holds a placeholder (a skip or failure whose reason may no longer hold: a parent written
    since), holds an older version (`rows.newer`) or holds it as deleted at the source. A matched
    row (the product's own contact or company) with a newer version is left alone unless the
    run's `overwrite_matched`: the product keeps its values, so writing it would only be refused
    again by every catch-up. `entry`: {action, source_version, deleted_at_source}."""
    if entry is None or entry["action"] not in WRITTEN:
        return True
    if entry.get("deleted_at_source") is not None:
        return True
    if entry["action"] == "matched" and run is not None and not ledger.overwrite_matched(run):
        return False
    return newer(version, entry["source_version"])


def remember_and_compare(conn: Conn, run: Run, kind: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Record `ids` (source ids of ledger kind `kind`) as seen by the run's inventory and return
    their ledger entries by source id ({action, source_version, deleted_at_source}), in one
    statement: one round trip a page; both happen or neither."""
    if not ids:
        return {}
    rows = conn.fetch_all("inventory_remember_and_compare",
                          {"r": run.id, "t": run.tenant_id, "s": run.source, "k": kind, "ids": list(ids)})
    return {r["source_id"]: r for r in rows}


def to_write(conn: Conn, run: Run, kind: str, listed: Iterable[tuple[str, str]]) -> set[str]:
    """The source ids among `listed` ((source id, version) of one ledger kind, a page) the
    engine must write (`needs_write`), after recording every one as seen (`remember_and_compare`)."""
    pairs = list(listed)
    entries = remember_and_compare(conn, run, kind, [sid for sid, _ in pairs])
    return {sid for sid, version in pairs if needs_write(entries.get(sid), version, run)}


def unwritten(conn: Conn, run: Run, kind: str, listed: Iterable[tuple[str, str]]) -> set[str]:
    """`to_write` without recording anything: the source ids among `listed` ((source id, version)
    of ledger kind `kind`) the ledger holds at no version `needs_write` would leave alone, as it
    holds them now (a read ahead of the listing's own comparison, which may differ by then)."""
    pairs = list(listed)
    held = ledger.held(conn, run, kind, [sid for sid, _ in pairs])
    entries = {sid: {"action": h.action, "source_version": h.version, "deleted_at_source": h.deleted_at_source}
               for sid, h in held.items()}
    return {sid for sid, version in pairs if needs_write(entries.get(sid), version, run)}


def waiting_at(conn: Conn, run: Run, kind: str, listed: Iterable[tuple[str, str | None]]) -> set[str]:
    """The source ids among `listed` ((source id, version) of ledger kind `kind`) the ledger holds as
    skipped waiting for the catch-up's walk (`write.WAITS_FOR_WALK`: a walk before the catch-up skipped
    them) at that very version (`rows.same_version`): their references are the ones that walk saw."""
    pairs = [(sid, version) for sid, version in listed if version is not None]
    if not pairs:
        return set()
    rows = conn.fetch_all("ledger_waiting_at", {"t": run.tenant_id, "s": run.source, "k": kind, "waiting": WAITS_FOR_WALK,
                                                "ids": ledger.array(sorted({sid for sid, _ in pairs}))})
    held = {r["source_id"]: r["source_version"] for r in rows}
    return {sid for sid, version in pairs if sid in held and same_version(held[sid], version)}


def waiting(conn: Conn, run: Run, kind: str, ids: Iterable[str]) -> set[str]:
    """The source ids among `ids` of ledger kind `kind` the ledger holds as placeholders left to the
    catch-up's walk (`write.WAITS_FOR_WALK`), whatever their version: records the catch-up writes,
    so what hangs under them is its to read (a deal's mail)."""
    wanted = sorted(set(ids))
    if not wanted:
        return set()
    rows = conn.fetch_all("ledger_waiting_at", {"t": run.tenant_id, "s": run.source, "k": kind, "waiting": WAITS_FOR_WALK,
                                                "ids": ledger.array(wanted)})
    return {r["source_id"] for r in rows}


def unlisted(conn: Conn, run: Run, pairs: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """The (ledger kind, source id) pairs among `pairs` this run's inventory does not hold (no page
    of its catch-up's listing served them), in one query; none of a kind of which the run recorded
    a row without a readable id (`ledger.note_unreadable`: it may be any of them)."""
    return listed(conn, run, pairs)[0]


def listed(conn: Conn, run: Run, pairs: Iterable[tuple[str, str]]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """`(unlisted, served)` among `pairs` ((ledger kind, source id)), in one query: `unlisted` as
    that function says; `served`: the pairs a page of this run's catch-up listing served itself."""
    wanted = sorted(set(pairs))
    if not wanted:
        return set(), set()
    rows = conn.fetch_all("inventory_seen", {"r": run.id, "kinds": ledger.array([k for k, _ in wanted]),
                                             "source_ids": ledger.array([s for _, s in wanted])})
    return (set(wanted) - {(r["kind"], r["source_id"]) for r in rows},
            {(r["kind"], r["source_id"]) for r in rows if r["served"]})


def forget_older(conn: Conn, run: Run) -> None:
    """Drop the inventories of the tenant's ended runs (every run of its source but `run`):
    nothing reads them once a newer catch-up lists."""
    conn.execute("inventory_forget_older", {"t": run.tenant_id, "s": run.source, "r": run.id})

