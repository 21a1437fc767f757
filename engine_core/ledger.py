"""The ledger: every source row once per tenant, claimed in the same transaction as its write.

`write_once` runs the write first and the claim last, inside one savepoint: a write that raises
leaves no claim behind, and a claim that loses (the row is already here) rolls the write back.
Created and matched rows are exclusive; skipped and failed rows are placeholders that the next
successful write takes over.

Versions (migration 0010). Every claim records the source version it wrote
(`source_version`: Pipedrive's `update_time` as served, or `content_version`'s hash). A later
sighting of a written row (its claim lost, its write rolled back) locks the entry (the version
fence: two workers writing the same changed row at once make one update), then:
* a newer version (`newer`) updates the product row in place through the writer's `update`
  callback - never a second row - with a `migration_record_history` row keeping the previous
  version and the columns' previous values; outcome `updated`;
* the same version, or an older one (a stale sighting must not undo a newer write), is
  `already_here`, as before;
* a row the product already had (a `matched` contact, company or user) is the product's own: it
  is not overwritten unless the run's option `overwrite_matched` is true (`already_here`, event
  `matched_kept`, and its ledger version stays the one matched, so a later run with the option
  still finds it changed).
Deletions at the source are soft (`mark_deleted`): `deleted_at_source` on the entry and on the
product row, a `deleted` history row, never a hard delete; a row seen again clears both
(outcome `updated`, event `restored`, a `restored` history row instead of an `updated` one), so a
run's `updated` outcomes always equal its `updated` + `restored` history rows (the rollup checks).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

import orjson
from psycopg import sql
from psycopg.types.json import Jsonb

from engine_core.db import Conn, Database, query
from engine_core.models import Run
from engine_core.rows import (  # noqa: F401 - the outcomes' names and the version rules, pure in rows.py
    ALREADY_HERE, FAILED, GONE_BEFORE_WALK, IMPORTED, MATCHED, SKIPPED, UPDATED, WAITING, WAITS_FOR_WALK,
    content_version, newer, same_version,
)

WRITTEN_ACTIONS = ("created", "matched")
Event = Callable[[str], None]
# The update callback of a writer: (local record id) -> the product row's previous values of the
# columns it changed ({} when nothing changed), or None when the product row is gone.
Update = Callable[[int], "Mapping[str, Any] | None"]

# Product tables a ledger entry may point at (record_type -> the table's qualified name), the only
# ones a soft delete or a restore touches: record types come from the database, never into SQL
# unchecked.
PRODUCT_TABLES: dict[str, tuple[str, str]] = {
    **{f"crm.{t}": ("crm", t) for t in ("users", "pipelines", "stages", "companies", "contacts", "deals", "leads",
                                        "activities", "notes", "emails", "custom_field_definitions")},
    # the further families (migration 0017 gave each deleted_at_source)
    **{f"crm.{t}": ("crm", t) for t in ("products", "deal_products", "files", "deal_participants", "followers",
                                        "deal_history")},
    "example_items": ("public", "example_items"),
}


@dataclass(frozen=True)
class Held:
    """What the ledger held for a written (created or matched) row when a page was read (`held`):
    a hint that lets `write_once` skip the write attempt of a row it already has."""

    action: str
    version: str | None
    deleted_at_source: datetime | None


@dataclass(frozen=True)
class Written:
    """What a writer made: the local record's type and id; `matched` when it linked an existing one."""

    record_type: str
    record_id: int | None
    matched: bool = False


def overwrite_matched(run: Run) -> bool:
    """The run option `overwrite_matched` (default false): whether a changed source row overwrites
    the product's own row it was matched to. Accepts booleans, 0/1 and "true"/"false"."""
    value = run.options.get("overwrite_matched", False)
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


# --- the write path --------------------------------------------------------------------------


