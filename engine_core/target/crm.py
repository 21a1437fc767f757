"""Writers for the product's CRM tables (schema `crm`, migrations 0003 and 0005).

Source-neutral: a provider maps its rows to column values and calls these inside a ledger claim
(`ledger.write_once(tx, run, kind, source_id, lambda: crm.write_contact(tx, ...))`), so a target
row exists only together with its claim. Column names are checked against each table's list, so a
provider can never smuggle SQL through a key; values always travel as parameters.

"Already here": a contact or a user (an owner: the tenant's own team is often in the product
already) whose email, or a company whose name or domain, is already in the tenant's CRM is linked
rather than duplicated (`Written(..., matched=True)`). Only rows the product
had before - rows no migration from this source created - are candidates: rows the same source
created are the ledger's business (already claimed, or a different source row that happens to
share a name, which is imported as its own record).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from engine_core.db import Conn, Database
from engine_core.ledger import NewRows, Written, array
from engine_core.rows import (  # noqa: F401 - the product's value rules, kept in the pure row module
    EMAIL_BODY_MAX,
    NOTE_CONTENT_MAX,
    FittedBody,
    fit_email_body,
    fit_text,
    normal_domain,
    normal_email,
)
from engine_core.target.tables import TABLES, Table as Table


def insert(tx: Conn, table: str, values: Mapping[str, Any]) -> int:
    """Insert one row into crm.<table>; returns its id."""
    spec = TABLES[table]
    unknown = sorted(set(values) - spec.columns)
    if unknown:
        raise KeyError(f"crm.{table} has no column {', '.join(unknown)}")
    if "tenant_id" not in values:
        raise KeyError(f"a crm.{table} row needs its tenant_id")
    statement = _insert_statement(tx, table, tuple(values))
    params = {n: (Jsonb(v) if n in spec.jsonb and v is not None else v) for n, v in values.items()}
    return int(tx.sql(statement, params, prepare=True)[0]["id"])


_STATEMENTS: dict[tuple[str, tuple[str, ...]], str] = {}


def _insert_statement(tx: Conn, table: str, names: tuple[str, ...]) -> str:
    key = (table, names)
    text = _STATEMENTS.get(key)
    if text is None:
        text = _STATEMENTS[key] = tx.compose(sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
            TABLES[table].identifier,
            sql.SQL(", ").join(sql.Identifier(n) for n in names),
            sql.SQL(", ").join(sql.Placeholder(n) for n in names),
        ))
    return text


def write(tx: Conn, table: str, values: Mapping[str, Any]) -> Written:
    """A plain insert, as a ledger write."""
    return Written(TABLES[table].record_type, insert(tx, table, values))


# --- updates in place ------------------------------------------------------------------------

# A row's identity and owner never change in place: an update writes what the source says about
# the record, not where it came from (a matched row - the product's own - keeps having no source).
IDENTITY_COLUMNS = frozenset({"tenant_id", "source", "source_id"})


def owned_columns(table: str) -> tuple[str, ...]:
    """The columns of crm.<table> a source row's mapping owns: every column a mapped row may fill
    but its identity (`IDENTITY_COLUMNS`), in a stable order."""
    return tuple(sorted(TABLES[table].columns - IDENTITY_COLUMNS))


def update(tx: Conn, table: str, record_id: int, values: Mapping[str, Any]) -> dict[str, Any] | None:
    """Write a newer source version over crm.<table> row `record_id`, in place (one row, same id).

    `values` are the mapped column values (as for `insert`). Every column the mapping owns
    (`owned_columns`) is set: one absent from `values` returns to its default - NULL for a
    reference - because a mapper leaves out what the source no longer says (an activity moved
    off its lead, a deal whose person was removed, a note moved to another parent: the cleared
    reference must not keep pointing at the old record). The identity columns (`tenant_id`,
    `source`, `source_id`) are left as they are. Returns the row's previous values of the columns
    that changed, as JSON values ({} when nothing changed) - what the ledger's history keeps - or
    None when there is no such row (the product deleted it). Raises KeyError for a column the
    table does not have."""
    spec = TABLES[table]
    unknown = sorted(set(values) - spec.columns)
    if unknown:
        raise KeyError(f"crm.{table} has no column {', '.join(unknown)}")
    names = tuple(n for n in values if n not in IDENTITY_COLUMNS)
    cleared = tuple(n for n in owned_columns(table) if n not in values)
    if not names and not cleared:
        return {}
    statement = _update_statement(tx, table, names, cleared)
    params: dict[str, Any] = {n: (Jsonb(values[n]) if n in spec.jsonb and values[n] is not None else values[n]) for n in names}
    params["__id"] = record_id
    rows = tx.sql(statement, params, prepare=True)
    if not rows:
        return None
    old, new = rows[0]["old"], rows[0]["new"]
    return {n: old.get(n) for n in names + cleared if old.get(n) != new.get(n)}


_UPDATES: dict[tuple[str, tuple[str, ...], tuple[str, ...]], str] = {}


def _update_statement(tx: Conn, table: str, names: tuple[str, ...], cleared: tuple[str, ...] = ()) -> str:
    # The self-join reads the row as it was before this statement: RETURNING gives old and new.
    key = (table, names, cleared)
    text = _UPDATES.get(key)
    if text is None:
        sets = [sql.SQL("{} = {}").format(sql.Identifier(n), sql.Placeholder(n)) for n in names]
        sets += [sql.SQL("{} = DEFAULT").format(sql.Identifier(n)) for n in cleared]
        text = _UPDATES[key] = tx.compose(sql.SQL(
            "UPDATE {t} AS n SET {sets} FROM {t} AS o WHERE n.id = %(__id)s AND o.id = n.id"
            " RETURNING to_jsonb(o) AS old, to_jsonb(n) AS new"
        ).format(t=TABLES[table].identifier, sets=sql.SQL(", ").join(sets)))
    return text


# --- one row per source record, whichever list served it ------------------------------------

# The tables whose rows carry an archived flag that moves at the source (a deal or lead archived
# or restored), and the columns that move with it: what a later sighting of an already written
# row may change on it, and nothing else.
ARCHIVE_COLUMNS: dict[str, tuple[str, ...]] = {
    "deals": ("archived", "archived_at", "source_updated_at"),
    "leads": ("archived", "source_updated_at"),
}


def archived(conn: Conn | Database, record_type: str | None, record_id: int | None) -> bool | None:
    """Whether a product row (a ledger entry's `record_type`, "crm.deals", and `record_id`) is
    archived; None for a table without an archived flag (`ARCHIVE_COLUMNS`) or a row gone."""
    table = (record_type or "").removeprefix("crm.")
    if table not in ARCHIVE_COLUMNS or record_id is None:
        return None
    rows = conn.sql(sql.SQL("SELECT archived FROM crm.{} WHERE id = %(id)s").format(sql.Identifier(table)),
                    {"id": record_id})
    return bool(rows[0]["archived"]) if rows else None


def refresh_archived(tx: Conn, table: str, record_id: int, values: Mapping[str, Any]) -> bool:
    """Bring an existing row's archived flag up to a later sighting of its source record.

    `values` are the sighting's mapped column values (`archived`, `source_updated_at`, and for deals
    `archived_at`). The sighting wins when it is the newer version at the source (a later
    `source_updated_at`: archiving moves a record's update time), or when the versions cannot be
    ordered (equal or missing times) and it says archived: records move into the archived list
    while a run walks both lists, and a restore out of it moves the update time, so it is ordered. Only the columns of
    `ARCHIVE_COLUMNS[table]` change. Returns True when the row changed. Raises KeyError for a table
    without an archived flag.
    """
    columns = ARCHIVE_COLUMNS[table]
    params = {c: values.get(c) for c in columns}
    params["id"] = record_id
    statement = sql.SQL(
        "UPDATE crm.{table} SET {sets} WHERE id = %(id)s AND archived IS DISTINCT FROM %(archived)s::boolean"
        " AND (%(source_updated_at)s::timestamptz > source_updated_at"
        "      OR ((%(source_updated_at)s::timestamptz IS NULL OR source_updated_at IS NULL"
        "           OR %(source_updated_at)s::timestamptz = source_updated_at) AND %(archived)s::boolean))"
        " RETURNING id"
    ).format(
        table=sql.Identifier(table),
        sets=sql.SQL(", ").join(
            sql.SQL("{} = COALESCE({}, {})").format(sql.Identifier(c), sql.Placeholder(c), sql.Identifier(c))
            if c == "source_updated_at" else sql.SQL("{} = {}").format(sql.Identifier(c), sql.Placeholder(c))
            for c in columns
        ),
    )
    return bool(tx.sql(statement, params))


def match_contact(tx: Conn, tenant_id: str, source: str, emails: Iterable[str]) -> int | None:
    """A contact the product already has with one of these addresses (oldest first)."""
    wanted = sorted({e for e in (normal_email(x) for x in emails) if e})
    if not wanted:
        return None
    rows = tx.sql(
        "SELECT id FROM crm.contacts"
        " WHERE tenant_id = %(t)s AND lower(email) = ANY(%(emails)s::text[])"
        "   AND source IS DISTINCT FROM %(source)s"
        " ORDER BY id LIMIT 1",
        {"t": tenant_id, "emails": wanted, "source": source},
    )
    return int(rows[0]["id"]) if rows else None


def match_company(tx: Conn, tenant_id: str, source: str, name: str | None, domain: str | None) -> int | None:
    """A company the product already has with this name (case and spacing aside) or domain."""
    if not name and not domain:
        return None
    rows = tx.sql(
        "SELECT id FROM crm.companies"
        " WHERE tenant_id = %(t)s AND source IS DISTINCT FROM %(source)s"
        "   AND (name_key = lower(regexp_replace(btrim(%(name)s::text), '\\s+', ' ', 'g'))"
        "        OR (%(domain)s::text IS NOT NULL AND domain = %(domain)s::text))"
        " ORDER BY (domain IS NOT DISTINCT FROM %(domain)s::text) DESC, id LIMIT 1",
        {"t": tenant_id, "name": name or "", "domain": domain, "source": source},
    )
    return int(rows[0]["id"]) if rows else None


def match_user(tx: Conn, tenant_id: str, source: str, email: str | None) -> int | None:
    """A user the product already has with this address (oldest first)."""
    wanted = normal_email(email)
    if wanted is None:
        return None
    rows = tx.sql(
        "SELECT id FROM crm.users"
        " WHERE tenant_id = %(t)s AND lower(email) = %(e)s AND source IS DISTINCT FROM %(source)s"
        " ORDER BY id LIMIT 1",
        {"t": tenant_id, "e": wanted, "source": source},
    )
    return int(rows[0]["id"]) if rows else None


def write_user(tx: Conn, values: Mapping[str, Any]) -> Written:
    """Link to the tenant's existing user with this email, or insert a new one."""
    existing = match_user(tx, values["tenant_id"], values.get("source") or "", values.get("email"))
    if existing is not None:
        return Written(TABLES["users"].record_type, existing, matched=True)
    return write(tx, "users", values)


def write_contact(tx: Conn, values: Mapping[str, Any], emails: Iterable[str]) -> Written:
    """Link to the tenant's existing contact with one of `emails`, or insert a new one."""
    existing = match_contact(tx, values["tenant_id"], values.get("source") or "", emails)
    if existing is not None:
        return Written(TABLES["contacts"].record_type, existing, matched=True)
    return write(tx, "contacts", values)


def write_company(tx: Conn, values: Mapping[str, Any]) -> Written:
    """Link to the tenant's existing company with this name or domain, or insert a new one."""
    existing = match_company(tx, values["tenant_id"], values.get("source") or "", values.get("name"), values.get("domain"))
    if existing is not None:
        return Written(TABLES["companies"].record_type, existing, matched=True)
    return write(tx, "companies", values)


# --- a window at once (optimistic windows) ------------------------------------------
#
# The set-based forms of the writers above, for a window's plain rows: the same matches (the
# same predicates and order, one statement per table and window), one multi-row INSERT per table
# and column set, and the removal of rows whose ledger claim lost.

# The tables whose rows may already be in the product (`write_contact`/`_company`/`_user`).
MATCHED_TABLES = ("contacts", "companies", "users")


def match_rows(tx: Conn, table: str, rows: Sequence[tuple[int, Mapping[str, Any], Iterable[str]]]) -> dict[int, int]:
    """`match_contact` / `match_company` / `match_user` for many rows in one statement.

    `rows`: (key, the row's column values, the contact's match emails - ignored for companies and
    users, which match on their `name`/`domain` and `email` values). Returns key -> the existing
    record's id for the rows that match, by the same rule as the one-row function (oldest first;
    a company by name or domain, its domain's match first). Raises KeyError for a table that
    does not match (`MATCHED_TABLES`)."""
    if table not in MATCHED_TABLES:
        raise KeyError(f"crm.{table} rows are not matched")
    keys: list[int] = []
    tenants: list[str] = []
    sources: list[str] = []
    if table == "companies":
        names: list[str] = []
        domains: list[str | None] = []
        for key, values, _ in rows:
            name, domain = values.get("name"), values.get("domain")
            if not name and not domain:
                continue
            keys.append(key)
            tenants.append(values["tenant_id"])
            sources.append(values.get("source") or "")
            names.append(name or "")
            domains.append(domain)
        if not keys:
            return {}
        found = tx.sql(
            "SELECT w.k, m.id FROM unnest(%(keys)s::int[], %(tenants)s::text[], %(sources)s::text[],"
            "                             %(names)s::text[], %(domains)s::text[]) AS w(k, t, s, name, domain)"
            " CROSS JOIN LATERAL (SELECT c.id FROM crm.companies c"
            "   WHERE c.tenant_id = w.t AND c.source IS DISTINCT FROM w.s"
            "     AND (c.name_key = lower(regexp_replace(btrim(w.name), '\\s+', ' ', 'g'))"
            "          OR (w.domain IS NOT NULL AND c.domain = w.domain))"
            "   ORDER BY (c.domain IS NOT DISTINCT FROM w.domain) DESC, c.id LIMIT 1) m",
            {"keys": array(keys), "tenants": array(tenants), "sources": array(sources), "names": array(names),
             "domains": array(domains)},
        )
        return {int(r["k"]): int(r["id"]) for r in found}
    emails: list[str] = []
    for key, values, match_emails in rows:
        wanted = [values.get("email")] if table == "users" else list(match_emails)
        for e in sorted({e for e in (normal_email(x) for x in wanted) if e}):
            keys.append(key)
            tenants.append(values["tenant_id"])
            sources.append(values.get("source") or "")
            emails.append(e)
    if not keys:
        return {}
    found = tx.sql(
        sql.SQL(
            "SELECT w.k, min(c.id) AS id FROM unnest(%(keys)s::int[], %(tenants)s::text[], %(sources)s::text[],"
            "                                        %(emails)s::text[]) AS w(k, t, s, e)"
            " JOIN {} c ON c.tenant_id = w.t AND lower(c.email) = w.e AND c.source IS DISTINCT FROM w.s"
            " GROUP BY w.k"
        ).format(TABLES[table].identifier),
        {"keys": array(keys), "tenants": array(tenants), "sources": array(sources), "emails": array(emails)},
    )
    return {int(r["k"]): int(r["id"]) for r in found}


def insert_rows(tx: Conn, table: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Insert rows of one column set into crm.<table> (or the example's table) in one statement;
    returns source_id -> the new row's id. Every row carries the same columns, `tenant_id` and a
    `source_id` of its own. Raises KeyError for a column the table does not have, ValueError for
    rows of different columns or a source_id given twice."""
    if not rows:
        return {}
    spec = TABLES[table]
    names = _checked_names(table, rows)
    statement = _insert_many_statement(tx, table, names, len(rows))
    params = [Jsonb(r[n]) if n in spec.jsonb and r[n] is not None else r[n] for r in rows for n in names]
    got = tx.sql(statement, params)
    return {str(r["source_id"]): int(r["id"]) for r in got}


def new_rows(table: str, rows: Sequence[Mapping[str, Any]]) -> NewRows:
    """Rows of one column set for crm.<table> (or the example's table), to be inserted by a window's
    ledger claim for the claims that win (`ledger.claim_window`). Same rules and errors as
    `insert_rows`."""
    spec = TABLES[table]
    return NewRows((spec.schema, spec.name), _checked_names(table, rows), list(rows))


def copy_rows(tx: Conn, table: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """`insert_rows` by COPY: the rows' ids are drawn from the table's sequence first (COPY
    returns nothing), then the rows are streamed in one COPY. Same arguments, answer and errors."""
    if not rows:
        return {}
    spec = TABLES[table]
    names = _checked_names(table, rows)
    ids = _draw_ids(tx, table, len(rows))
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        spec.identifier, sql.SQL(", ").join(sql.Identifier(c) for c in ("id", *names)))
    tx.copy_in(statement, ([rid, *(json.dumps(r[n]) if n in spec.jsonb and r[n] is not None else r[n] for n in names)]
                           for rid, r in zip(ids, rows)))
    return {str(r["source_id"]): rid for rid, r in zip(ids, rows)}


def _draw_ids(tx: Conn, table: str, n: int) -> list[int]:
    spec = TABLES[table]
    statement = sql.SQL("SELECT nextval(pg_get_serial_sequence(%(t)s, 'id')) AS id FROM generate_series(1, %(n)s)")
    got = tx.sql(statement, {"t": f"{spec.schema}.{spec.name}", "n": n})
    return [int(r["id"]) for r in got]


def _checked_names(table: str, rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    spec = TABLES[table]
    names = tuple(rows[0])
    unknown = sorted(set(names) - spec.columns)
    if unknown:
        raise KeyError(f"crm.{table} has no column {', '.join(unknown)}")
    if "tenant_id" not in names or "source_id" not in names:
        raise KeyError(f"crm.{table} rows written at once need their tenant_id and source_id")
    if any(tuple(r) != names for r in rows):
        raise ValueError(f"crm.{table} rows written at once must have the same columns")
    if len({r["source_id"] for r in rows}) != len(rows):
        raise ValueError(f"crm.{table} rows written at once hold a source_id twice")
    return names


_MANY: dict[tuple[str, tuple[str, ...], int], str] = {}


def _insert_many_statement(tx: Conn, table: str, names: tuple[str, ...], n: int) -> str:
    key = (table, names, n)
    text = _MANY.get(key)
    if text is None:
        one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(names)))
        text = _MANY[key] = tx.compose(sql.SQL("INSERT INTO {} ({}) VALUES {} RETURNING id, source_id").format(
            TABLES[table].identifier, sql.SQL(", ").join(sql.Identifier(c) for c in names),
            sql.SQL(", ").join([one] * n),
        ))
    return text


def delete_rows(tx: Conn, table: str, record_ids: Sequence[int]) -> int:
    """Remove rows this transaction inserted whose ledger claim lost (the row is someone else's
    already); returns how many went."""
    if not record_ids:
        return 0
    statement = sql.SQL("DELETE FROM {} WHERE id = ANY(%(ids)s::bigint[])").format(TABLES[table].identifier)
    return tx.sql_rowcount(statement, {"ids": list(record_ids)})


# --- field definitions -----------------------------------------------------------------------


def upsert_field_definition(tx: Conn, values: Mapping[str, Any]) -> int:
    """Insert a field definition or refresh its name, type and option labels (a definition listed
    again is no longer deleted at the source); returns its id."""
    rows = tx.sql(
        "INSERT INTO crm.custom_field_definitions"
        " (tenant_id, source, entity, field_key, name, field_type, options, subfields, is_custom, position)"
        " VALUES (%(tenant_id)s, %(source)s, %(entity)s, %(field_key)s, %(name)s, %(field_type)s, %(options)s,"
        "         %(subfields)s, %(is_custom)s, %(position)s)"
        " ON CONFLICT ON CONSTRAINT custom_field_definitions_once DO UPDATE"
        "   SET name = EXCLUDED.name, field_type = EXCLUDED.field_type, options = EXCLUDED.options,"
        "       subfields = EXCLUDED.subfields, is_custom = EXCLUDED.is_custom, position = EXCLUDED.position,"
        "       deleted_at_source = NULL, updated_at = now()"
        " RETURNING id",
        {
            **values,
            "options": Jsonb(values.get("options")) if values.get("options") is not None else None,
            "subfields": Jsonb(values.get("subfields")) if values.get("subfields") is not None else None,
        },
    )
    return int(rows[0]["id"])


def field_definition(conn: Conn, tenant_id: str, source: str, entity: str, field_key: str) -> dict[str, Any] | None:
    """One stored field definition (its columns as `field_definitions` gives them), or None."""
    rows = conn.sql(
        "SELECT entity, field_key, name, field_type, options, subfields, is_custom, position"
        "  FROM crm.custom_field_definitions"
        " WHERE tenant_id = %(t)s AND source = %(s)s AND entity = %(e)s AND field_key = %(k)s",
        {"t": tenant_id, "s": source, "e": entity, "k": field_key},
    )
    return rows[0] if rows else None


def field_definitions(conn: Conn, tenant_id: str, source: str) -> list[dict[str, Any]]:
    """The tenant's custom field definitions of `source`, ordered by entity and position."""
    return conn.sql(
        "SELECT entity, field_key, name, field_type, options, subfields, is_custom, position"
        "  FROM crm.custom_field_definitions WHERE tenant_id = %(t)s AND source = %(s)s"
        " ORDER BY entity, position, field_key",
        {"t": tenant_id, "s": source},
    )


def mail_on_deal(conn: Conn, tenant_id: str, source: str, deal_source_id: str) -> list[str]:
    """The source ids of the mail messages the product holds on one deal (`crm.emails` whose deal
    is the `crm.deals` row of that source id), any order."""
    rows = conn.sql("SELECT e.source_id FROM crm.emails e JOIN crm.deals d ON d.id = e.deal_id"
                    " WHERE e.tenant_id = %(t)s AND e.source = %(s)s AND d.source_id = %(d)s",
                    {"t": tenant_id, "s": source, "d": deal_source_id})
    return [str(r["source_id"]) for r in rows]