def write_once(
    tx: Conn, run: Run, kind: str, source_id: object, write: Callable[[], Written],
    *, dangling: Sequence[Mapping[str, Any]] | None = None, reason: str | None = None,
    version: str | None = None, update: Update | None = None, on_event: Event | None = None,
    held: Held | None = None,
) -> str:
    """Write a source row and claim it; returns imported, matched, updated or already_here.

    `dangling`: the row's references to parents that do not exist at the source,
    kept on the claim as a jsonb list; `reason` says so in words for `migrate explain`.
    `version`: the source version of the row (kept on the claim; see the module docstring);
    `update`: how to write this version over the row's product record in place (`Update`), used
    when the ledger holds an older version; without it a written row is already here whatever
    its version. `on_event` hears `restored` and `matched_kept` (task stats).
    `held`: the entry as the page read it (`held()`), when written: a row held at this version or a
    newer one and not deleted is already here without a statement (a concurrent writer can only
    have moved it further), any other goes straight to the version comparison under the lock.
    """
    sid = str(source_id)
    key = {"tenant_id": run.tenant_id, "source": run.source, "kind": kind, "source_id": sid}
    if held is not None and held.action in WRITTEN_ACTIONS:
        if held.deleted_at_source is None and not (update is not None and newer(version, held.version)):
            return ALREADY_HERE
        entry = tx.fetch_one("ledger_entry_for_update", key)
        if entry is not None and entry["action"] in WRITTEN_ACTIONS:
            return _sighting(tx, run, entry, version, update, dangling=dangling, reason=reason, on_event=on_event)
    # The first write of a row costs what it always did (write, claim); only a row the ledger holds
    # already pays for the version comparison, after its claim lost.
    with tx.savepoint() as sp:
        written = write()
        claimed = _claim_one(
            tx,
            {
                **key,
                "run_id": run.id,
                "record_type": written.record_type,
                "record_id": written.record_id,
                "action": "matched" if written.matched else "created",
                "reason": reason[:500] if reason else None,
                "dangling": Jsonb(list(dangling)) if dangling else None,
                "source_version": version,
            },
        )
        if claimed is None:
            # the row is written already (by another list, run or worker): undo our write, then
            # compare what the ledger holds with this sighting
            sp.rollback()
        return MATCHED if written.matched else IMPORTED
    entry = tx.fetch_one("ledger_entry_for_update", key)
    if entry is None or entry["action"] not in WRITTEN_ACTIONS:
        return ALREADY_HERE  # not reachable through the claim's fence; nothing was written
    return _sighting(tx, run, entry, version, update, dangling=dangling, reason=reason, on_event=on_event)


@dataclass(frozen=True)
class Claim:
    """One row's claim in a window's set-based claim (`claim_window`): what `write_once` would
    pass `claim_record` for it. A `written.record_id` of None is the id of the row's new product
    row, inserted by the claim itself (`NewRows`)."""

    source_id: str
    written: Written
    version: str | None = None
    reason: str | None = None
    dangling: Sequence[Mapping[str, Any]] | None = None

    def __init__(self, source_id: str, written: Written, version: str | None = None, reason: str | None = None,
                 dangling: Sequence[Mapping[str, Any]] | None = None) -> None:
        # one a row of every window: not the frozen dataclass's __init__ (object.__setattr__ a field)
        self.__dict__.update(source_id=source_id, written=written, version=version, reason=reason, dangling=dangling)


@dataclass(frozen=True)
class NewRows:
    """Product rows a window's claim inserts, each only when its row's claim wins (`claim_window`).

    `table`: (schema, name), a table whose `id` draws from its sequence; `names`: the columns
    written, `source_id` among them; `rows`: each row's values over `names`, as JSON values (a
    jsonb column's value as it is, anything JSON has no type for - times, decimals - written with
    `str`), one row per source id. Postgres reads them through the table's own row type
    (`jsonb_populate_recordset`), so each value is checked as an insert of it would be: the text
    parsed once, a jsonb column's value taken from it as parsed (the json variant parsed each
    one's text again: 35 us a row of contacts, twice jsonb's), a text column's string as it is."""

    table: tuple[str, str]
    names: tuple[str, ...]
    rows: Sequence[Mapping[str, Any]]


# JSON types orjson writes itself: a subclass of one it does not (a float subclass, a named
# tuple) goes to the standard library, which writes it as its base type
_JSON_NATIVE = (str, int, float, bool, list, tuple, dict)
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


_TIMES = (datetime, date, time)  # what a row's values are written with `str` for, asked first


def _orjson_default(value: Any) -> str:
    if type(value) is datetime:  # its str() by definition, in half the time (str() looks it up by name)
        return value.isoformat(" ")
    if type(value) in _TIMES:
        return value.isoformat()  # a date's or time's str()
    if isinstance(value, _JSON_NATIVE):
        raise TypeError("the standard library's to write")
    return str(value)  # times, dates, decimals, dataclasses: `str`, as json.dumps(default=str)


def rows_json(rows: Sequence[Mapping[str, Any]]) -> str:
    """A window's new rows as the JSON text `claim_window` sends (`NewRows`'s rules: anything JSON
    has no type for written with `str`).

    orjson writes it (`json.dumps` of these rows was ~14% of the engine's GIL time on the
    entity path; orjson writes a window in a quarter of its time, times and dates through `str` as
    before); the standard library writes it, as before, whenever orjson refuses a value or would
    write it otherwise: an integer beyond 64 bits, a key that is not a string, a lone surrogate, a
    float subclass (a NaN or an infinity the Pipedrive client read is one, `NonFinite`: written
    `NaN` as before, which Postgres refuses, the window then per row; orjson writes a plain NaN as
    null, and no provider's mapping makes one), nesting deeper than 254. Postgres reads the two the
    same: non-ASCII as raw UTF-8 here, as \\u escapes there; NUL as \\u0000 in both; floats in their
    shortest round-trip form in both (`1e-7` here, `1e-07` there). An Enum member orjson writes
    as its value (json: `str`): no mapper makes one."""
    try:
        return orjson.dumps(rows, default=_orjson_default, option=_ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(rows, ensure_ascii=True, default=str)


def array(values: Sequence[str | int | None]) -> str | list[Any]:
    """`values` as a query parameter for an array (`%(x)s::text[]`, `::bigint[]`): the array's text
    (`{"a","b",NULL}`) when orjson's JSON of them is that text with its brackets changed - no
    escape in it but \\" and \\\\, which mean the same in both - else the list itself, as before.
    Why: psycopg dumps a list value by value in Python; a page's reference and id arrays were
    ~5% of the engine's GIL time on the entity path, orjson writes them in one call."""
    try:
        text = orjson.dumps(values).decode()
    except (orjson.JSONEncodeError, TypeError):
        return list(values)
    if "\\" in text and text.replace('\\\\', "").replace('\\"', "").count("\\"):
        return list(values)  # a control character, written \\n or \\u0001: an array reads it otherwise
    return "{" + text[1:-1] + "}"


def _claim_statement(name: str, returning: str) -> str:
    # one conflict clause for every claim (claim_takes_over): the ledger's contract in one place
    return f"{query(name)}\n{query('claim_takes_over')}\nRETURNING {returning}"


_CLAIM_ONE = _claim_statement("claim_record", "id")
_NO_NEW_ROWS = "new AS (SELECT NULL::bigint AS new_id, NULL::text AS source_id WHERE false)"
_WINDOW: dict[tuple[tuple[str, str], tuple[str, ...]] | None, str] = {}


def _claim_one(tx: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    rows = tx.sql(_CLAIM_ONE, params, prepare=True)
    return rows[0] if rows else None


def _claim_json(c: Claim) -> dict[str, Any]:
    """One claim as `claim_records` reads it from its JSON: a key left out is NULL."""
    out: dict[str, Any] = {"source_id": c.source_id, "record_type": c.written.record_type,
                           "action": "matched" if c.written.matched else "created"}
    if c.written.record_id is not None:
        out["record_id"] = c.written.record_id
    if c.reason:
        out["reason"] = c.reason[:500]
    if c.dangling:
        out["dangling"] = list(c.dangling)
    if c.version is not None:
        out["source_version"] = c.version
    return out


def _window_statement(tx: Conn, new_rows: NewRows | None) -> str:
    """The window's claim, with its new product rows inserted for the claims that win: the rows'
    ids drawn in one materialized CTE (the claim and the insert read the same ids), the claim
    (`claim_records` + `claim_takes_over`), then the insert joined to what the claim returned."""
    key = None if new_rows is None else (new_rows.table, new_rows.names)
    text = _WINDOW.get(key)
    if text is not None:
        return text
    claim = _claim_statement("claim_records", "source_id")
    if new_rows is None:
        text = f"WITH {_NO_NEW_ROWS}, claimed AS (\n{claim}\n) SELECT source_id FROM claimed"
    else:
        table = sql.Identifier(*new_rows.table)
        new = sql.SQL(
            "new AS MATERIALIZED (SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id')::regclass)) AS new_id, r.*"
            " FROM jsonb_populate_recordset(NULL::{t}, %(rows)s::jsonb) AS r)").format(t=table)
        insert = sql.SQL("inserted AS (INSERT INTO {t} (id, {cols}) SELECT n.new_id, {vals} FROM new n"
                         " JOIN claimed c ON c.source_id = n.source_id)").format(
            t=table, cols=sql.SQL(", ").join(sql.Identifier(c) for c in new_rows.names),
            vals=sql.SQL(", ").join(sql.Identifier("n", c) for c in new_rows.names))
        text = (f"WITH {tx.compose(new)}, claimed AS (\n{claim}\n), {tx.compose(insert)}"
                " SELECT source_id FROM claimed")
    _WINDOW[key] = text
    return text


def claim_window(tx: Conn, run: Run, kind: str, claims: Sequence[Claim], new_rows: NewRows | None = None) -> set[str]:
    """Claim a window's rows in one statement (`claim_records`: `claim_record`'s contract for
    each) and insert `new_rows` (`NewRows`) for the claims that win, in the same statement: a
    claim that loses leaves no product row behind. Returns the source ids claimed; one left out
    is written already (by another list, run or worker): the caller takes that row through
    `write_once`'s sighting. Raises ValueError for a source id given twice (one statement cannot
    claim a row twice), or new rows that are not exactly the claims without a record id; the
    database's errors (a value a column refuses) as they come: nothing of the statement is written."""
    if not claims:
        return set()
    ordered = sorted(claims, key=lambda c: c.source_id)
    sids = [c.source_id for c in ordered]
    if len(set(sids)) != len(sids):
        raise ValueError(f"a window's claim holds a {kind} source id twice")
    params: dict[str, Any] = {
        "run_id": run.id, "tenant_id": run.tenant_id, "source": run.source, "kind": kind,
        "claims": rows_json([_claim_json(c) for c in ordered]),
    }
    if new_rows is not None:
        new_ids = [str(r["source_id"]) for r in new_rows.rows]
        if len(set(new_ids)) != len(new_ids) or set(new_ids) != {c.source_id for c in ordered if c.written.record_id is None}:
            raise ValueError(f"a window's new {kind} rows must each have one claim of their own")
        params["table"] = ".".join(new_rows.table)
        names = new_rows.names
        rows = new_rows.rows  # (`crm.new_rows` makes them over `names`, in its order: sent as they are)
        if not all(tuple(r) == names for r in rows):
            rows = [{n: r[n] for n in names} for r in rows]
        params["rows"] = rows_json(rows)
    rows = tx.sql(_window_statement(tx, new_rows), params, prepare=True)
    return {r["source_id"] for r in rows}


def _sighting(
    tx: Conn, run: Run, entry: Mapping[str, Any], version: str | None, update: Update | None,
    *, dangling: Sequence[Mapping[str, Any]] | None, reason: str | None, on_event: Event | None,
) -> str:
    """A written row seen again, its entry locked: update in place, restore, or already here.

    One history row per sighting that changed something: `restored` when the row was marked
    deleted at the source (with the update's versions and previous values when it also changed),
    else `updated`; so a run's `updated` outcomes = its `updated` + `restored` history rows."""
    mine = entry["action"] == "created" or overwrite_matched(run)
    restored = entry["deleted_at_source"] is not None
    changed = newer(version, entry["source_version"]) and update is not None and entry["record_id"] is not None
    if changed and not mine:
        if on_event:
            on_event("matched_kept")  # the product's own row: not overwritten without overwrite_matched
        changed = False
    before: Mapping[str, Any] | None = None
    if changed:
        before = update(entry["record_id"])  # type: ignore[misc]
        changed = before is not None  # None: the product row is gone (the product deleted it)
    if restored:
        if mine and entry["record_id"] is not None:
            _set_deleted(tx, entry["record_type"], [entry["record_id"]], None)
        if on_event:
            on_event("restored")
    if not changed and not restored:
        return ALREADY_HERE
    after = version if changed else entry["source_version"]
    _history(tx, run, entry["id"], "restored" if restored else "updated", entry["source_version"], after,
             dict(before) if changed and before is not None else None)
    tx.execute(
        "ledger_entry_written",
        {
            "id": entry["id"],
            "source_version": after,
            "dangling": Jsonb(list(dangling)) if changed and dangling else (None if changed else _keep(entry)),
            "reason": (reason[:500] if reason else None) if changed else _keep(entry, "reason"),
        },
    )
    return UPDATED


def _keep(entry: Mapping[str, Any], column: str = "dangling") -> Any:
    value = entry.get(column)
    return Jsonb(value) if column == "dangling" and value is not None else value


def _history(tx: Conn, run: Run, record_id: int, action: str, before_version: str | None,
             after_version: str | None, before: Mapping[str, Any] | None) -> None:
    tx.execute("ledger_history", {"record_id": record_id, "run_id": run.id, "action": action,
                                  "version_before": before_version, "version_after": after_version,
                                  "before": Jsonb(_jsonable(before)) if before is not None else None})


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _set_deleted(tx: Conn, record_type: str | None, record_ids: Sequence[int], at: datetime | None) -> int:
    """Mark (or with `at` None, clear) deleted_at_source on product rows of one record type."""
    table = PRODUCT_TABLES.get(record_type or "")
    if table is None or not record_ids:
        return 0
    statement = sql.SQL("UPDATE {} SET deleted_at_source = %(at)s WHERE id = ANY(%(ids)s::bigint[])").format(
        sql.Identifier(*table))
    statement = tx.compose(statement)
    return len(tx.sql(statement + " RETURNING id", {"at": at, "ids": list(record_ids)}))


def mark_deleted(tx: Conn, run: Run, kind: str, source_ids: Iterable[object], at: datetime | None = None) -> int:
    """Soft-delete these source rows of a ledger kind: `deleted_at_source` (= `at`, default the
    transaction's now()) on their ledger entries and on the product rows created from them (a
    matched row - the product's own - only with the run option `overwrite_matched`), one `deleted`
    history row each for `run`. Never a hard delete. Entries already marked, and ids the ledger
    does not know, are left alone; returns how many entries were marked now. A dry run writes
    nothing and returns how many it would mark. Runs in the caller's transaction `tx`."""
    ids = sorted({str(s) for s in source_ids if s is not None and str(s) != ""})
    if not ids:
        return 0
    params = {"tenant_id": run.tenant_id, "source": run.source, "kind": kind, "source_ids": ids}
    if run.dry_run:
        row = tx.fetch_one("ledger_would_delete", params)
        return int(row["n"]) if row else 0
    marked = tx.fetch_all("ledger_mark_deleted", {**params, "run_id": run.id, "at": at, "waiting": WAITS_FOR_WALK,
                                                  "gone": GONE_BEFORE_WALK})
    overwrite = overwrite_matched(run)
    by_type: dict[tuple[str, datetime], list[int]] = {}
    for m in marked:
        if m["record_id"] is not None and (m["action"] == "created" or (m["action"] == "matched" and overwrite)):
            by_type.setdefault((m["record_type"], m["deleted_at_source"]), []).append(int(m["record_id"]))
    for (record_type, moment), record_ids in sorted(by_type.items(), key=lambda kv: kv[0][0] or ""):
        _set_deleted(tx, record_type, record_ids, moment)
    return len(marked)


def versions(conn: Conn | Database, run: Run, kind: str, source_ids: Iterable[object]) -> dict[str, str | None]:
    """The source version the ledger holds for each of these source ids of a ledger kind (None for
    a placeholder or an entry from before versions); ids without an entry are absent."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return {}
    rows = conn.fetch_all("ledger_versions", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                              "source_ids": ids})
    return {r["source_id"]: r["source_version"] for r in rows}


def held(conn: Conn | Database, run: Run, kind: str, source_ids: Iterable[object]) -> dict[str, Held]:
    """The written (created or matched) entries among these source ids of a ledger kind, as the
    ledger holds them now (one query per page): hints for `write_once(held=...)`."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return {}
    rows = conn.fetch_all("ledger_versions", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                              "source_ids": array(ids)})
    return {r["source_id"]: Held(r["action"], r["source_version"], r["deleted_at_source"])
            for r in rows if r["action"] in WRITTEN_ACTIONS}


def entries(conn: Conn | Database, run: Run, kind: str, source_ids: Iterable[object]) -> dict[str, dict[str, Any]]:
    """Where each of these source ids of a ledger kind stands, whatever its action (one query):
    source id -> `migration_id` (the run that recorded it), `action`, `source_version`,
    `deleted_at_source`; ids without an entry are absent."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return {}
    rows = conn.fetch_all("ledger_versions", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                              "source_ids": ids})
    return {r["source_id"]: r for r in rows}


def updated_by_run(conn: Conn | Database, run: Run, kind: str, source_ids: Iterable[object]) -> set[str]:
    """Which of these source ids of a ledger kind this run updated in place or restored (history
    rows of the run), for a task run again by a retry: they count as updated, not already here."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return set()
    rows = conn.fetch_all("updated_by_run", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                             "run_id": run.id, "source_ids": ids})
    return {r["source_id"] for r in rows}


def note_dry(tx: Conn, run: Run, kind: str, source_id: str, outcome: str) -> None:
    """Remember a dry run's would-be write (`outcome` imported or matched) of one row, so that
    this run's later phases count a reference to it as linked (`dry_written`)."""
    tx.execute("dry_record", {"run_id": run.id, "kind": kind, "source_id": source_id, "outcome": outcome})


def note_placeholder(tx: Conn, run: Run, kind: str, source_id: object, reason: str, action: str = "skipped",
                     version: str | None = None, parents: str | None = None) -> str:
    """Record a skipped (or failed) row without claiming it, with the row's `version` as listed
    (None: unknown) and `parents` (JSON text, migration 0019; None: none kept); a created row keeps its claim."""
    row = tx.fetch_one(
        "note_placeholder",
        {
            "run_id": run.id,
            "tenant_id": run.tenant_id,
            "source": run.source,
            "kind": kind,
            "source_id": str(source_id),
            "action": action,
            "reason": reason[:500],
            "version": version,
            "parents": parents,
        },
    )
    if row is None:
        return ALREADY_HERE
    return SKIPPED if action == "skipped" else FAILED


def note_unreadable(tx: Conn, run: Run, kind: str, raw_key: str, reason: str, excerpt: str | None = None) -> None:
    """Record a failed row without a readable id (migration 0013, `migration_unreadable`): the
    ledger cannot key it, so it is kept once per tenant, source, kind and `raw_key`
    (`rows.unreadable_key`); a later run or a retry that meets it again takes the record over
    (its run, reason and excerpt). `reason` is cut at 500 characters, as the ledger's."""
    tx.execute("note_unreadable", {
        "run_id": run.id, "tenant_id": run.tenant_id, "source": run.source, "kind": kind,
        "raw_key": raw_key, "reason": reason[:500], "excerpt": excerpt,
    })


def skip(tx: Conn, run: Run, kind: str, source_id: object, reason: str, version: str | None = None,
         parents: str | None = None) -> str:
    """Record a row skipped with `reason` at its listed `version` with its `parents` (JSON text,
    `write.parents_json`) - a placeholder a later write takes over; SKIPPED, or ALREADY_HERE when
    a written entry holds the row already."""
    return note_placeholder(tx, run, kind, source_id, reason, action="skipped", version=version, parents=parents)


def skip_window(tx: Conn, run: Run, kind: str, reasons: Mapping[str, str],
                versions: Mapping[str, str | None] | None = None, parents: Mapping[str, str] | None = None) -> dict[str, str]:
    """`skip` for many rows in one statement (`note_placeholders`): source id -> reason (and
    `versions`: source id -> version listed; `parents`: -> JSON text) in, source id -> SKIPPED (the placeholder is noted) or
    ALREADY_HERE (a written entry holds the row) out, as `skip` answers row by row. The database's
    errors propagate: nothing is written."""
    if not reasons:
        return {}
    sids = sorted(reasons)
    versions, parents = versions or {}, parents or {}
    rows = tx.fetch_all("note_placeholders", {
        "run_id": run.id, "tenant_id": run.tenant_id, "source": run.source, "kind": kind, "action": "skipped",
        "source_ids": array(sids), "reasons": array([reasons[sid][:500] for sid in sids]),
        "versions": array([versions.get(sid) for sid in sids]), "parents": array([parents.get(sid) for sid in sids]),
    })
    noted = {r["source_id"] for r in rows}
    return {sid: SKIPPED if sid in noted else ALREADY_HERE for sid in sids}


def resolve(conn: Conn, run: Run, refs: Iterable[tuple[str, object]]) -> dict[tuple[str, str], int]:
    """Source (kind, id) pairs -> local record ids, in one query for a whole page."""
    pairs = {(k, str(s)) for k, s in refs if s is not None and s != ""}
    if not pairs:
        return {}
    kinds, ids = zip(*sorted(pairs))
    rows = conn.fetch_all(
        "resolve_references",
        {"tenant_id": run.tenant_id, "source": run.source, "kinds": array(kinds), "source_ids": array(ids)},
    )
    return {(r["kind"], r["source_id"]): r["record_id"] for r in rows}


def references(conn: Conn, run: Run, refs: Iterable[tuple[str, object]]) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], str]]:
    """Source (kind, id) pairs in one query: (pairs -> the local record ids of the written ones, as
    `resolve`; pairs -> the action of every entry, WAITING for a placeholder left to the catch-up's
    walk: a pair absent from it is one the ledger knows nothing about)."""
    pairs = {(k, str(s)) for k, s in refs if s is not None and s != ""}
    if not pairs:
        return {}, {}
    kinds, ids = zip(*sorted(pairs))
    rows = conn.fetch_all(
        "reference_entries",
        {"tenant_id": run.tenant_id, "source": run.source, "kinds": array(kinds), "source_ids": array(ids),
         "waiting": WAITS_FOR_WALK},
    )
    known = {(r["kind"], r["source_id"]): WAITING if r["waits"] else r["action"] for r in rows}
    found = {(r["kind"], r["source_id"]): r["record_id"] for r in rows if r["action"] in WRITTEN_ACTIONS}
    return found, known


def claimed_by(conn: Conn, run: Run, kind: str, source_ids: Iterable[object]) -> dict[str, int]:
    """Which of these source ids are written, and by which run (this run's or an earlier one)."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return {}
    rows = conn.fetch_all(
        "claimed_by_run", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind, "source_ids": ids}
    )
    return {r["source_id"]: r["migration_id"] for r in rows}


def dry_written(conn: Conn, run: Run, refs: Iterable[tuple[str, object]]) -> set[tuple[str, str]]:
    """In a dry run: which of these (kind, source id) pairs this run would have written already."""
    pairs = {(k, str(s)) for k, s in refs if s is not None and s != ""}
    if not pairs or not run.dry_run:
        return set()
    kinds, ids = zip(*sorted(pairs))
    rows = conn.fetch_all("dry_written", {"run_id": run.id, "kinds": list(kinds), "source_ids": list(ids)})
    return {(r["kind"], r["source_id"]) for r in rows}


def written_by_run(conn: Conn, run: Run, kind: str, source_ids: Iterable[object]) -> dict[str, str]:
    """Which of these source ids this very run has written already, and how (created or matched)."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return {}
    rows = conn.fetch_all("written_by_run", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                             "run_id": run.id, "source_ids": ids})
    return {r["source_id"]: r["action"] for r in rows}


def record_of(tx: Conn, run: Run, kind: str, source_id: object) -> int | None:
    """The local record a written (created or matched) source row points at, else None."""
    row = tx.fetch_one("written_record", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                          "source_id": str(source_id)})
    return None if row is None else row["record_id"]
